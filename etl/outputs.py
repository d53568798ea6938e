"""Atomic job output: everything is written into a staging folder beside the target and
moved into place only when the whole job has succeeded, so a failed job leaves no
half-written output and the previous output stays intact.

The move is one atomic exchange of the two folders
(``featureline.core.files.publish_directory``): at every instant the output path holds either
the complete previous output or the complete new one, whatever happens to the process.
A lock file beside the output admits one run at a time: a second run fails at once, naming
the holder. The run holding the lock removes staging and retired folders a killed run left.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame

from featureline.core.errors import ConfigError
from featureline.core.files import publish_directory, staging_folder
from featureline.etl.errors import OutputLockedError


def local_path(path: str) -> Path:
    """The output folder; the atomic rename needs a local (or mounted) filesystem."""
    if "://" in path and not path.startswith("file://"):
        raise ConfigError("etl.output.path",
                          f"{path!r}: write to a local or mounted path (the job publishes its "
                          "output with an atomic rename)")
    return Path(path.removeprefix("file://")).resolve()


@contextmanager
def output_lock(final: Path) -> Iterator[None]:
    """One run at a time on ``final``; the lock file says who holds it."""
    final.parent.mkdir(parents=True, exist_ok=True)
    path = final.parent / f".{final.name}.lock"
    with path.open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            raise OutputLockedError(str(final), lock.read().strip() or "unknown") from None
        lock.truncate(0)
        lock.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                               "since": datetime.now(timezone.utc).isoformat()}))
        lock.flush()
        try:
            yield
        finally:
            lock.truncate(0)
            fcntl.flock(lock, fcntl.LOCK_UN)


def remove_leftovers(final: Path) -> list[Path]:
    """Staging and retired folders of runs that were killed (call holding the lock)."""
    leftovers = [p for pattern in (f".{final.name}.staging-*", f".{final.name}.old-*")
                 for p in final.parent.glob(pattern) if p.is_dir()]
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    return leftovers


@contextmanager
def staged_directory(final: Path) -> Iterator[Path]:
    """Yield a fresh staging folder; on success it replaces ``final``, on failure it goes.

    Holds the output's lock throughout, and first clears what killed runs left behind."""
    with output_lock(final):
        remove_leftovers(final)
        staging = staging_folder(final)
        try:
            yield staging
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        publish_directory(staging, final)


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
