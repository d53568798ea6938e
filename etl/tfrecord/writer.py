"""Write ``tfrecord/<split>/part-NNNNN.tfrecord[.gz]`` from the examples, inside the Spark job.

Each task encodes its rows with :mod:`featureline.etl.tfrecord.records` through
``mapInArrow`` and writes its file straight to the output filesystem (a local path or any
pyarrow filesystem URI)
under a commit protocol: tasks write to ``_temporary/<job>/``; only the attempts whose
results Spark returns are moved into place, then ``_temporary`` goes. A retried or
speculative task, or a failed job, leaves no partial or duplicate file.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from pyspark import TaskContext
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from featureline.etl.tfrecord.layout import Group
from featureline.etl.tfrecord.records import encode

TEMPORARY = "_temporary"
RESULT_SCHEMA = "partition int, path string, rows long"
_RESULT_ARROW = pa.schema([("partition", pa.int32()), ("path", pa.string()),
                           ("rows", pa.int64())])


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


def _prebatched(batches: Iterator[pa.RecordBatch], groups: list[Group], prebatch_size: int
                ) -> Iterator[dict[str, np.ndarray]]:
    """Group arrays in chunks of whole records; the rows left at the end come last, so
    only the final record of a file is smaller than ``prebatch_size``."""
    pending: list[dict[str, np.ndarray]] = []
    pending_rows = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(_group_arrays(batch, groups))
        pending_rows += batch.num_rows
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
    """The function ``mapInArrow`` runs in each task (pickled to the executors)."""

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
        path = (f"{root}/{TEMPORARY}/{self.job_id}/{self.split}/"
                f"part-{partition:05d}-attempt-{attempt}{file_suffix(self.compression)}")
        filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
        rows = 0
        codec = "gzip" if self.compression == "GZIP" else None
        with filesystem.open_output_stream(path, compression=codec) as stream:
            for arrays in _prebatched(batches, self.groups, self.prebatch_size):
                for record in encode(arrays, self.groups, self.prebatch_size):
                    stream.write(record)
                rows += len(arrays[self.groups[0].name])
        if rows == 0:
            filesystem.delete_file(path)
            return
        yield pa.RecordBatch.from_pydict(
            {"partition": [partition], "path": [path], "rows": [rows]}, schema=_RESULT_ARROW)


def write_split(frame: DataFrame, root: str, split: str, groups: list[Group],
                prebatch_size: int, compression: str, shuffle_keys: list[str],
                job_id: str | None = None) -> list[dict[str, Any]]:
    """Write one split; returns ``[{"path", "split", "rows"}]`` with paths relative to root.

    Rows are laid out in a pseudo-random but repeatable order (a hash of ``shuffle_keys``),
    so one prebatched record mixes users and items as a training batch should.
    """
    job_id = job_id or uuid.uuid4().hex[:12]
    writer = TaskWriter(root, split, job_id, groups, prebatch_size, compression)
    columns = [c for g in groups for c in g.columns]
    ordered = frame.sortWithinPartitions(F.xxhash64(*shuffle_keys)).select(*columns)
    try:
        results = ordered.mapInArrow(writer, RESULT_SCHEMA).collect()
        return commit(root, split, [r.asDict() for r in results], compression)
    finally:
        abort(root, job_id)


def commit(root: str, split: str, results: list[dict[str, Any]], compression: str
           ) -> list[dict[str, Any]]:
    """Move the files of the attempts Spark returned into place; any other attempt's file
    (a failed or speculative duplicate) stays in ``_temporary`` for :func:`abort`."""
    filesystem, base = _filesystem(root)
    filesystem.create_dir(f"{base}/{split}", recursive=True)
    files = []
    for result in sorted(results, key=lambda r: r["partition"]):
        name = f"{split}/part-{result['partition']:05d}{file_suffix(compression)}"
        filesystem.move(result["path"], f"{base}/{name}")
        files.append({"path": name, "split": split, "rows": result["rows"]})
    return files


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
