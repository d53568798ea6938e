"""Atomic job output: everything is written into a staging folder beside the target and
moved into place only when the whole job has succeeded, so a failed job leaves no
half-written output and the previous output stays intact."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame

from core.errors import ConfigError


def local_path(path: str) -> Path:
    """The output folder; the atomic rename needs a local (or mounted) filesystem."""
    if "://" in path and not path.startswith("file://"):
        raise ConfigError("etl.output.path",
                          f"{path!r}: write to a local or mounted path (the job publishes its "
                          "output with an atomic rename)")
    return Path(path.removeprefix("file://")).resolve()


@contextmanager
def staged_directory(final: Path) -> Iterator[Path]:
    """Yield a fresh staging folder; on success it replaces ``final``, on failure it goes."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".{final.name}.staging-{uuid.uuid4().hex[:12]}"
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if final.exists():
        retired = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:12]}"
        os.rename(final, retired)
        os.rename(staging, final)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.rename(staging, final)


def write_parquet(frame: DataFrame, path: Path, *, files: int | None = 1,
                  partition_by: str | None = None) -> None:
    """Write ``frame`` as Parquet; ``files=1`` makes a table small readers open in one go."""
    if files is not None:
        frame = frame.coalesce(files)
    writer = frame.write.mode("errorifexists")
    if partition_by:
        writer = writer.partitionBy(partition_by)
    writer.parquet(str(path))


def write_json(data: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
