"""``featureline publish``: register the definitions with Feast, write each entity's latest
snapshot into the online store in Feast's layout (``feature_store/writer.py``: the bytes
Feast's materialization would write, at Redis speed, through ``feature_store/online_store.py``),
then stamp the store with the dataset it now holds.

A dataset the store does not hold yet (another ETL run, another output folder, a refit) is
published whole and replaces what was there: every entity's latest snapshot is written again
(compared with the stored values, so the summary says how many changed), and
entities the new dataset no longer has are removed. The same dataset published again is
incremental: each view continues from the end of its last publish (recorded in Feast's
registry, as a materialization would). ``full`` replaces in any case.

Each entity is also written as one vector per view, the form our reader reads. A replace
writes its vectors as the next generation, beside the served one; stamping the store with the
new generation switches every reader at once, then the old generation is deleted — so no
answer of the API mixes two datasets (docs/ARCHITECTURE.md, "Publishing"). Feast's
layout is written in place, as Feast's own materialization does. The output's tiles — of its
aggregation groups and of its entity tables' groups, where the stream adds pushed events —
go with the vectors: each key's tiles, written into the new generation
(``feature_store/tiles.py``).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.dataset as ds

from featureline.core.drift import ACCEPTED_DRIFT_FILE, Breach, latest_verdict
from featureline.core.metadata import Metadata
from featureline.core.redis import redact
from featureline.feature_store.errors import DriftRefusedError, online_store_errors
from featureline.feature_store.online_store import OnlineStore, open_online_store
from featureline.feature_store.publication import STORE_LAYOUT, Publication
from featureline.feature_store.repo import FeatureRepo
from featureline.feature_store.tiles import stored_tiles, tile_key, tiles_prefix
from featureline.feature_store.writer import VECTOR_PREFIX, Layout, latest_snapshots

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
    generation: int = 0  # of the entity vectors served afterwards
    vectors_removed: int = 0  # those of the generation replaced
    tile_keys: int = 0  # keys of the aggregations written with their tiles (replace)
    seconds: float = 0.0

    @property
    def keys(self) -> int:
        return sum(view.keys for view in self.views)

    def to_json(self) -> dict[str, Any]:
        return {"online_store": self.online_store, "dataset_version": self.dataset_version,
                "mode": self.mode, "replaced": self.replaced, "keys_written": self.keys,
                "keys_changed": self.keys_changed, "keys_removed": self.keys_removed,
                "generation": self.generation, "vectors_removed": self.vectors_removed,
                "tile_keys": self.tile_keys,
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


class _Progress:
    """Keys written so far, printed at most every few seconds."""

    def __init__(self, view: str, total: int, progress: Callable[[str], None]) -> None:
        self.view, self.total, self.progress = view, total, progress
        self.next = time.monotonic() + PROGRESS_EVERY_S

    def __call__(self, written: int) -> None:
        if time.monotonic() >= self.next and written < self.total:
            self.progress(f"{self.view}: {written:,} / {self.total:,} keys written")
            self.next = time.monotonic() + PROGRESS_EVERY_S


def _gate(output: Path, metadata: Metadata, accept_drift: str | None,
          progress: Callable[[str], None]) -> None:
    """Refuse an output whose validation verdict failed — the latest ``featureline validate``
    recorded, else the run's — unless told why (docs/validation.md)."""
    verdict = latest_verdict(output, metadata)
    if verdict is None or verdict.passed:
        return
    breaches = [str(Breach(**breach)) for breach in verdict.breaches]
    if not accept_drift:
        raise DriftRefusedError(str(output), breaches)
    record = {"accepted_at": datetime.now(timezone.utc).isoformat(), "reason": accept_drift,
              "dataset_version": metadata.dataset_version, "breaches": verdict.breaches}
    with (output / ACCEPTED_DRIFT_FILE).open("a") as log:
        log.write(json.dumps(record) + "\n")
    progress(f"publishing despite {len(breaches)} breach(es) of the validation gate: "
             f"{accept_drift!r} (recorded in {output / ACCEPTED_DRIFT_FILE})")


def _write_tiles(online_store: OnlineStore, metadata: Metadata, project: str,
                 generation: int, progress: Callable[[str], None]) -> int:
    """The output's tiles (the aggregations' and the entity tables' groups), written into
    ``generation``: how many keys."""
    groups = metadata.tile_groups()
    if not groups:
        return 0
    written = 0
    for group in groups:
        prefix = tiles_prefix(project, generation, group.name)
        keys = 0
        for chunk in stored_tiles(metadata, group):
            online_store.write_values([prefix + tile_key(key) for key, _ in chunk],
                                      [stored for _, stored in chunk])
            keys += len(chunk)
        written += keys
        progress(f"published the tiles of {group.name}: {keys:,} keys")
    return written


def publish(repo: FeatureRepo, *, full: bool = False, end: datetime | None = None,
            progress: Callable[[str], None] = print, spark: Any = None,
            accept_drift: str | None = None) -> PublishSummary:
    """Apply the definitions, then write every feature view's latest snapshots up to ``end``
    (now) into the online store: the whole dataset when the store holds another one (or
    ``full``), else what is new since the view's last publish. With a SparkSession, Spark
    tasks write the views, each its partitions' entities. An output that failed the
    validation gate is refused before anything is written, unless ``accept_drift`` says why
    (recorded in the output's ``accepted_drift.jsonl``)."""
    started = time.perf_counter()
    end = _as_utc(end or datetime.now(timezone.utc))
    store = repo.store
    metadata = repo.definitions.metadata
    _gate(repo.definitions.output, metadata, accept_drift, progress)
    version = metadata.dataset_version
    online_store = open_online_store(repo.settings.redis_type, repo.redis_url)
    views = [view.name for view in repo.definitions.views.values()]
    online_config = store.config.online_store
    # Feast's own calls (apply, the registry) raise the Redis client's errors.
    with online_store_errors(repo.redis_url), contextlib.closing(online_store):
        online = online_store.publication(store.project)
        replace = (full or online is None or online.dataset_version != version
                   or not online.generation or online.layout != STORE_LAYOUT)
        served = online.generation if online else 0
        generation = online_store.next_generation(store.project, served) if replace else served
        summary = PublishSummary(redact(repo.redis_url), version, mode="replace" if replace
                                 else "incremental",
                                 replaced=online.dataset_version if online and replace else None,
                                 generation=generation)
        objects = repo.definitions.objects()
        store.apply(objects)
        progress(f"applied {len(objects)} Feast objects to project "
                 f"{store.project!r}")
        before: set[bytes] = set()
        old_vectors: list[bytes] = []
        old_tiles: list[bytes] = []
        if replace:
            before = online_store.project_keys(store.project)
            # The vectors and tiles of the served generation, and any a killed replace left:
            # dropped after the switch (a stream processor's write into the old generation
            # after this scan, at the next replace).
            old_vectors = [key for key in before if key.startswith(VECTOR_PREFIX.encode())]
            before.difference_update(old_vectors)
            old_tiles = sorted(online_store.keys_under(tiles_prefix(store.project)))
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
                                          start, end, repo.settings.redis_type, repo.redis_url,
                                          keys_needed=bool(before), generation=generation)
            else:
                rows = latest_snapshots(snapshots, table.join_key,
                                        table.timestamp_field, start, end)
                result = online_store.write_view(rows, layout,
                                                 _Progress(view.name, rows.num_rows, progress),
                                                 keep_keys=bool(before),
                                                 generation=generation)
            store.registry.apply_materialization(registered, store.project, start, end)
            written |= result.written_keys
            changed += result.changed
            done = ViewPublished(view.name, start, end, result.keys,
                                 time.perf_counter() - view_started)
            progress(f"published {view.name}: {result.keys:,} keys from "
                     f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} in {done.seconds:.1f}s")
            summary.views.append(done)
        if replace:
            summary.tile_keys = _write_tiles(online_store, metadata, store.project, generation,
                                             progress)
            stale = online_store.holding(sorted(before - written), views)
            online_store.delete(stale)
            summary.keys_removed = len(stale)
            summary.keys_changed = changed
        # The switch: readers read the new generation from their next read on.
        online_store.write_publication(store.project, Publication.of(
            metadata, str(repo.definitions.output), datetime.now(timezone.utc).isoformat(),
            generation))
        if replace:
            online_store.delete(old_vectors + old_tiles)
            summary.vectors_removed = len(old_vectors)
    summary.seconds = time.perf_counter() - started
    progress(f"online store holds dataset {version}: {summary.keys:,} keys written, "
             f"{summary.keys_changed if summary.keys_changed is not None else 'n/a'} changed, "
             f"{summary.keys_removed:,} removed")
    return summary
