"""``featureline publish``: register the definitions with Feast, write each entity's latest
snapshot into the Redis online store in Feast's layout (``feature_store/writer.py``: the
bytes Feast's materialization would write, at Redis speed), then stamp the store with the
dataset it now holds.

A dataset the store does not hold yet (another ETL run, another output folder, a refit) is
published whole and replaces what was there: every entity's latest snapshot is written again
(compared with the stored values in Redis, so the summary says how many changed), and
entities the new dataset no longer has are removed. The same dataset published again is
incremental: each view continues from the end of its last publish (recorded in Feast's
registry, as a materialization would). ``full`` replaces in any case.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pyarrow.compute as pc
import pyarrow.dataset as ds

from featureline.core import redis
from featureline.core.redis import redact
from featureline.feature_store.publication import (
    Publication,
    publication_key,
    read_publication,
    write_publication,
)
from featureline.feature_store.repo import FeatureRepo, online_store_errors
from featureline.feature_store.writer import Layout, latest_snapshots, write_view

# Keys scanned, checked or removed per pipelined round trip while replacing a dataset.
BATCH = 10_000
# Seconds between progress lines while a view is written.
PROGRESS_EVERY_S = 5.0


@dataclass
class ViewPublished:
    name: str
    start: datetime
    end: datetime
    keys: int
    seconds: float


@dataclass
class PublishSummary:
    online_store: str
    dataset_version: str
    replaced: str | None  # the dataset version this publish replaced, when it replaced one
    mode: str  # "replace" or "incremental"
    views: list[ViewPublished] = field(default_factory=list)
    keys_changed: int | None = None  # entity keys whose values differ afterwards (replace)
    keys_removed: int = 0  # entities the new dataset no longer has
    seconds: float = 0.0

    @property
    def keys(self) -> int:
        return sum(view.keys for view in self.views)

    def to_json(self) -> dict[str, Any]:
        return {"online_store": self.online_store, "dataset_version": self.dataset_version,
                "mode": self.mode, "replaced": self.replaced, "keys_written": self.keys,
                "keys_changed": self.keys_changed, "keys_removed": self.keys_removed,
                "seconds": round(self.seconds, 3),
                "views": [{"name": v.name, "start": v.start.isoformat(),
                           "end": v.end.isoformat(), "keys": v.keys,
                           "seconds": round(v.seconds, 3)} for v in self.views]}


def _snapshots(repo: FeatureRepo, entity: str) -> ds.Dataset:
    return ds.dataset(repo.definitions.snapshot_path(entity), format="parquet")


def _as_utc(value: Any) -> datetime:
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def _earliest(snapshots: ds.Dataset, timestamp: str) -> datetime:
    earliest = pc.min(snapshots.to_table(columns=[timestamp])[timestamp]).as_py()
    return _as_utc(earliest or datetime(1970, 1, 1))


def _project_keys(client: Any, project: str) -> set[bytes]:
    """Every key of the project's namespace but the publication stamp (one SCAN)."""
    skip = publication_key(project).encode()
    return {k for k in client.scan_iter(match=f"*{project}", count=BATCH) if k != skip}


def _holding(client: Any, keys: list[bytes], views: list[str]) -> list[bytes]:
    """Those of ``keys`` that hold values of ``views`` (their timestamp field is set)."""
    stamps = [f"_ts:{view}" for view in views]
    held = []
    for low in range(0, len(keys), BATCH):
        batch = keys[low:low + BATCH]
        pipe = client.pipeline(transaction=False)
        for key in batch:
            pipe.hmget(key, stamps)
        held += [key for key, found in zip(batch, pipe.execute(), strict=True)
                 if any(value is not None for value in found)]
    return held


def _delete(client: Any, keys: list[bytes]) -> None:
    for low in range(0, len(keys), BATCH):
        pipe = client.pipeline(transaction=False)
        for key in keys[low:low + BATCH]:
            pipe.delete(key)
        pipe.execute()


class _Progress:
    """Keys written so far, printed at most every few seconds."""

    def __init__(self, view: str, total: int, progress: Callable[[str], None]) -> None:
        self.view, self.total, self.progress = view, total, progress
        self.next = time.monotonic() + PROGRESS_EVERY_S

    def __call__(self, written: int) -> None:
        if time.monotonic() >= self.next and written < self.total:
            self.progress(f"{self.view}: {written:,} / {self.total:,} keys written")
            self.next = time.monotonic() + PROGRESS_EVERY_S


def publish(repo: FeatureRepo, *, full: bool = False, end: datetime | None = None,
            progress: Callable[[str], None] = print, spark: Any = None) -> PublishSummary:
    """Apply the definitions, then write every feature view's latest snapshots up to ``end``
    (now) into the online store: the whole dataset when the store holds another one (or
    ``full``), else what is new since the view's last publish. With a SparkSession, Spark
    tasks write the views, each its partitions' entities."""
    started = time.perf_counter()
    end = _as_utc(end or datetime.now(timezone.utc))
    store = repo.store
    metadata = repo.definitions.metadata
    version = metadata.dataset_version
    cluster = repo.settings.redis_type == "redis_cluster"
    client = redis.client(repo.redis_url, cluster=cluster)
    views = [view.name for view in repo.definitions.views.values()]
    online_config = store.config.online_store
    with online_store_errors(repo.redis_url), contextlib.closing(client):
        online = read_publication(client, store.project)
        replace = full or online is None or online.dataset_version != version
        summary = PublishSummary(redact(repo.redis_url), version, mode="replace" if replace
                                 else "incremental",
                                 replaced=online.dataset_version if online and replace else None)
        objects = repo.definitions.objects()
        store.apply(objects)
        progress(f"applied {len(objects)} Feast objects to project "
                 f"{store.project!r}")
        before: set[bytes] = set()
        if replace:
            before = _project_keys(client, store.project)
            replaced = online.dataset_version if online else "a store without a publication stamp"
            progress(f"dataset {version} replaces {replaced}: {len(before):,} keys there now")
        written: set[bytes] = set()
        changed = 0
        for entity, view in repo.definitions.views.items():
            table = metadata.entities[entity]
            registered = store.get_feature_view(view.name)
            last = registered.most_recent_end_time
            snapshots = _snapshots(repo, entity)
            start = (_earliest(snapshots, table.timestamp_field)
                     if replace or last is None else _as_utc(last))
            view_started = time.perf_counter()
            layout = Layout.of(registered, table.join_key,
                               repo.definitions.entities[entity].value_type, store.project,
                               store.config.entity_key_serialization_version,
                               getattr(online_config, "key_ttl_seconds", None))
            if spark is not None:
                from featureline.feature_store.spark_writer import write_with_spark

                result = write_with_spark(spark, repo.definitions.snapshot_path(entity), layout,
                                          start, end, repo.redis_url, cluster,
                                          keys_needed=bool(before))
            else:
                rows = latest_snapshots(snapshots, table.join_key,
                                        table.timestamp_field, start, end)
                result = write_view(client, rows, layout,
                                    _Progress(view.name, rows.num_rows, progress),
                                    keep_keys=bool(before))
            store.registry.apply_materialization(registered, store.project, start, end)
            written |= result.written_keys
            changed += result.changed
            done = ViewPublished(view.name, start, end, result.keys,
                                 time.perf_counter() - view_started)
            progress(f"published {view.name}: {result.keys:,} keys from "
                     f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} in {done.seconds:.1f}s")
            summary.views.append(done)
        if replace:
            stale = _holding(client, sorted(before - written), views)
            _delete(client, stale)
            summary.keys_removed = len(stale)
            summary.keys_changed = changed
        write_publication(client, store.project, Publication.of(
            metadata, str(repo.definitions.output), datetime.now(timezone.utc).isoformat()))
    summary.seconds = time.perf_counter() - started
    progress(f"online store holds dataset {version}: {summary.keys:,} keys written, "
             f"{summary.keys_changed if summary.keys_changed is not None else 'n/a'} changed, "
             f"{summary.keys_removed:,} removed")
    return summary
