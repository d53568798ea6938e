"""The job's output files: where it may write, Parquet tables and JSON documents.

The whole output is written into a staging folder and moved into place only when the whole
job has succeeded (``featureline.core.files.staged_directory``), so a failed job leaves no
half-written output and the previous output stays intact.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark import inheritable_thread_target
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import ArrayType, BooleanType, DataType, StringType, StructType

from featureline.core.errors import ConfigError


def local_path(path: str) -> Path:
    """The output folder; the atomic rename needs a local (or mounted) filesystem."""
    if "://" in path and not path.startswith("file://"):
        raise ConfigError("etl.output.path",
                          f"{path!r}: write to a local or mounted path (the job publishes its "
                          "output with an atomic rename)")
    return Path(path.removeprefix("file://")).resolve()


def write_parquet(frame: DataFrame, path: Path, *, files: int | None = 1,
                  partition_by: str | list[str] | None = None, mode: str = "errorifexists",
                  keep_order: bool = True) -> None:
    """Write ``frame`` as Parquet; ``files=1`` makes a table small readers open in one go;
    ``mode="append"`` adds files (and partitions) to a table. ``files`` are made keeping the
    frame's order (a coalesce: its last stage runs in that many tasks), or, without
    ``keep_order``, by a shuffle after the frame is computed in its own tasks — an
    aggregation of events already partitioned by its key has no shuffle of its own, and a
    coalesce into one file would run all of it in one task."""
    if files is not None:
        frame = frame.coalesce(files) if keep_order else frame.repartition(files)
    writer = frame.write.mode(mode)
    if partition_by:
        writer = writer.partitionBy(partition_by)
    writer.parquet(str(path))


# Tables ``write_each`` writes at once: a small table's job waits mostly on the driver's
# planning, so the next one's planning overlaps its tasks (docs/ARCHITECTURE.md, "Incremental
# runs").
CONCURRENT_WRITES = 4


def write_each(writes: Sequence[tuple[DataFrame, Path]], *,
               workers: int = CONCURRENT_WRITES) -> None:
    """``write_parquet`` (one file, ``keep_order`` off) of each ``(frame, path)``, up to
    ``workers`` at a time, each thread with the caller's Spark local properties (the job's
    stage); every write ends before this returns, and the first failure is raised."""

    def write(frame: DataFrame, path: Path) -> None:
        write_parquet(frame, path, keep_order=False)

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(writes)))) as pool:
        # Wrapped with the frame's session: its tags too, and no warning that they are not.
        futures = [pool.submit(inheritable_thread_target(frame.sparkSession)(write),
                               frame, path) for frame, path in writes]
    for future in futures:
        future.result()


def write_parquet_days(frame: DataFrame, path: Path, stamp: str, *keys: str) -> None:
    """Write ``frame`` as one Parquet file per UTC day of its ``stamp`` column, named
    ``YYYY-MM-DD-part-00000.parquet`` in one folder (the day a file name's prefix, not a
    partition column: readers see the table's columns only), rows by ``stamp`` and ``keys``
    within a day; a frame without rows as one file without a day (where the folder holds
    none yet)."""
    days = path / "_days"
    day = "_day"
    dated = frame.withColumn(day, F.to_date(stamp))
    write_parquet(dated.repartition(day).sortWithinPartitions(stamp, *keys),
                  days, files=None, partition_by=day)
    path.mkdir(parents=True, exist_ok=True)
    for folder in sorted(days.glob(f"{day}=*")):
        for index, file in enumerate(sorted(folder.glob("*.parquet"))):
            file.rename(path / f"{folder.name.partition('=')[2]}-part-{index:05d}.parquet")
    shutil.rmtree(days)
    if not any(path.glob("*.parquet")):
        write_parquet(frame, path / "_empty")
        for file in (path / "_empty").glob("*.parquet"):
            file.rename(path / "part-00000.parquet")
        shutil.rmtree(path / "_empty")


def reread(frame: DataFrame, path: Path, *, files: int | None = 1) -> DataFrame:
    """``frame`` written as Parquet at ``path`` and read back (``read_as_written``): what is
    built on the result plans from the files, not from ``frame``'s whole lineage again (each
    use of a deep lineage multiplies the plan Spark analyses and optimises). Rows in no
    particular order (``write_parquet``'s ``keep_order`` off)."""
    write_parquet(frame, path, files=files, keep_order=False)
    return read_as_written(frame.sparkSession, path)


def read_as_written(spark: SparkSession, path: Path) -> DataFrame:
    """The Parquet table Spark wrote at ``path``, each column as nullable as when it was
    written: Spark reads every column of a file as nullable, so the tables written from it
    would declare as optional what the same job writes as required from its own rows."""
    frame = spark.read.parquet(str(path))
    first = min(path.rglob("*.parquet"))
    written = from_arrow_schema(pq.read_schema(first))
    return frame.withColumns({field.name: required(F.col(field.name), field.dataType)
                              for field in written if not field.nullable})


def required(column: Column, kind: DataType) -> Column:
    """``column`` declared non-null (and its elements, where ``kind`` says so): a null never
    read from a required column becomes the type's zero."""
    if isinstance(kind, ArrayType) and not kind.containsNull:
        element = kind.elementType
        column = F.transform(column, lambda item: F.coalesce(item, _zero(element)))
    return F.coalesce(column, _zero(kind))


def _zero(kind: DataType) -> Column:
    if isinstance(kind, ArrayType):
        return F.array_repeat(_zero(kind.elementType), 0)
    if isinstance(kind, StructType):
        raise TypeError(f"no zero value for {kind.simpleString()}")
    return {StringType: F.lit(""), BooleanType: F.lit(False)}.get(
        type(kind), F.lit(0).cast(kind))


def write_json(data: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
