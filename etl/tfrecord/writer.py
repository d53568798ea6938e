"""Write ``tfrecord/<split>/part-NNNNN.tfrecord[.gz]`` from the examples, inside the Spark job.

One Spark task per Parquet file of the split reads it with pyarrow (the rows go from the
file to NumPy with none of Spark's row or Arrow conversions, which cost several times the
encoding: benchmarks/README.md), encodes its rows with
:mod:`featureline.etl.tfrecord.records` and writes its file straight to the output
filesystem (a local path or any pyarrow filesystem URI) under a commit protocol: tasks
write to ``_temporary/<job>/``; only the attempts whose results Spark returns are moved
into place, then ``_temporary`` goes. A retried or speculative task, or a failed job, leaves
no partial or duplicate file.

Every record holds ``prebatch_size`` rows except the split's very last one: each task
writes whole records and sets its leftover rows aside; the driver carries them into the
split's last files.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
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
    over go to a file of their own, and :func:`commit` carries every task's leftovers into
    the split's last two files. So the split's only short record is its very last one,
    which is what lets the reader batch records without re-batching rows
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
    pseudo-random but repeatable order: permuted by a generator seeded with the file's and
    the group's positions, so one prebatched record mixes users and items as a training
    batch should (the examples are sorted by user), and the same files give the same
    records."""

    files: list[str]
    columns: list[str]

    def __call__(self, index: int) -> Iterator[pa.RecordBatch]:
        filesystem, path = _filesystem(self.files[index])
        with filesystem.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            for group in range(parquet.num_row_groups):
                table = parquet.read_row_group(group, columns=self.columns)
                order = np.random.default_rng([index, group]).permutation(table.num_rows)
                yield from table.take(order).to_batches()


def write_split(spark: SparkSession, files: list[str], root: str, split: str,
                groups: list[Group], prebatch_size: int, compression: str,
                job_id: str | None = None) -> list[dict[str, Any]]:
    """Write one split from its Parquet ``files``, one Spark task per file; returns
    ``[{"path", "split", "rows"}]`` with paths relative to root, in reading order (the file
    holding the split's one short record last)."""
    if not files:
        return []
    job_id = job_id or uuid.uuid4().hex[:12]
    writer = TaskWriter(root, split, job_id, groups, prebatch_size, compression)
    rows = ParquetRows(list(files), [c for g in groups for c in g.columns])

    def task(indices: Iterable[int]) -> Iterator[dict[str, Any]]:
        for index in indices:  # one per task: its partition is its file's position
            for result in writer(rows(index)):
                yield from result.to_pylist()

    try:
        results = spark.sparkContext.parallelize(range(len(files)), len(files)) \
            .mapPartitions(task).collect()
        return commit(writer, results)
    finally:
        abort(root, job_id)


def commit(writer: TaskWriter, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Move the files of the attempts Spark returned into place, then carry their leftover
    rows into two more files: whole records, then the one short record. Any other attempt's
    files (a failed or speculative duplicate) stay in ``_temporary`` for :func:`abort`."""
    filesystem, base = _filesystem(writer.root)
    filesystem.create_dir(f"{base}/{writer.split}", recursive=True)
    suffix = file_suffix(writer.compression)
    results = sorted(results, key=lambda r: r["partition"])
    files = []
    for result in results:
        if result["path"]:
            name = f"{writer.split}/part-{result['partition']:05d}{suffix}"
            filesystem.move(result["path"], f"{base}/{name}")
            files.append({"path": name, "split": writer.split, "rows": result["rows"]})
    rests = [r["rest_path"] for r in results if r["rest_rows"]]
    if not rests:
        return files
    staging = writer.staging(base)
    chunks = _whole_records((_read_rest(filesystem, path, writer.groups) for path in rests),
                            writer.groups, writer.prebatch_size)
    short: list[dict[str, np.ndarray]] = []
    whole = writer.write(filesystem, f"{staging}/carried{suffix}", chunks, short)
    carried = [("carried", whole),
               ("short", writer.write(filesystem, f"{staging}/short{suffix}", iter(short)))]
    number = results[-1]["partition"] + 1
    for temporary, rows in carried:
        if rows:
            name = f"{writer.split}/part-{number:05d}{suffix}"
            filesystem.move(f"{staging}/{temporary}{suffix}", f"{base}/{name}")
            files.append({"path": name, "split": writer.split, "rows": rows})
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
