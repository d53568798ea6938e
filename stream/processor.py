"""``featureline stream``: pushed events from the event log → the entity features the batch
computes, written into the online store in Feast's layout (docs/ARCHITECTURE.md, "Fresh
features").

Each entity (user, item) gets the batch's features — ``<e>_events``, ``<e>_events_<N>d``,
``<e>_positives``, ``<e>_positive_rate`` and its encoded id — from two parts:

- the **batch base**: what the served ETL output's snapshots say up to the batch cut (the
  latest snapshot time published): each entity's totals and its daily counts of the last N
  days before the cut (a snapshot at D holds the totals of the days before D, so a day's
  count is the difference of two snapshots);
- the **streamed days**: per entity, per UTC day, the events and positives streamed since
  the batch, kept in Redis beside the online store, with the digest of every event counted
  (an exact duplicate — every typed column equal, as the ETL defines it — counts once, also
  when the log delivers it again).

The window is the batch's: the N calendar days (UTC) ending with the entity's latest event
day, the days a snapshot stamped the day after would cover. Updating an entity's days and
digests is one Lua script (atomic); the features are then written, then the event is
committed to the log, so a processor killed at any point re-reads the event and changes
nothing twice. Where two processors of a group write one item at once, each re-reads the
entity's version after writing and writes again when it moved.

Where the output has an aggregations spec, each accepted event is also added to its keys'
tiles in the online store, once (``stream/tiles.py``), before the commit.

Accepted events are also archived in the raw log's schema (JSONL, one file per processor
and hour of arrival under ``stream.archive``, published when the hour is over) for the next
batch run. A publication with a new cut
reloads the base, drops the streamed days before the cut (the batch read them from the
archive) and rewrites every streamed entity, so a publish never erases streamed events
newer than its cut.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from featureline.core import redis
from featureline.core.aggregations import ENTITIES
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
from featureline.feature_store.online_store import OnlineStore, open_online_store
from featureline.feature_store.repo import open_repo
from featureline.feature_store.settings import FeatureStoreConfig
from featureline.feature_store.writer import Layout
from featureline.stream.log import Delivered, EventLog, open_event_log, written_topic
from featureline.stream.metrics import StreamMetrics
from featureline.stream.settings import StreamConfig
from featureline.stream.tiles import StreamTiles

logger = logging.getLogger("featureline.stream")

DAY_S = 86_400
# Events per COUNT_ONCE call: Redis serves other clients between two calls.
SCRIPT_EVENTS = 1000
# Adds a batch of events to their user's and item's streamed days, each event once: the
# script runs whole, so one digest per event guards both entities' counts. KEYS: per event,
# the digests of its user and day (a set), its user's days, its item's days (hashes:
# "n:<day>" events, "p:<day>" positives, "version"). ARGV: per event, its digest, day and
# label.
COUNT_ONCE = """
local adds, order = {}, {}
for i = 1, #KEYS, 3 do
  local at = (i - 1) / 3 * 3
  if redis.call('SADD', KEYS[i], ARGV[at + 1]) == 1 then
    local day, positive = ARGV[at + 2], tonumber(ARGV[at + 3])
    for k = i + 1, i + 2 do
      local days = KEYS[k]
      if not adds[days] then
        adds[days] = {}
        order[#order + 1] = days
      end
      local counts = adds[days][day] or {0, 0}
      counts[1] = counts[1] + 1
      counts[2] = counts[2] + positive
      adds[days][day] = counts
    end
  end
end
for _, days in ipairs(order) do
  for day, counts in pairs(adds[days]) do
    redis.call('HINCRBY', days, 'n:' .. day, counts[1])
    if counts[2] > 0 then redis.call('HINCRBY', days, 'p:' .. day, counts[2]) end
  end
  redis.call('HINCRBY', days, 'version', 1)
end
return #order
"""
# The days of each key (KEYS): per key, its HGETALL.
READ_DAYS = """
local result = {}
for j = 1, #KEYS do result[j] = redis.call('HGETALL', KEYS[j]) end
return result
"""
# The version of each key's days (KEYS).
VERSIONS = """
local result = {}
for j = 1, #KEYS do result[j] = redis.call('HGET', KEYS[j], 'version') or '0' end
return result
"""


def times_path(events_file: Path) -> Path:
    """The file of an archive file's batch times: one line per batch, ``count started
    finished`` (hidden: the ETL reads the archive folder and skips it)."""
    return events_file.with_name(f".{events_file.name.lstrip('.')}.times")


def day_of(moment: datetime) -> int:
    """Days since 1970-01-01 (UTC)."""
    return int(moment.timestamp() // DAY_S)


@dataclass
class Base:
    """One entity's batch values at the cut."""

    events: int = 0
    positives: int = 0
    encoded: int = OOV_ID
    days: dict[int, tuple[int, int]] = field(default_factory=dict)  # day → events, positives


@dataclass
class BatchBase:
    """Every entity's batch values at the cut (``cut``: the latest snapshot time published,
    None when no snapshot is)."""

    cut: datetime | None
    entities: dict[str, dict[Any, Base]]

    @property
    def cut_day(self) -> int:
        return day_of(self.cut) if self.cut is not None else -(2**31)

    @classmethod
    def load(cls, metadata: Metadata, end: datetime, recent_days: int) -> BatchBase:
        """The base from the output's entity tables, up to ``end`` (the publish time)."""
        folder = metadata.folder or Path(".")
        tables = {}
        cuts = []
        for entity, table in metadata.entities.items():
            path = folder / table.path
            stamp = ds.field(table.timestamp_field)
            limit = end.astimezone(timezone.utc).replace(tzinfo=None)
            rows = ds.dataset(path, format="parquet").to_table(filter=stamp <= limit)
            tables[entity] = rows
            if rows.num_rows:
                cuts.append(pc.max(rows[table.timestamp_field]).as_py())
        cut = max(cuts).replace(tzinfo=timezone.utc) if cuts else None
        entities = {entity: _bases(rows, metadata.entities[entity].join_key, entity,
                                   metadata.entities[entity].timestamp_field,
                                   day_of(cut) - recent_days if cut else 0)
                    for entity, rows in tables.items()}
        return cls(cut, entities)


def _bases(rows: pa.Table, key: str, entity: str, timestamp: str, first_day: int
           ) -> dict[Any, Base]:
    """Per entity: the latest snapshot's totals and encoded id, and the daily counts of the
    days from ``first_day`` on (differences of consecutive snapshots)."""
    if rows.num_rows == 0:
        return {}
    rows = rows.take(pc.sort_indices(rows, [(key, "ascending"), (timestamp, "ascending")]))
    keys = rows[key].to_pylist()
    days = (rows[timestamp].cast(pa.timestamp("s")).cast(pa.int64()).to_numpy() // DAY_S) - 1
    events = rows[f"{entity}_events"].to_numpy(zero_copy_only=False).astype(np.int64)
    positives = rows[f"{entity}_positives"].to_numpy(zero_copy_only=False).astype(np.int64)
    cat = encoded_name(key)
    encoded = rows[cat].to_pylist() if cat in rows.column_names else [OOV_ID] * len(keys)
    bases: dict[Any, Base] = {}
    previous = None
    for i, value in enumerate(keys):
        if value != previous:
            base = bases[value] = Base()
            before = (0, 0)
        day_events, day_positives = int(events[i] - before[0]), int(positives[i] - before[1])
        if days[i] >= first_day:
            base.days[int(days[i])] = (day_events, day_positives)
        base.events, base.positives, base.encoded = int(events[i]), int(positives[i]), encoded[i]
        before, previous = (events[i], positives[i]), value
    return bases


def features(entity: str, base: Base, streamed: dict[int, tuple[int, int]],
             recent_days: int) -> dict[str, Any]:
    """The entity's features from its batch base and its streamed days."""
    days = dict(base.days)
    for day, (n, p) in streamed.items():
        before = days.get(day, (0, 0))
        days[day] = (before[0] + n, before[1] + p)
    last = max(days) if days else 0
    events = base.events + sum(n for n, _ in streamed.values())
    positives = base.positives + sum(p for _, p in streamed.values())
    recent = sum(n for day, (n, _) in days.items() if last - recent_days < day <= last)
    return {f"{entity}_events": events, f"{entity}_events_{recent_days}d": recent,
            f"{entity}_positives": positives,
            f"{entity}_positive_rate": positives / events if events else None}


def _pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    """An HGETALL reply as a Lua script returns it (field, value, …) as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _parse_days(stored: dict[bytes, bytes]) -> tuple[dict[int, tuple[int, int]], int]:
    """An entity's streamed days (day → events, positives) and their version."""
    events: dict[int, int] = {}
    positives: dict[int, int] = {}
    version = 0
    for name, value in stored.items():
        if name == b"version":
            version = int(value)
        elif name[:2] == b"n:":
            events[int(name[2:])] = int(value)
        else:
            positives[int(name[2:])] = int(value)
    return {day: (n, positives.get(day, 0)) for day, n in events.items()}, version


class StreamProcessor:
    """Reads the log, counts each event once per entity, writes the features, archives the
    events, commits."""

    def __init__(self, log: EventLog, store: OnlineStore, state_url: str, project: str,
                 metadata: Metadata, contract: EventContract, layouts: dict[str, Layout],
                 archive: Path, consumer: str | None = None, read_batch: int = 500,
                 metrics: StreamMetrics | None = None) -> None:
        self.log, self.store, self.project = log, store, project
        self.client = redis.client(state_url)
        self.count_once = self.client.register_script(COUNT_ONCE)
        self.label = labeler(contract)
        self._days_of: dict[str, int] = {}
        self.read_days = self.client.register_script(READ_DAYS)
        self.versions = self.client.register_script(VERSIONS)
        self.metadata, self.contract, self.layouts = metadata, contract, layouts
        self.archive = archive
        self.consumer = consumer or f"{socket.gethostname()}:{os.getpid()}"
        self.read_batch = read_batch
        self.stamp: str | None = None
        self.generation: int | None = None  # of the entity vectors the stamp names
        self.base = BatchBase(None, {})
        self.processed = 0
        self.metrics = metrics or StreamMetrics()
        self.tiles = StreamTiles(self.client, project, contract)
        self._stop = threading.Event()

    def _key(self, entity: str, value: Any, part: str) -> str:
        """The Redis key of one entity's streamed ``days``."""
        return f"{self._prefix(entity, part)}{value}"

    def _days_keys(self, entity: str, values: Sequence[Any]) -> list[str]:
        return [self._key(entity, value, "days") for value in values]

    def _prefix(self, entity: str, part: str) -> str:
        return f"featureline:stream:{self.project}:{entity}:{part}:"

    def _seen_key(self, user: Any, day: int) -> str:
        """The digests of a user's events of one day (dropped with the day at a new cut)."""
        return f"featureline:stream:{self.project}:seen:{day}:{user}"

    def refresh_base(self) -> bool:
        """Reload the batch base when the store's publication changed; True if it did (then
        the streamed days the new batch holds are dropped, and every streamed entity is
        written again over the new batch values)."""
        publication = self.store.publication(self.project)
        stamp = publication.published_at if publication else None
        if stamp == self.stamp:
            return False
        end = datetime.fromisoformat(stamp) if stamp else datetime.now(timezone.utc)
        self.base = BatchBase.load(self.metadata, end, self.contract.recent_days)
        self.stamp = stamp
        self.generation = publication.generation if publication else None
        # The aggregations' spec and cut of the output, read again as its tables are.
        tiles = read_metadata(self.metadata.folder or ".").tiles
        if tiles is not None:
            self.tiles.serve(tiles.groups, self.generation, tiles.cut_us)
        # The cut the streamed days are kept against: the first processor to see a new one
        # drops the days before it.
        previous = self.client.getset(f"featureline:stream:{self.project}:cut",
                                      self.base.cut_day)
        prune = previous is not None and int(previous) != self.base.cut_day
        if prune:
            self._prune(self.base.cut_day)
        for entity in ENTITIES:
            prefix = self._prefix(entity, "days")
            values = [key.decode()[len(prefix):]
                      for key in self.client.scan_iter(match=f"{prefix}*", count=1000)]
            if values:
                self._write(entity, [self._typed(entity, v) for v in values])
        return True

    def _prune(self, cut_day: int) -> None:
        """Drop the streamed days before ``cut_day`` and their digests."""
        for entity in ENTITIES:
            for key in self.client.scan_iter(match=f"{self._prefix(entity, 'days')}*",
                                             count=1000):
                old = [field for field in self.client.hkeys(key)
                       if field[:2] in (b"n:", b"p:") and int(field[2:]) < cut_day]
                if old:
                    self.client.hdel(key, *old)
                    self.client.hincrby(key, "version", 1)
        prefix = f"featureline:stream:{self.project}:seen:"
        for key in self.client.scan_iter(match=f"{prefix}*", count=1000):
            if int(key.decode()[len(prefix):].split(":", 1)[0]) < cut_day:
                self.client.delete(key)

    def _typed(self, entity: str, value: str) -> Any:
        dtype = self.metadata.entities[entity].join_key_dtype
        return int(value) if dtype in ("bigint", "int", "long") else value

    def process(self, delivered: Sequence[Delivered]) -> int:
        """Apply, write, archive, commit one batch; how many events it held."""
        if not delivered:
            return 0
        started = time.time()
        lines = [line for record in delivered for line in record.payload.split(b"\n")]
        prefixes = [self._prefix(entity, "days") for entity in ENTITIES]
        keys: list[str] = []
        args: list[Any] = []
        users, items = [], []
        aggregated = []  # (digest, ts µs, label, event) for the aggregations' tiles
        for line in lines:
            event = orjson.loads(line)
            user, item = event["user_id"], event["item_id"]
            day = self._day(event["ts"])
            digest, label = event_digest(line), self.label(event)
            keys += (self._seen_key(user, day), f"{prefixes[0]}{user}", f"{prefixes[1]}{item}")
            args += (digest, day, label)
            users.append(user)
            items.append(item)
            if self.tiles.groups:
                moment = parse_timestamp(event["ts"], "auto")
                if moment is not None:
                    aggregated.append((digest, micros_of(moment), label, event))
        touched = {"user": list(dict.fromkeys(users)), "item": list(dict.fromkeys(items))}
        pipe = self.client.pipeline(transaction=False)
        for low in range(0, 3 * len(lines), 3 * SCRIPT_EVENTS):
            self.count_once(keys=keys[low:low + 3 * SCRIPT_EVENTS],
                            args=args[low:low + 3 * SCRIPT_EVENTS], client=pipe)
        for entity, values in touched.items():
            self.read_days(keys=self._days_keys(entity, values), client=pipe)
        replies = pipe.execute()[-len(touched):]
        for (entity, values), stored in zip(touched.items(), replies, strict=True):
            self._write(entity, {value: _pairs(reply)
                                 for value, reply in zip(values, stored, strict=True)})
        self.tiles.add(aggregated)
        servable = time.time()
        self.metrics.observe([servable - record.accepted_at for record in delivered],
                             len(lines))
        self._archive(lines, started, servable)
        self.log.commit(delivered)
        self.processed += len(lines)
        return len(lines)

    def _day(self, ts: str) -> int:
        """The UTC day of an event line's ``ts`` (ISO-8601 in UTC, ``YYYY-MM-DD…``)."""
        date = ts[:10]
        day = self._days_of.get(date)
        if day is None:
            day = self._days_of[date] = day_of(datetime.fromisoformat(date).replace(
                tzinfo=timezone.utc))
        return day

    def _write(self, entity: str, stored: dict[Any, dict[bytes, bytes]] | list[Any]) -> None:
        """Compute and write the features of the entities ``stored`` (id → its days, as
        read; or ids, read here); again for those whose streamed days moved meanwhile
        (another processor of the group counted events of theirs)."""
        if isinstance(stored, list):
            stored = self._days(entity, stored)
        layout = self.layouts[entity]
        bases = self.base.entities.get(entity, {})
        empty = Base()
        while stored:
            versions: dict[Any, int] = {}
            columns: dict[str, list[Any]] = {}
            for value, reply in stored.items():
                days, versions[value] = _parse_days(reply)
                base = bases.get(value, empty)
                row = features(entity, base, days, self.contract.recent_days)
                row[ENTITIES[entity]] = value
                row[encoded_name(ENTITIES[entity])] = base.encoded
                row[EVENT_TIMESTAMP] = (max([*days, *base.days, self.base.cut_day - 1]) + 1) * DAY_S
                for name, feature in row.items():
                    columns.setdefault(name, []).append(feature)
            columns[EVENT_TIMESTAMP] = pa.array(columns[EVENT_TIMESTAMP], pa.int64()).cast(
                pa.timestamp("s", tz="UTC"))
            table = pa.table(columns).select(
                [layout.join_key, layout.timestamp_field, *(n for n, _ in layout.features)])
            self.store.write_view(table, layout, keep_keys=False, compare=False,
                                  generation=self.generation)
            self.store.announce(written_topic(self.project), orjson.dumps(
                [[layout.view, value] for value in stored]))
            values = list(stored)
            now = self.versions(keys=self._days_keys(entity, values))
            moved = [v for v, version in zip(values, now, strict=True)
                     if int(version) != versions[v]]
            stored = self._days(entity, moved) if moved else {}

    def _days(self, entity: str, values: list[Any]) -> dict[Any, dict[bytes, bytes]]:
        replies = self.read_days(keys=self._days_keys(entity, values))
        return {value: _pairs(reply) for value, reply in zip(values, replies, strict=True)}

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
    return StreamProcessor(open_event_log(stream, repo.redis_url),
                           open_online_store(feature_store.redis_type, repo.redis_url),
                           repo.redis_url, store.project, metadata, contract, layouts,
                           Path(stream.archive), consumer, stream.read_batch)
