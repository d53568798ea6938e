"""Write ``tfrecord/<split>/<day>-part-NNNNN.tfrecord[.gz]`` from the examples, inside the Spark
job.

One Spark task per Parquet file of the split (``examples/split=<split>/day=<day>/``) reads it
with pyarrow (the rows go from the file to NumPy with none of Spark's row or Arrow
conversions, which cost several times the encoding: benchmarks/README.md), encodes its rows
with
:mod:`featureline.etl.tfrecord.records` and writes its file straight to the output
filesystem (a local path or any pyarrow filesystem URI) under a commit protocol: tasks
write to ``_temporary/<job>/``; only the attempts whose results Spark returns are moved
into place, then ``_temporary`` goes. A retried or speculative task, or a failed job, leaves
no partial or duplicate file.

Every record holds ``prebatch_size`` rows except each day's very last one: each task writes
whole records and sets its leftover rows aside; the driver carries them into the day's last
files. A day's files depend on that day's examples only, so a run that adds a day leaves the
earlier days' files as they are (docs/ARCHITECTURE.md, "TFRecords").
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark import TaskContext
from pyspark.sql import SparkSession

from featureline.etl.tfrecord.layout import Group
from featureline.etl.tfrecord.records import encode, framed_records, group_arrays

TEMPORARY = "_temporary"
_RESULT_ARROW = pa.schema([("partition", pa.int32()), ("path", pa.string()),
                           ("rows", pa.int64()), ("rest_path", pa.string()),
                           ("rest_rows", pa.int64())])


def _filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    if "://" not in uri:
        return pafs.LocalFileSystem(), uri
    return pafs.FileSystem.from_uri(uri)


def file_suffix(compression: str) -> str:
    return ".tfrecord.gz" if compression == "GZIP" else ".tfrecord"


@dataclass(frozen=True)
class Source:
    """A Parquet file of examples and what its records are named: ``<day>-part-<number>``."""

    path: str
    day: str  # YYYY-MM-DD
    # The file's number within its day: the Spark task that wrote it (the rows' keys hashed),
    # so the same day's rows give the same numbers whatever other days a run writes.
    number: int

    @property
    def seed(self) -> list[int]:
        return [date.fromisoformat(self.day).toordinal(), self.number]


def split_sources(folder: Path) -> list[Source]:
    """The Parquet files of a split of the examples (``folder``: ``examples/split=<s>``), a
    folder per day (``day=YYYY-MM-DD``), in day and number order."""
    sources = []
    for day in sorted(folder.glob("day=*")):
        for index, path in enumerate(sorted(day.glob("*.parquet"))):
            number = re.match(r"part-(\d+)", path.name)
            sources.append(Source(str(path), day.name.partition("=")[2],
                                  int(number.group(1)) if number else index))
    return sources


def _group_arrays(batch: pa.RecordBatch, groups: list[Group]) -> dict[str, np.ndarray]:
    arrays = {}
    for group in groups:
        dtype = np.float32 if group.dtype == "float32" else np.int64
        blocks = []
        for column in group.columns:
            values = batch.column(column)
            if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
                flat = values.flatten().to_numpy(zero_copy_only=False)
                blocks.append(flat.reshape(len(batch), group.column_width).astype(dtype))
            else:
                blocks.append(values.to_numpy(zero_copy_only=False).astype(dtype)[:, None])
        arrays[group.name] = np.hstack(blocks) if len(blocks) > 1 else blocks[0]
    return arrays


def _whole_records(chunks: Iterator[dict[str, np.ndarray]], groups: list[Group],
                   prebatch_size: int) -> Iterator[dict[str, np.ndarray]]:
    """Group arrays re-cut into chunks of whole records; the rows left at the end (fewer
    than ``prebatch_size``) come last, as one chunk of their own."""
    pending: list[dict[str, np.ndarray]] = []
    pending_rows = 0
    for chunk in chunks:
        pending.append(chunk)
        pending_rows += len(chunk[groups[0].name])
        if pending_rows >= prebatch_size:
            arrays = {g.name: np.concatenate([p[g.name] for p in pending]) for g in groups}
            whole = pending_rows - pending_rows % prebatch_size
            yield {name: values[:whole] for name, values in arrays.items()}
            pending = [{name: values[whole:] for name, values in arrays.items()}]
            pending_rows -= whole
    if pending_rows:
        yield {g.name: np.concatenate([p[g.name] for p in pending]) for g in groups}


@dataclass(frozen=True)
class TaskWriter:
    """The function each task runs on its rows (pickled to the executors).

    A task writes only whole records (``prebatch_size`` rows) to its file; the rows left
    over go to a file of their own, and :func:`commit` carries each day's tasks' leftovers
    into the day's last two files. So a day's only short record is its very last one,
    which is what lets the reader batch whole records and re-batch only the split's tail
    (docs/ARCHITECTURE.md, "TFRecords").
    """

    root: str
    split: str
    job_id: str
    groups: list[Group]
    prebatch_size: int
    compression: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        attempt = context.attemptNumber() if context else 0
        filesystem, root = _filesystem(self.root)
        stem = f"{self.staging(root)}/part-{partition:05d}-attempt-{attempt}"
        filesystem.create_dir(self.staging(root), recursive=True)
        chunks = _whole_records((_group_arrays(b, self.groups) for b in batches
                                 if b.num_rows), self.groups, self.prebatch_size)
        leftover: list[dict[str, np.ndarray]] = []
        path = stem + file_suffix(self.compression)
        rows = self.write(filesystem, path, chunks, leftover)
        rest_path = f"{stem}.rest.tfrecord"
        rest_rows = self.write(filesystem, rest_path, iter(leftover), compressed=False)
        if rows == 0 and rest_rows == 0:
            return
        yield pa.RecordBatch.from_pydict(
            {"partition": [partition], "path": [path if rows else None], "rows": [rows],
             "rest_path": [rest_path if rest_rows else None], "rest_rows": [rest_rows]},
            schema=_RESULT_ARROW)

    def staging(self, root: str) -> str:
        return f"{root}/{TEMPORARY}/{self.job_id}/{self.split}"

    def name(self, day: str, number: int) -> str:
        return f"{self.split}/{day}-part-{number:05d}{file_suffix(self.compression)}"

    def write(self, filesystem: pafs.FileSystem, path: str,
              chunks: Iterator[dict[str, np.ndarray]],
              leftover: list[dict[str, np.ndarray]] | None = None, compressed: bool = True
              ) -> int:
        """Write the chunks' records to ``path`` (no file if there are none), a short chunk
        appended to ``leftover`` instead when one is given; returns the rows written."""
        rows = 0
        codec = "gzip" if compressed and self.compression == "GZIP" else None
        stream = None
        try:
            for arrays in chunks:
                count = len(arrays[self.groups[0].name])
                if leftover is not None and count < self.prebatch_size:  # only the last
                    leftover.append(arrays)
                    continue
                stream = stream or filesystem.open_output_stream(path, compression=codec)
                for record in encode(arrays, self.groups, self.prebatch_size):
                    stream.write(record)
                rows += count
        finally:
            if stream is not None:
                stream.close()
        return rows


@dataclass(frozen=True)
class ParquetRows:
    """The rows of one Parquet file of a split as Arrow batches, each row group in a
    pseudo-random but repeatable order: permuted by a generator seeded with the file's day,
    number and the group's position, so one prebatched record mixes users and items as a
    training batch should (the examples are sorted by user), and the same files give the
    same records."""

    sources: list[Source]
    columns: list[str]

    def __call__(self, index: int) -> Iterator[pa.RecordBatch]:
        source = self.sources[index]
        filesystem, path = _filesystem(source.path)
        with filesystem.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            for group in range(parquet.num_row_groups):
                table = parquet.read_row_group(group, columns=self.columns)
                order = np.random.default_rng([*source.seed, group]).permutation(
                    table.num_rows)
                yield from table.take(order).to_batches()


def write_split(spark: SparkSession, sources: list[Source], root: str, split: str,
                groups: list[Group], prebatch_size: int, compression: str,
                job_id: str | None = None) -> list[dict[str, Any]]:
    """Write one split's days from their Parquet files (``sources``), one Spark task per
    file; returns ``[{"path", "split", "day", "rows"}]`` with paths relative to root, in
    day order (each day's file holding its one short record last)."""
    if not sources:
        return []
    job_id = job_id or uuid.uuid4().hex[:12]
    writer = TaskWriter(root, split, job_id, groups, prebatch_size, compression)
    rows = ParquetRows(list(sources), [c for g in groups for c in g.columns])

    def task(indices: Iterable[int]) -> Iterator[dict[str, Any]]:
        for index in indices:  # one per task: its partition is its file's position
            for result in writer(rows(index)):
                yield from result.to_pylist()

    try:
        results = spark.sparkContext.parallelize(range(len(sources)), len(sources)) \
            .mapPartitions(task).collect()
        return commit(writer, results, sources)
    finally:
        abort(root, job_id)


def commit(writer: TaskWriter, results: list[dict[str, Any]], sources: list[Source]
           ) -> list[dict[str, Any]]:
    """Move the files of the attempts Spark returned into place, then carry each day's
    leftover rows into two more files of that day: whole records, then the day's one short
    record. Any other attempt's files (a failed or speculative duplicate) stay in
    ``_temporary`` for :func:`abort`."""
    filesystem, base = _filesystem(writer.root)
    filesystem.create_dir(f"{base}/{writer.split}", recursive=True)
    by_day: dict[str, list[dict[str, Any]]] = {}
    for result in sorted(results, key=lambda r: r["partition"]):
        by_day.setdefault(sources[result["partition"]].day, []).append(result)
    files = []
    for day, day_results in sorted(by_day.items()):
        for result in day_results:
            if result["path"]:
                name = writer.name(day, sources[result["partition"]].number)
                filesystem.move(result["path"], f"{base}/{name}")
                files.append({"path": name, "split": writer.split, "day": day,
                              "rows": result["rows"]})
        rests = [r["rest_path"] for r in day_results if r["rest_rows"]]
        number = max(s.number for s in sources if s.day == day) + 1
        files += _carry(writer, filesystem, base, day, rests, number)
    return files


def _carry(writer: TaskWriter, filesystem: pafs.FileSystem, base: str, day: str,
           rests: list[str], number: int) -> list[dict[str, Any]]:
    """The day's leftover rows (``rests``) as its files ``number`` (whole records) and
    ``number + 1`` (the short record)."""
    if not rests:
        return []
    suffix = file_suffix(writer.compression)
    staging = writer.staging(base)
    chunks = _whole_records((_read_rest(filesystem, path, writer.groups) for path in rests),
                            writer.groups, writer.prebatch_size)
    short: list[dict[str, np.ndarray]] = []
    whole = writer.write(filesystem, f"{staging}/{day}-carried{suffix}", chunks, short)
    carried = [("carried", whole),
               ("short", writer.write(filesystem, f"{staging}/{day}-short{suffix}",
                                      iter(short)))]
    files = []
    for temporary, rows in carried:
        if rows:
            name = writer.name(day, number)
            filesystem.move(f"{staging}/{day}-{temporary}{suffix}", f"{base}/{name}")
            files.append({"path": name, "split": writer.split, "day": day, "rows": rows})
            number += 1
    return files


def _read_rest(filesystem: pafs.FileSystem, path: str, groups: list[Group]
               ) -> dict[str, np.ndarray]:
    with filesystem.open_input_stream(path) as stream:
        content = stream.readall()
    return group_arrays(framed_records(content, path), groups, path)


def abort(root: str, job_id: str) -> None:
    """Remove what the job's tasks left in ``_temporary``."""
    filesystem, base = _filesystem(root)
    filesystem.delete_dir_contents(f"{base}/{TEMPORARY}/{job_id}", missing_dir_ok=True)
    _remove_if_empty(filesystem, f"{base}/{TEMPORARY}/{job_id}")
    _remove_if_empty(filesystem, f"{base}/{TEMPORARY}")


def _remove_if_empty(filesystem: pafs.FileSystem, path: str) -> None:
    info = filesystem.get_file_info(path)
    if info.type == pafs.FileType.Directory and not filesystem.get_file_info(
            pafs.FileSelector(path)):
        filesystem.delete_dir(path)
