"""The job's output files: where it may write, Parquet tables and JSON documents.

The whole output is written into a staging folder and moved into place only when the whole
job has succeeded (``featureline.core.files.staged_directory``), so a failed job leaves no
half-written output and the previous output stays intact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame

from featureline.core.errors import ConfigError


def local_path(path: str) -> Path:
    """The output folder; the atomic rename needs a local (or mounted) filesystem."""
    if "://" in path and not path.startswith("file://"):
        raise ConfigError("etl.output.path",
                          f"{path!r}: write to a local or mounted path (the job publishes its "
                          "output with an atomic rename)")
    return Path(path.removeprefix("file://")).resolve()


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
