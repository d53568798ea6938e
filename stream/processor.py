"""``featureline stream``: pushed events from the event log → the entity features the batch
computes, written into the online store in Feast's layout (docs/ARCHITECTURE.md, "Fresh
features").

Each entity (user, item) gets the batch's features — its table's group of the aggregations
engine (``core.aggregations.entity_group``: ``<e>_events``, ``<e>_events_<N>d``,
``<e>_positives``, ``<e>_positive_rate``) — and its encoded id. The stream keeps them the way
it keeps every group's: each accepted event is added once to its keys' tiles in the served
generation of the online store (``stream/tiles.py``; an exact duplicate — every typed column
equal, as the ETL defines it — counts once, also when the log delivers it again), and an
entity's row is then the engine's value from its tiles at the midnight after its latest
event — the time the batch's latest snapshot of it would be stamped, so the N-day window is
the N calendar days ending with that event's day, as in the tables.

The tiles are written, then the rows, then the event is committed to the log, so a processor
killed at any point re-reads the event and changes nothing twice. Where two processors of a
group write one item at once, each reads the item's tiles again after writing its row and
writes again when they moved. Only events at or after the output's cut (``tiles.cut_us``, just
after its latest event) are streamed: an earlier one is left to the next batch run, which
reads it from the archive.

Accepted events are also archived in the raw log's schema (JSONL, one file per processor
and hour of arrival under ``stream.archive``, published when the hour is over) for the next
batch run. A publication with a new cut moves every streamed key to the new tiles (the events
before the new cut dropped: the batch holds them) and writes again the rows of the entities
whose streamed events are newer than the cut, so a publish never erases them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from featureline.core import redis
from featureline.core.aggregations import (
    ENTITIES,
    AggregateFeature,
    value_from_tiles,
)
from featureline.core.events import (
    EventContract,
    event_digest,
    labeler,
    micros_of,
    parse_timestamp,
)
from featureline.core.metadata import (
    EVENT_TIMESTAMP,
    OOV_ID,
    Metadata,
    encoded_name,
    present,
    read_metadata,
)
from featureline.core.time_rule import next_midnight
from featureline.feature_store.online_store import OnlineStore, open_online_store
from featureline.feature_store.repo import open_repo
from featureline.feature_store.settings import FeatureStoreConfig
from featureline.feature_store.tiles import KeyTiles, decode_key_tiles, tile_key, tiles_prefix
from featureline.feature_store.writer import Layout
from featureline.stream.log import Delivered, EventLog, open_event_log, written_topic
from featureline.stream.metrics import StreamMetrics
from featureline.stream.settings import StreamConfig
from featureline.stream.tiles import KeyState, StreamTiles

logger = logging.getLogger("featureline.stream")


def times_path(events_file: Path) -> Path:
    """The file of an archive file's batch times: one line per batch, ``count started
    finished`` (hidden: the ETL reads the archive folder and skips it)."""
    return events_file.with_name(f".{events_file.name.lstrip('.')}.times")


def encoded_ids(metadata: Metadata, entity: str) -> dict[str, int]:
    """Each id of the entity's vocabulary (as text) and its encoded id, as the entity table
    holds it (none: the output has no vocabulary of the key)."""
    vocabulary = metadata.vocabularies.get(metadata.entities[entity].join_key)
    if vocabulary is None:
        return {}
    rows = ds.dataset((metadata.folder or Path(".")) / vocabulary.path,
                      format="parquet").to_table(columns=["value", "id"])
    ids = pc.cast(rows["value"], pa.string()).to_pylist()
    return dict(zip(ids, rows["id"].to_pylist(), strict=True))


def entity_values(features: dict[str, AggregateFeature], stored: bytes | None,
                  tiles: dict[str, KeyTiles] | None = None
                  ) -> tuple[dict[str, Any], int] | None:
    """An entity's values from its stored tiles (``tiles``: them decoded, where the caller
    has them) and their time (µs): the midnight after its latest event, whose day its latest
    tile of a windowed output starts (the hops divide a day); None without such a tile."""
    if tiles is None:
        tiles = decode_key_tiles(features, stored) if stored else {}
    starts = [start for output, by_tile in tiles.items()
              if features[output].window.hop is not None for start in by_tile]
    if not starts:
        return None
    t = next_midnight(max(starts))
    return {output: value_from_tiles(feature.operation(), feature.window,
                                     tiles.get(output, {}), t)
            for output, feature in features.items()}, t


class StreamProcessor:
    """Reads the log, adds each event once to its keys' tiles, writes the entities' rows,
    archives the events, commits."""

    def __init__(self, log: EventLog, store: OnlineStore, state_url: str, project: str,
                 metadata: Metadata, contract: EventContract, layouts: dict[str, Layout],
                 archive: Path, consumer: str | None = None, read_batch: int = 500,
                 metrics: StreamMetrics | None = None, cluster: bool = False) -> None:
        self.log, self.store, self.project = log, store, project
        self.client = redis.client(state_url, cluster=cluster)
        self.cluster = cluster
        self.label = labeler(contract)
        self.metadata, self.contract, self.layouts = metadata, contract, layouts
        self.archive = archive
        self.consumer = consumer or f"{socket.gethostname()}:{os.getpid()}"
        self.read_batch = read_batch
        self.stamp: str | None = None
        self.generation: int | None = None  # of the entity vectors the stamp names
        # Per entity: its group's outputs by name, and each id's encoded id.
        self.entity_features: dict[str, dict[str, AggregateFeature]] = {}
        self.encoded: dict[str, dict[str, int]] = {}
        self.processed = 0
        self.metrics = metrics or StreamMetrics()
        self.tiles = StreamTiles(self.client, project, contract, cluster)
        self._stop = threading.Event()

    def refresh_base(self) -> bool:
        """Serve the store's publication when it changed; True if it did (then every
        streamed key moves to its tiles, and the rows of the entities with events after its
        cut are written again over the batch's)."""
        publication = self.store.publication(self.project)
        stamp = publication.published_at if publication else None
        if stamp == self.stamp:
            return False
        self.stamp = stamp
        self.generation = publication.generation if publication else None
        # The output's spec, cut and ids, read again as its tables are.
        metadata = read_metadata(self.metadata.folder or ".")
        info = present(metadata.tiles, metadata, "tiles")
        groups = metadata.tile_groups()
        self.entity_features = {group.name: {f.output: f for f in group.outputs()}
                                for group in groups if group.name in ENTITIES}
        self.encoded = {entity: encoded_ids(metadata, entity) for entity in self.entity_features}
        moved = self.tiles.serve(groups, self.generation, info.cut_us)
        for entity in self.entity_features:
            if moved.get(entity):
                self._write(entity, {key[0]: state for key, state in moved[entity].items()})
        return True

    def process(self, delivered: Sequence[Delivered]) -> int:
        """Apply, write, archive, commit one batch; how many events it held."""
        if not delivered:
            return 0
        started = time.time()
        lines = [line for record in delivered for line in record.payload.split(b"\n")]
        aggregated = []  # (digest, ts µs, label, event) for the tiles
        for line in lines:
            event = orjson.loads(line)
            moment = parse_timestamp(event["ts"], "auto")
            if moment is not None:
                aggregated.append((event_digest(line), micros_of(moment), self.label(event),
                                   event))
        # Every key of the events gets its row, also where the tiles held them all already
        # (a processor killed before writing the row).
        states = self.tiles.add(aggregated)
        for entity in self.entity_features:
            if states.get(entity):
                self._write(entity, {key[0]: state for key, state in states[entity].items()})
        servable = time.time()
        self.metrics.observe([servable - record.accepted_at for record in delivered],
                             len(lines))
        self._archive(lines, started, servable)
        self.log.commit(delivered)
        self.processed += len(lines)
        return len(lines)

    def _write(self, entity: str, values: dict[str, KeyState]) -> None:
        """Compute and write the rows of the entities ``values`` (ids as text) from their
        tiles, as the write that added their events left them; again for those whose tiles
        moved meanwhile (another processor of the group added events of theirs)."""
        if not self.generation:
            return
        layout = self.layouts[entity]
        features = self.entity_features[entity]
        key = ENTITIES[entity]
        prefix = tiles_prefix(self.project, self.generation, entity)
        encoded = self.encoded.get(entity, {})
        pending = list(values.items())
        while pending:
            columns: dict[str, list[Any]] = {}
            for value, state in pending:
                computed = entity_values(features, state.stored, state.tiles)
                if computed is None:
                    continue
                row, t = computed
                row[key] = self._typed(entity, value)
                row[encoded_name(key)] = encoded.get(value, OOV_ID)
                row[EVENT_TIMESTAMP] = t
                for name, feature in row.items():
                    columns.setdefault(name, []).append(feature)
            if columns:
                columns[EVENT_TIMESTAMP] = pa.array(columns[EVENT_TIMESTAMP], pa.int64()).cast(
                    pa.timestamp("us", tz="UTC")).cast(pa.timestamp("s", tz="UTC"))
                table = pa.table(columns).select(
                    [layout.join_key, layout.timestamp_field, *(n for n, _ in layout.features)])
                self.store.write_view(table, layout, keep_keys=False, compare=False,
                                      generation=self.generation)
                self.store.announce(written_topic(self.project), orjson.dumps(
                    [[layout.view, value] for value in columns[key]]))
            names = [prefix + tile_key([value]) for value, _ in pending]
            # A cluster's MGET takes one slot: redis-py's splits it by slot.
            now = self.client.mget_nonatomic(names) if self.cluster else self.client.mget(names)
            pending = [(value, KeyState(after, None, False))
                       for (value, state), after in zip(pending, now, strict=True)
                       if state.stored != after]

    def _typed(self, entity: str, value: str) -> Any:
        dtype = self.metadata.entities[entity].join_key_dtype
        return int(value) if dtype in ("bigint", "int", "long") else value

    def _archive(self, lines: list[bytes], started: float, finished: float) -> None:
        """The events in the raw log's schema, appended to this processor's file of the
        hour (whole lines, on disk before the events are committed). The file is hidden
        (``.events-…``, which Spark skips) until its hour is over: :meth:`seal_archive`.
        Beside it, always hidden, the batch's size and when applying it started and
        finished, for ``featureline consistency`` (stream/expected.py)."""
        hour = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H")
        self.archive.mkdir(parents=True, exist_ok=True)
        path = self.archive / f".{self._archive_name(hour)}"
        for target, data in ((path, b"\n".join(lines) + b"\n"), (times_path(path), (
                f"{len(lines)} {started:.6f} {finished:.6f}\n").encode())):
            with target.open("ab") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())

    def _archive_name(self, hour: str) -> str:
        return f"events-{hour}-{self.consumer.replace(':', '_').replace('/', '_')}.jsonl"

    def seal_archive(self, everything: bool = False) -> list[Path]:
        """Publish this processor's archive files of the hours that are over (``everything``:
        the current one too), so the next ETL run reads them; the files published."""
        if not self.archive.is_dir():
            return []
        current = f".{self._archive_name(datetime.now(timezone.utc).strftime('%Y-%m-%dT%H'))}"
        suffix = f"-{self._archive_name('')[len('events--'):]}"
        sealed = []
        for path in sorted(self.archive.glob(".events-*.jsonl")):
            if path.name.endswith(suffix) and (everything or path.name != current):
                target = path.with_name(path.name[1:])
                path.rename(target)
                sealed.append(target)
        return sealed

    def run(self, block_s: float = 1.0, orphaned: Callable[[], bool] | None = None) -> None:
        """Process until :meth:`stop` (or until ``orphaned`` says so)."""
        while not self._stop.is_set() and not (orphaned is not None and orphaned()):
            self.refresh_base()
            self.process(self.log.read(self.consumer, self.read_batch, block_s))
            self.seal_archive()
        self.seal_archive(everything=True)

    def stop(self) -> None:
        self._stop.set()



def open_processor(stream: StreamConfig, feature_store: FeatureStoreConfig, output: str | Path,
                   url: str | None = None, consumer: str | None = None) -> StreamProcessor:
    """A processor of the log ``stream`` configures, writing the features of the ETL output
    ``output`` into the feature store's online store (``url``: else REDIS_URL or the
    embedded server)."""
    repo = open_repo(feature_store, output, url=url)
    metadata = repo.definitions.metadata
    contract = present(metadata.events, metadata, "events")
    store = repo.store
    layouts = {entity: Layout.of(view, metadata.entities[entity].join_key,
                                 repo.definitions.entities[entity].value_type, store.project,
                                 store.config.entity_key_serialization_version,
                                 getattr(store.config.online_store, "key_ttl_seconds", None))
               for entity, view in repo.definitions.views.items()}
    cluster = feature_store.cluster
    return StreamProcessor(open_event_log(stream, repo.redis_url, cluster),
                           open_online_store(feature_store.redis_type, repo.redis_url),
                           repo.redis_url, store.project, metadata, contract, layouts,
                           Path(stream.archive), consumer, stream.read_batch, cluster=cluster)
