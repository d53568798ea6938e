"""Publishing from Spark, for entity tables beyond one process (docs/ARCHITECTURE.md,
"Publishing"): each partition of the latest snapshots is written by its own task with the
single-process writer, straight to the online store (``feature_store/online_store.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from featureline.feature_store.writer import Layout, Written, entity_keys

BULK_TIMEOUT_S = 60.0


def latest_frame(spark: SparkSession, path: Path, layout: Layout, start: datetime,
                 end: datetime) -> DataFrame:
    """Each entity's latest snapshot in [start, end], as Feast's materialization picks it."""
    frame = spark.read.parquet(str(path))
    stamp = F.col(layout.timestamp_field)
    low, high = (t.astimezone(timezone.utc) for t in (start, end))
    frame = frame.where((stamp >= F.lit(low)) & (stamp <= F.lit(high)))
    columns = [layout.join_key, layout.timestamp_field, *(name for name, _ in layout.features)]
    latest = F.max_by(F.struct(*columns), stamp).alias("row")
    return frame.groupBy(layout.join_key).agg(latest).select("row.*")


def write_with_spark(spark: SparkSession, path: Path, layout: Layout, start: datetime,
                     end: datetime, kind: str, url: str, *, keys_needed: bool,
                     generation: int | None = None) -> Written:
    """Write the view from Spark tasks into the online store of type ``kind`` at ``url``
    (with the entity vectors of ``generation``); ``keys_needed``: also return every written
    key (a replace looks for the entities no longer there)."""

    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from featureline.feature_store.online_store import open_online_store

        # Bulk writes share the server with every other task: a patient socket.
        store = open_online_store(kind, url, BULK_TIMEOUT_S)
        try:
            for batch in batches:
                result = store.write_view(pa.Table.from_batches([batch]), layout,
                                          keep_keys=False, generation=generation)
                yield pa.RecordBatch.from_pydict({"keys": [result.keys],
                                                  "changed": [result.changed]})
        finally:
            store.close()

    latest = latest_frame(spark, path, layout, start, end)
    totals = (latest.mapInArrow(write, "keys long, changed long")
              .agg(F.sum("keys").alias("keys"), F.sum("changed").alias("changed")).collect()[0])
    written: set[bytes] = set()
    if keys_needed:
        values: Any = latest.select(layout.join_key).toArrow()[layout.join_key]
        written = set(entity_keys(layout.join_key, values, layout.key_type, layout.project,
                                  layout.key_version))
    return Written(int(totals["keys"] or 0), int(totals["changed"] or 0), written)
