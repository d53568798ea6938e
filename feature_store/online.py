"""Online feature reads, one key per entity and view, in one round trip to the online store
(``feature_store/online_store.py``).

``featureline publish`` writes every entity twice: in Feast's layout (one hash per entity,
one protobuf per feature), which Feast's SDK reads, and as one *entity vector* per view (a
JSON array of the view's timestamp and values), which this reader reads: one MGET, a few µs
of decoding per entity where the hash costs a protobuf per feature. The vectors belong to a
generation that the publication stamp names; the stamp is read in the same round trip, after
the values, and a read whose generation is no longer the served one is read again in the new
one — so an answer never mixes two datasets (docs/ARCHITECTURE.md, "Publishing").
The keys are Feast's (``_redis_key``), the values those Feast's SDK returns (tested). On
top, each value gets a status: present, not found, or outside the view's ttl.

Aggregations (``<group>:<feature>``) are read the same way: a key's tiles, one string of
the served generation, fetched in the same MGET and merged at the request time
(``feature_store/tiles.py``; docs/ARCHITECTURE.md, "Features as definitions"). So are an
entity view's features that are its entity group's outputs (``user_events_7d`` …): their
values are the group's at the request time, merged from the entity's tiles read beside its
vector — an idle entity's windowed counts decay — while the view's other features, its
timestamp and each value's status are the vector's.

With a :class:`ValueCache`, entities read recently are answered from memory for at most its
``ttl_s`` seconds, and never across a publish: every read fetches the publication stamp in the
same round trip, and a new stamp empties the cache (docs/ARCHITECTURE.md, "Version stamps").

It implements Feast's Redis layout as Feast 0.67 writes it with the repository's settings;
a Feast setting that changes the layout and that it does not implement (online feature-view
versioning) stops it at start, naming the setting, instead of reading the wrong fields.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import orjson
from feast import FeatureStore
from feast.infra.online_stores.helpers import _redis_key
from feast.protos.feast.types.EntityKey_pb2 import EntityKey
from feast.protos.feast.types.Value_pb2 import Value
from feast.type_map import feast_value_type_to_python_type, python_values_to_proto_values
from feast.value_type import ValueType

from featureline.core.aggregations import AggregateFeature, GroupSpec, value_from_tiles
from featureline.core.errors import ConfigError, NotFoundError, UnprocessableError
from featureline.feature_store.errors import (
    FeatureStoreError,
    OnlineStoreEmptyError,
    OnlineStoreUnavailableError,
    UnknownFeatureServiceError,
)
from featureline.feature_store.online_store import OnlineStore, open_online_store
from featureline.feature_store.publication import Publication
from featureline.feature_store.tiles import decode_key_tiles, tile_key, tiles_prefix
from featureline.feature_store.writer import entity_keys, vector_prefix

# Reads in a row that may find a new generation served (each a publish that replaced the
# dataset during the read before) before the reader gives up.
GENERATION_SWITCHES = 5
# The store's answer to a read: the publication stamp (published_at, generation), and the
# value at each key (``OnlineStore.read_vectors``).
Read = tuple[list[Any], list[Any]]
# Entity keys kept serialized (Feast's serializer costs ~12 µs a key); cleared when full.
KEY_CACHE_SIZE = 200_000
# Entity ids whose keys the publisher's writer assembles from their parts: their Python type,
# and the ids of that type it can take.
_ASSEMBLED_IDS: dict[ValueType, tuple[type, Callable[[Any], bool]]] = {
    ValueType.STRING: (str, lambda _: True),
    ValueType.INT64: (int, lambda value: -(2**63) <= value < 2**63)}


def _feast_keys(project: str, join_key: str, value_type: ValueType, version: int,
                values: list[Any]) -> list[bytes]:
    """Redis keys of single-join-key entities, made by Feast's own functions."""
    return [_redis_key(project, EntityKey(join_keys=[join_key], entity_values=[proto]), version)
            for proto in python_values_to_proto_values(values, value_type)]


class Status(str, Enum):
    PRESENT = "present"
    NOT_FOUND = "not_found"
    OUTSIDE_TTL = "outside_ttl"


class UnknownFeatureError(FeatureStoreError, NotFoundError):
    def __init__(self, reference: str, known: list[str]) -> None:
        self.reference = reference
        super().__init__(f"unknown feature {reference!r} (known: {', '.join(known)})")


class MissingEntityError(FeatureStoreError, UnprocessableError):
    """A requested feature's view needs a join key the request did not give."""

    def __init__(self, join_key: str, view: str) -> None:
        self.join_key = join_key
        super().__init__(join_key, f"entities.{join_key} is required by feature view {view!r}")


# A cached entity: (expires, its values, the view's timestamp in seconds, its entity group's
# tiles as stored: None without).
Entry = tuple[float, tuple[Any, ...], int | None, bytes | None]
# Keys whose outputs :class:`MergedTiles` keeps (a key's tiles as stored and its values: ~1 KB
# for the user group of benchmarks/aggregations.yaml, so ~50 MB a process at most); emptied
# when full.
MERGED_KEYS = 50_000


class ValueCache:
    """Decoded values of the entities read lately: ``(view, id)`` → ``(expires, values, the
    view's timestamp in seconds, its entity group's tiles as stored)``, for ``ttl_s`` seconds
    at most, while the publication they were read under is the store's (cleared when the store's
    stamp changes, or when full)."""

    def __init__(self, ttl_s: float, max_entities: int) -> None:
        self.ttl_s = ttl_s
        self.max_entities = max_entities
        # (publication stamp, entries): swapped whole, so a reader holds a consistent pair.
        self.state: tuple[tuple[bytes, bytes] | None, dict[tuple[str, Any], Entry]] = (None, {})
        self.hits = 0
        self.misses = 0

    def evict(self, entries: list[tuple[str, Any]]) -> None:
        """Forget ``(view, id)`` entries: the stream processor rewrote them."""
        cached = self.state[1]
        for entry in entries:
            cached.pop(entry, None)


class MergedTiles:
    """Each key's outputs merged from its tiles at a request time, kept while they cannot
    change: for the same bytes of tiles and until the first time a window's start or the
    tiles it takes move (``Window.constant_until``: the end of the shortest hop at most). A
    key read again meanwhile costs a comparison of its bytes instead of decoding them and
    merging each output — the same values (docs/ARCHITECTURE.md, "Features as
    definitions")."""

    def __init__(self, max_keys: int = MERGED_KEYS) -> None:
        self.max_keys = max_keys
        # (group, key) → (its tiles' bytes, the time merged at, the time the values hold
        # until, each output's value and whether its tiles hold the output, in the group's
        # order). Tuples of scalars: the garbage collector stops tracking them, so a full
        # memo does not lengthen its full passes (a pause on a busy server's requests).
        self.entries: dict[tuple[str, Any], tuple[bytes, int, int | None, tuple[Any, ...],
                                                  tuple[bool, ...]]] = {}

    def at(self, group: GroupLayout, key: Any, stored: bytes, t: int
           ) -> tuple[tuple[Any, ...], tuple[bool, ...]]:
        """Each output of ``group`` at ``t`` (µs) from the key's ``stored`` tiles, and whether
        they hold it, in the order of ``group.features`` (``GroupLayout.positions``)."""
        entry = self.entries.get((group.name, key))
        if (entry is not None and entry[0] == stored and entry[1] <= t
                and (entry[2] is None or t < entry[2])):
            return entry[3], entry[4]
        tiles = decode_key_tiles(group.features, stored)
        values = tuple(value_from_tiles(feature.operation(), feature.window,
                                        tiles.get(name, {}), t)
                       for name, feature in group.features.items())
        held = tuple(name in tiles for name in group.features)
        untils = [until for feature in group.features.values()
                  if (until := feature.window.constant_until(t)) is not None]
        if len(self.entries) >= self.max_keys:
            self.entries.clear()
        self.entries[(group.name, key)] = (stored, t, min(untils, default=None), values, held)
        return values, held


@dataclass(frozen=True)
class ViewLayout:
    """Where one feature view's values sit in Redis."""

    name: str
    join_key: str
    value_type: Any
    features: tuple[str, ...]
    ttl_s: float | None
    # Positions of the features of Unix timestamp type (stored as seconds, read as datetime).
    timestamps: tuple[int, ...] = ()


@dataclass
class OnlineFeatures:
    """Columnar: ``values[name][row]`` and ``status[name][row]`` for each feature name;
    ``timestamps[view][row]``: the stored row's event timestamp (Unix seconds; None when not
    found)."""

    names: list[str]
    values: dict[str, list[Any]]
    status: dict[str, list[Status]]
    timestamps: dict[str, list[int | None]] = field(default_factory=dict)
    # The request time (µs) the aggregations were merged at; None: none asked for.
    at_us: int | None = None


# Feast settings that change where or how values are stored, which this reader does not
# implement: the setting's path in feature_store.yaml → how to read it off the store's config.
UNSUPPORTED_SETTINGS = {
    "registry.enable_online_feature_view_versioning":
        lambda config: getattr(config.registry, "enable_online_feature_view_versioning", False),
}


def check_supported(store: FeatureStore) -> None:
    """Refuse a repository whose Feast settings change the layout this reader implements."""
    for key, enabled in UNSUPPORTED_SETTINGS.items():
        if enabled(store.config):
            raise ConfigError(f"feature_store.yaml: {key}", "the online reader does not "
                              "implement this Feast setting; switch it off")


@dataclass(frozen=True)
class GroupLayout:
    """An aggregation group the store holds tiles of: its keys and outputs by name."""

    name: str
    keys: tuple[str, ...]
    features: dict[str, AggregateFeature]

    @functools.cached_property
    def positions(self) -> dict[str, int]:
        """Each output's place in ``features`` (and in :class:`MergedTiles`' tuples)."""
        return {name: index for index, name in enumerate(self.features)}

    @classmethod
    def of(cls, group: GroupSpec) -> GroupLayout:
        return cls(group.name, tuple(group.keys),
                   {feature.output: feature for feature in group.outputs()})


@functools.lru_cache(maxsize=KEY_CACHE_SIZE)
def _tile_key(key: tuple[str, ...]) -> bytes:
    """``tile_key``, kept for the keys read lately (a popular item's, a user's)."""
    return tile_key(key)


def _now_us() -> int:
    return time.time_ns() // 1_000


class OnlineReader:
    def __init__(self, store: OnlineStore, project: str, key_version: int,
                 views: dict[str, ViewLayout], services: dict[str, list[str]], url: str,
                 cache: ValueCache | None = None, groups: Sequence[GroupSpec] = (),
                 entity_groups: Sequence[GroupSpec] = (),
                 clock: Callable[[], int] = _now_us) -> None:
        self.store = store
        self.cache = cache
        self.project = project
        self.key_version = key_version
        self.views = views
        self.services = services
        self.url = url
        self._keys: dict[tuple[str, Any], bytes] = {}
        self.generation = 0  # of the entity vectors last read; 0: none yet
        self.groups: dict[str, GroupLayout] = {}
        self.entity_groups: dict[str, GroupLayout] = {}
        self.merged = MergedTiles()
        self.set_groups(groups, entity_groups)
        # The request time of aggregation values (µs since the epoch).
        self.clock = clock

    def set_groups(self, groups: Sequence[GroupSpec],
                   entity_groups: Sequence[GroupSpec] = ()) -> None:
        """The aggregation groups served: the spec of the published output's tiles; and the
        entity tables' groups it has tiles of, each the features of the view keyed by its
        key."""
        self.groups = {group.name: GroupLayout.of(group) for group in groups}
        self.entity_groups = {view: GroupLayout.of(group) for group in entity_groups
                              for view, layout in self.views.items()
                              if (layout.join_key,) == tuple(group.keys)}
        self.merged = MergedTiles()  # merged by the groups' former spec

    @classmethod
    def from_store(cls, store: FeatureStore, url: str, cache: ValueCache | None = None,
                   groups: Sequence[GroupSpec] = (),
                   entity_groups: Sequence[GroupSpec] = ()) -> OnlineReader:
        """The layout of what is registered in ``store``, read through a client of ``url``."""
        check_supported(store)
        views = {}
        for view in store.list_feature_views():
            if not view.online:  # a group's snapshots: served from its tiles
                continue
            (entity,) = view.entity_columns
            views[view.name] = ViewLayout(
                name=view.name, join_key=entity.name, value_type=entity.dtype.to_value_type(),
                features=tuple(f.name for f in view.features),
                ttl_s=view.ttl.total_seconds() if view.ttl else None,
                timestamps=tuple(i for i, f in enumerate(view.features)
                                 if f.dtype.to_value_type() == ValueType.UNIX_TIMESTAMP))
        services = {service.name: [f"{p.name}:{f.name}" for p in service.feature_view_projections
                                   for f in p.features]
                    for service in store.list_feature_services()}
        kind = getattr(store.config.online_store, "redis_type", "redis")
        return cls(open_online_store(getattr(kind, "value", kind), url), store.project,
                   store.config.entity_key_serialization_version, views, services, url, cache,
                   groups, entity_groups)

    def references(self, service: str | None = None,
                   features: Sequence[str] | None = None) -> list[tuple[str, str]]:
        """``(view, feature)`` pairs of a service or of ``view:feature`` references; an
        aggregation is ``(group, feature)``, referenced as ``group:feature``."""
        if service is not None:
            if service not in self.services:
                raise UnknownFeatureServiceError(service, sorted(self.services))
            features = self.services[service]
        pairs = []
        for reference in features or []:
            view, _, name = reference.partition(":")
            group = self.groups.get(view)
            if group is not None and name in group.features:
                pairs.append((view, name))
                continue
            if view not in self.views or name not in self.views[view].features:
                known = [f"{v}:{f}" for v, layout in self.views.items() for f in layout.features]
                known += [f"{g}:{f}" for g, layout in self.groups.items()
                          for f in layout.features]
                raise UnknownFeatureError(reference, known)
            pairs.append((view, name))
        return pairs

    def group_references(self, keys: Sequence[str]) -> list[tuple[str, str]]:
        """Every aggregation of the groups keyed by exactly ``keys``."""
        return [(group.name, name) for group in self.groups.values()
                if group.keys == tuple(keys) for name in group.features]

    def _redis_keys(self, layout: ViewLayout, values: list[Any]) -> list[bytes]:
        """The Redis key of each entity id, equal to Feast's (tested). String and int64 ids
        of their type: assembled from their parts as the publisher writes them (~0.5 µs an
        id; Feast's functions spend ~7 µs). Others — and any id of the wrong type, for which
        Feast raises its error — through Feast's functions, converted in one call, their keys
        kept for the ids seen lately."""
        assembled = _ASSEMBLED_IDS.get(layout.value_type)
        if assembled is not None and self.key_version >= 3:
            id_type, fits = assembled
            if all(type(value) is id_type and fits(value) for value in values):
                return entity_keys(layout.join_key, list(values), layout.value_type,
                                   self.project, self.key_version)
        keys, join_key = self._keys, layout.join_key
        # Looked up once: requests in other threads may empty the shared cache meanwhile.
        found = [keys.get((join_key, value)) for value in values]
        missing = [i for i, key in enumerate(found) if key is None]
        if missing:
            if len(keys) + len(missing) > KEY_CACHE_SIZE:
                keys.clear()
            made = _feast_keys(self.project, join_key, layout.value_type, self.key_version,
                              [values[i] for i in missing])
            for i, key in zip(missing, made, strict=True):
                found[i] = keys[(join_key, values[i])] = key
        return found  # type: ignore[return-value]  # every None filled above

    def read(self, references: list[tuple[str, str]],
             entities: Mapping[str, Sequence[Any]], at_us: int | None = None
             ) -> OnlineFeatures:
        """Values of ``references`` for each row of ``entities`` (join key → ids, by row);
        the aggregations' at ``at_us`` (default: now)."""
        steps = self._reading(references, entities, at_us)
        try:
            keys = next(steps)
            while True:
                keys = steps.send(self.store.read_vectors(keys, self.project))
        except StopIteration as done:
            return done.value

    async def read_async(self, references: list[tuple[str, str]],
                         entities: Mapping[str, Sequence[Any]], at_us: int | None = None
                         ) -> OnlineFeatures:
        """:meth:`read` for a caller on an event loop: the store's round trips are awaited,
        so the loop serves other requests meanwhile and the caller needs no worker thread."""
        steps = self._reading(references, entities, at_us)
        try:
            keys = next(steps)
            while True:
                keys = steps.send(await self.store.read_vectors_async(keys, self.project))
        except StopIteration as done:
            return done.value

    def _reading(self, references: list[tuple[str, str]], entities: Mapping[str, Sequence[Any]],
                 at_us: int | None = None) -> Generator[list[bytes], Read, OnlineFeatures]:
        """:meth:`read` without its I/O: yields the keys of each round trip, is sent the
        store's answer (the stamp and the values: ``read_vectors``), returns the features.
        One implementation of the read for both drivers, blocking and asynchronous."""
        wanted: dict[str, list[str]] = {}
        aggregations: dict[str, list[str]] = {}
        for view, name in references:
            (aggregations if view in self.groups else wanted).setdefault(view, []).append(name)
        cache = self.cache
        stamp, entries = cache.state if cache is not None else (None, {})
        clock = time.monotonic()
        plan = []  # (layout, ids read from the store, entries found in the cache, ids by row)
        # Per value read: (is it a group's tiles, the view or group, Feast's key or the
        # group's key).
        rows: list[tuple[bool, str, bytes]] = []
        for view in wanted:
            layout = self.views[view]
            if layout.join_key not in entities:
                raise MissingEntityError(layout.join_key, view)
            ids = entities[layout.join_key]
            fetched, found = [], {}
            for value in dict.fromkeys(ids):
                entry = entries.get((view, value))
                if entry is not None and entry[0] > clock:
                    found[value] = entry
                else:
                    fetched.append(value)
            rows.extend((False, view, key) for key in self._redis_keys(layout, fetched))
            plan.append((layout, fetched, found, ids))
        # The entity groups' tiles of the ids read, after the vectors.
        for layout, fetched, _, _ in plan:
            if layout.name in self.entity_groups:
                rows.extend((True, self.entity_groups[layout.name].name,
                             tile_key([str(value)])) for value in fetched)
        vectors = len(rows)
        group_plan = []  # (group, each row's key, the distinct keys read)
        for name in aggregations:
            group = self.groups[name]
            for key in group.keys:
                if key not in entities:
                    raise MissingEntityError(key, name)
            by_row = list(zip(*(map(str, entities[key]) for key in group.keys), strict=True))
            distinct = list(dict.fromkeys(by_row))
            rows.extend((True, name, _tile_key(key)) for key in distinct)
            group_plan.append((group, by_row, distinct))
        current, answers = yield from self._vectors(rows)
        if cache is not None:
            if current != stamp:  # a publish since these entries were read: none of them
                entries = {}
                cache.state = (current, entries)
                if any(found for _, _, found, _ in plan):
                    return (yield from self._reading(references, entities, at_us))
            cache.hits += sum(len(found) for _, _, found, _ in plan)
            cache.misses += sum(len(fetched) for _, fetched, _, _ in plan)
            if len(entries) >= cache.max_entities:
                entries.clear()
        # A view's ttl counts back from the request time (a log in the past reads as then).
        now = time.time() if at_us is None else at_us / 1_000_000
        t = self.clock() if at_us is None else at_us
        result = OnlineFeatures([], {}, {})
        start = 0
        tiles_at = sum(len(fetched) for _, fetched, _, _ in plan)
        for layout, fetched, found, ids in plan:
            stored = answers[start:start + len(fetched)]
            start += len(fetched)
            entity_group = self.entity_groups.get(layout.name)
            held: list[bytes | None] = [None] * len(fetched)
            if entity_group is not None:
                held = answers[tiles_at:tiles_at + len(fetched)]
                tiles_at += len(fetched)
            for value, vector, blob in zip(fetched, stored, held, strict=True):
                found[value] = (clock + cache.ttl_s if cache else 0.0,
                                *self._decode(layout, vector), blob)
                if cache is not None:
                    entries[(layout.name, value)] = found[value]
            # Once per entity, not per feature: its stored values, and their status.
            status = {value: self._status(layout, entry[2], now) for value, entry in found.items()}
            rows = [found[value][1] for value in ids]
            row_status = [status[value] for value in ids]
            result.timestamps[layout.name] = [found[value][2] for value in ids]
            # Each row's entity group outputs at t (None: no tiles), merged once per entity when
            # a feature of the group is wanted.
            at_t: list[tuple[Any, ...] | None] | None = None
            for name in wanted[layout.name]:
                index = layout.features.index(name)
                column = [values[index] for values in rows]
                if entity_group is not None and name in entity_group.features:
                    if at_t is None:
                        by_entity = {value: None if (blob := entry[3]) is None
                                     else self.merged.at(entity_group, value, blob, t)[0]
                                     for value, entry in found.items()}
                        at_t = [by_entity[value] for value in ids]
                    # The stored value where the entity has no tiles.
                    position = entity_group.positions[name]
                    column = [value if merged is None else merged[position]
                              for merged, value in zip(at_t, column, strict=True)]
                    result.at_us = t
                state = [Status.NOT_FOUND if value is None else present
                         for value, present in zip(column, row_status, strict=True)]
                result.names.append(name)
                result.values[name] = column
                result.status[name] = state
        self._aggregate(result, group_plan, aggregations, answers[vectors:], t)
        return result

    def _aggregate(self, result: OnlineFeatures,
                   plan: list[tuple[GroupLayout, list[tuple[str, ...]], list[tuple[str, ...]]]],
                   wanted: dict[str, list[str]], answers: list[bytes | None], t: int) -> None:
        """Each wanted aggregation's value per row at the request time ``t``, merged from its
        key's tiles, as ``<group>:<feature>``; a key without tiles reads the value of no
        events, ``not_found``."""
        if wanted:
            result.at_us = t
        start = 0
        for group, by_row, distinct in plan:
            stored = answers[start:start + len(distinct)]
            start += len(distinct)
            width = len(group.features)
            present, absent = (Status.PRESENT,) * width, (Status.NOT_FOUND,) * width
            empty: tuple[Any, ...] | None = None  # the values of no events, once a request
            # Per key, every output's value and status, in the group's order.
            per_key = {}
            for key, blob in zip(distinct, stored, strict=True):
                at = None if blob is None else self.merged.at(group, key, blob, t)
                if at is not None and all(at[1]):
                    per_key[key] = (at[0], present)
                    continue
                if empty is None:
                    empty = tuple(value_from_tiles(f.operation(), f.window, {}, t)
                                  for f in group.features.values())
                if at is None:
                    per_key[key] = (empty, absent)
                else:
                    per_key[key] = (
                        tuple(v if held else e for v, held, e in zip(*at, empty, strict=True)),
                        tuple(Status.PRESENT if held else Status.NOT_FOUND for held in at[1]))
            rows = [per_key[key] for key in by_row]
            values = list(zip(*(row[0] for row in rows), strict=True)) or [()] * width
            statuses = list(zip(*(row[1] for row in rows), strict=True)) or [()] * width
            for name in wanted[group.name]:
                feature = group.features[name]
                position = group.positions[name]
                result.names.append(feature.qualified)
                result.values[feature.qualified] = list(values[position])
                result.status[feature.qualified] = list(statuses[position])

    def _vectors(self, rows: list[tuple[bool, str, bytes]]
                 ) -> Generator[list[bytes], Read, tuple[tuple[bytes, bytes], list[bytes | None]]]:
        """The publication stamp, and the vector of each ``(False, view, Feast key)`` (the
        tiles of each ``(True, group, key)``) in the generation it serves: read in the
        generation last seen, again in the new one when the stamp (read after the values)
        names another. Yields each read's keys, is sent the store's answer."""
        for _ in range(GENERATION_SWITCHES):
            generation = self.generation
            prefixes = {(tiles, name): self._prefix(generation, tiles, name)
                        for tiles, name in dict.fromkeys((tiles, name) for tiles, name, _ in rows)}
            keys = ([prefixes[(tiles, name)] + key for tiles, name, key in rows]
                    if generation else [])
            (published_at, served), vectors = yield keys
            # Without a stamp the store lost its data (or never had it): every entity would
            # read as not found. A stamp without a generation: published without vectors.
            if published_at is None or not served:
                raise OnlineStoreEmptyError(self.project)
            if int(served) == generation:
                return (published_at, served), vectors
            self.generation = int(served)
        raise OnlineStoreUnavailableError(
            self.url, f"{GENERATION_SWITCHES} publishes replaced the dataset during as many "
            "reads in a row")

    def _prefix(self, generation: int, tiles: bool, name: str) -> bytes:
        """Where a view's vectors, or a group's tiles, of ``generation`` are."""
        if tiles:
            return tiles_prefix(self.project, generation, name)
        return vector_prefix(self.project, generation, name)

    @staticmethod
    def _decode(layout: ViewLayout, vector: bytes | None
                ) -> tuple[tuple[Any, ...], int | None]:
        """The stored values of one entity, and the view's timestamp (seconds) if any.

        Tuples of scalars: the garbage collector stops tracking them, so thousands of cached
        entities do not make it run full passes (each a pause on a busy server's requests)."""
        if vector is None:
            return (None,) * len(layout.features), None
        stamp, *values = orjson.loads(vector)
        for index in layout.timestamps:
            if values[index] is not None:
                values[index] = feast_value_type_to_python_type(
                    Value(unix_timestamp_val=values[index]))
        return tuple(values), stamp

    @staticmethod
    def _status(layout: ViewLayout, seconds: int | None, now: float) -> Status:
        if seconds is not None and layout.ttl_s and now - seconds > layout.ttl_s:
            return Status.OUTSIDE_TTL
        return Status.PRESENT

    def publication(self) -> Publication | None:
        """The stamp of the dataset last published into this store (None before any)."""
        return self.store.publication(self.project)

    def ping(self) -> bool:
        return self.store.ping()
