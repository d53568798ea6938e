"""``featureline publish``: register the definitions with Feast and materialize the entity
snapshots into the Redis online store.

Incremental by default: each feature view continues from the end of its last
materialization; a view never materialized (and every view with ``full``) starts at its
earliest snapshot, so the first publish loads everything.
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

from feature_store.repo import FeatureRepo, online_store_errors


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
    views: list[ViewPublished] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def keys(self) -> int:
        return sum(view.keys for view in self.views)

    def to_json(self) -> dict[str, Any]:
        return {"online_store": self.online_store, "keys_written": self.keys,
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


def publish(repo: FeatureRepo, *, full: bool = False, end: datetime | None = None,
            progress: Callable[[str], None] = print) -> PublishSummary:
    """Apply the definitions, then materialize every feature view up to ``end`` (now)."""
    started = time.perf_counter()
    end = _as_utc(end or datetime.now(timezone.utc))
    store = repo.store
    summary = PublishSummary(online_store=repo.redis_url)
    with online_store_errors(repo.redis_url):
        objects = repo.definitions.objects()
        store.apply(objects)
        progress(f"applied {len(objects)} Feast objects to project "
                 f"{store.project!r}")
        for entity, view in repo.definitions.views.items():
            table = repo.definitions.metadata["entities"][entity]
            snapshots = _snapshots(repo, entity)
            last = store.get_feature_view(view.name).most_recent_end_time
            start = (_earliest(snapshots, table["timestamp_field"]) if full or last is None
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
    summary.seconds = time.perf_counter() - started
    return summary
