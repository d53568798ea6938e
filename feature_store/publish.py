"""``featureline publish``: register the definitions with Feast and materialize the entity
snapshots into the Redis online store, then stamp the store with the dataset it now holds.

A dataset the store does not hold yet (another ETL run, another output folder, a refit) is
published whole and replaces what was there: every snapshot is written again — Feast's writer
skips a row whose timestamp is not newer than the stored one, so the stored timestamps are
cleared first — and entities the new dataset no longer has are removed. The same dataset
published again is incremental: each view continues from the end of its last
materialization. ``full`` replaces in any case.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pyarrow.compute as pc
import pyarrow.dataset as ds

from core import redis
from core.metadata import dataset_version
from core.redis import redact
from feature_store.publication import (
    Publication,
    publication_key,
    read_publication,
    write_publication,
)
from feature_store.repo import FeatureRepo, online_store_errors

# Keys read or cleared per pipelined round trip while replacing a dataset.
BATCH = 1000


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


def _keys_between(snapshots: ds.Dataset, key: str, timestamp: str, start: datetime,
                  end: datetime) -> int:
    """Distinct entities with a snapshot in [start, end]: the keys this range writes."""
    column = ds.field(timestamp)
    # The snapshot files hold naive UTC timestamps.
    low, high = (t.astimezone(timezone.utc).replace(tzinfo=None) for t in (start, end))
    rows = snapshots.to_table(columns=[key], filter=(column >= low) & (column <= high))
    return int(pc.count_distinct(rows[key]).as_py())


def _online_values(client: Any, project: str, views: list[str]) -> dict[bytes, int]:
    """Every key holding values of ``views`` → a digest of those values (timestamps aside)."""
    stamps = {f"_ts:{view}".encode() for view in views}
    skip = publication_key(project).encode()
    keys = [k for k in client.scan_iter(match=f"*{project}", count=BATCH) if k != skip]
    digests = {}
    for low in range(0, len(keys), BATCH):
        batch = keys[low:low + BATCH]
        pipe = client.pipeline(transaction=False)
        for key in batch:
            pipe.hgetall(key)
        for key, fields in zip(batch, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(fields, dict) and stamps & fields.keys():
                digests[key] = hash(tuple(sorted(
                    (name, value) for name, value in fields.items() if name not in stamps)))
    return digests


def _each_batch(client: Any, keys: list[bytes], command: Callable[[Any, bytes], None]) -> None:
    for low in range(0, len(keys), BATCH):
        pipe = client.pipeline(transaction=False)
        for key in keys[low:low + BATCH]:
            command(pipe, key)
        pipe.execute()


def publish(repo: FeatureRepo, *, full: bool = False, end: datetime | None = None,
            progress: Callable[[str], None] = print) -> PublishSummary:
    """Apply the definitions, then materialize every feature view up to ``end`` (now): the
    whole dataset when the store holds another one (or ``full``), else what is new."""
    started = time.perf_counter()
    end = _as_utc(end or datetime.now(timezone.utc))
    store = repo.store
    metadata = repo.definitions.metadata
    version = dataset_version(metadata)
    client = redis.client(repo.redis_url, cluster=repo.settings.redis_type == "redis_cluster")
    views = [view.name for view in repo.definitions.views.values()]
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
        before: dict[bytes, int] = {}
        if replace:
            before = _online_values(client, store.project, views)
            stamps = [f"_ts:{view}" for view in views]
            _each_batch(client, list(before), lambda pipe, key: pipe.hdel(key, *stamps))
            replaced = online.dataset_version if online else "a store without a publication stamp"
            progress(f"dataset {version} replaces {replaced}: {len(before):,} keys to rewrite")
        for entity, view in repo.definitions.views.items():
            table = metadata["entities"][entity]
            snapshots = _snapshots(repo, entity)
            last = store.get_feature_view(view.name).most_recent_end_time
            start = (_earliest(snapshots, table["timestamp_field"]) if replace or last is None
                     else _as_utc(last))
            keys = _keys_between(snapshots, table["join_key"], table["timestamp_field"],
                                 start, end)
            view_started = time.perf_counter()
            # Feast prints its own progress on stdout, where our commands print results.
            with contextlib.redirect_stdout(sys.stderr):
                store.materialize(start, end, feature_views=[view.name])
            done = ViewPublished(view.name, start, end, keys, time.perf_counter() - view_started)
            progress(f"materialized {view.name}: {keys:,} keys from {start:%Y-%m-%d %H:%M} "
                     f"to {end:%Y-%m-%d %H:%M} in {done.seconds:.1f}s")
            summary.views.append(done)
        if replace:
            after = _online_values(client, store.project, views)
            stale = [key for key in before if key not in after]
            _each_batch(client, stale, lambda pipe, key: pipe.delete(key))
            summary.keys_removed = len(stale)
            summary.keys_changed = sum(before.get(key) != digest for key, digest in after.items())
        write_publication(client, store.project, Publication.of(
            metadata, str(repo.definitions.output), datetime.now(timezone.utc).isoformat()))
    summary.seconds = time.perf_counter() - started
    progress(f"online store holds dataset {version}: {summary.keys:,} keys written, "
             f"{summary.keys_changed if summary.keys_changed is not None else 'n/a'} changed, "
             f"{summary.keys_removed:,} removed")
    return summary
