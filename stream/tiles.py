"""The stream's executor of the aggregations: each accepted event added to its keys' tiles in
the served generation of the online store, once (docs/ARCHITECTURE.md, "Features as
definitions").

Beside a key's tiles (``feature_store/tiles.py``) the processor keeps the key's *streamed
events* — ``featureline:stream:<project>:agg:<group>:<key as JSON>``: the generation its
tiles hold them in, and per event digest what the group reads of the event (its time in µs,
its label, the columns) — every event at or after the published output's cut. A batch of
events is applied in one optimistic transaction: WATCH both keys of every key touched, read
them, add the events whose digest is new with the engine's ``add`` (``core/aggregations.py``),
write both (MULTI/EXEC; a write by another processor in between starts it again). Tiles and
digests move together, so an event delivered again — after a kill between the write and the
log's commit, or pushed twice — adds nothing.

A publish serves a new generation whose tiles are the batch's, up to a new cut: at its next
look at the publication the processor moves every streamed key to it — the events before
the new cut are dropped (the batch holds them), the others added to the new tiles — in the
same transaction, so a kill mid-way leaves each key wholly moved or not. Events older than
the served cut when they arrive (later than the batch's read of the archive) are left to
the next batch run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson
import redis as redis_py

from featureline.core.aggregations import (
    LABEL,
    AggregateFeature,
    GroupSpec,
    event_value,
    tile_start,
)
from featureline.core.events import EventContract, matcher
from featureline.feature_store.tiles import (
    KeyTiles,
    decode_key_tiles,
    encode_key_tiles,
    tile_key,
    tiles_prefix,
)

# Keys per WATCH transaction.
TRANSACTION_KEYS = 500


@dataclass(frozen=True)
class _Output:
    """One output of a group, ready for the stream: its feature and which events count."""

    feature: AggregateFeature
    filter: Any  # event → bool, or None for every event

    def keeps(self, event: Mapping[str, Any]) -> bool:
        return self.filter is None or self.filter(event)


class StreamTiles:
    """Adds streamed events to the tiles of every group of the served output's spec."""

    def __init__(self, client: redis_py.Redis, project: str, contract: EventContract) -> None:
        self.client = client
        self.project = project
        self.contract = contract
        self.groups: dict[str, GroupSpec] = {}
        self.outputs: dict[str, dict[str, _Output]] = {}
        self.columns: dict[str, set[str]] = {}
        self.generation: int | None = None
        self.cut_us = 0

    def serve(self, groups: Sequence[GroupSpec], generation: int | None, cut_us: int) -> None:
        """The spec, generation and cut of the publication served now; every streamed key
        of another generation is moved to this one."""
        self.groups = {group.name: group for group in groups}
        self.outputs = {group.name: {f.output: _Output(f, self._filter(f)) for f in
                                     group.outputs()} for group in groups}
        self.columns = {group.name: {c for f in group.features for c in f.columns()} - {LABEL}
                        for group in groups}
        self.generation, self.cut_us = generation, cut_us
        for group in groups:
            prefix = self._streamed_prefix(group.name)
            keys = [tuple(orjson.loads(key[len(prefix):]))
                    for key in self.client.scan_iter(match=prefix + b"*", count=1000)]
            for low in range(0, len(keys), TRANSACTION_KEYS):
                self._apply(group.name, {key: {} for key in keys[low:low + TRANSACTION_KEYS]})

    def _filter(self, feature: AggregateFeature) -> Any:
        if feature.spec.filter is None:
            return None
        rule = feature.spec.rule()
        if rule is None:  # "label"
            return lambda event: bool(event.get(LABEL))
        return matcher(rule, self.contract)

    def add(self, events: Sequence[tuple[bytes, int, int, Mapping[str, Any]]]) -> int:
        """Add ``(digest, ts µs, label, event)`` to their keys' tiles, each event once; how
        many (group, key) pairs were written."""
        if not self.generation or not self.groups:
            return 0
        written = 0
        for name, group in self.groups.items():
            by_key: dict[tuple[str, ...], dict[str, Any]] = {}
            for digest, ts, label, event in events:
                if ts < self.cut_us:
                    continue
                key = tuple(event.get(k) for k in group.keys)
                if any(value is None for value in key):
                    continue
                kept = {c: event.get(c) for c in self.columns[name]}
                by_key.setdefault(tuple(map(str, key)), {})[digest.hex()] = [ts, label, kept]
            items = list(by_key.items())
            for low in range(0, len(items), TRANSACTION_KEYS):
                written += self._apply(name, dict(items[low:low + TRANSACTION_KEYS]))
        return written

    def _streamed_prefix(self, group: str) -> bytes:
        return f"featureline:stream:{self.project}:agg:{group}:".encode()

    def _apply(self, group: str, new: dict[tuple[str, ...], dict[str, Any]]) -> int:
        """One transaction over ``new``'s keys: their streamed events moved to the served
        generation if they are of another, and the new events added."""
        keys = list(new)
        streamed_keys = [self._streamed_prefix(group) + tile_key(key) for key in keys]
        prefix = tiles_prefix(self.project, self.generation, group)
        tile_keys = [prefix + tile_key(key) for key in keys]
        features = {output: o.feature for output, o in self.outputs[group].items()}
        with self.client.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(*streamed_keys, *tile_keys)
                    # Immediate while watching (redis-py types it as maybe awaitable).
                    streamed = cast(list[bytes | None], pipe.mget(streamed_keys))
                    tiles = cast(list[bytes | None], pipe.mget(tile_keys))
                    writes: dict[bytes, bytes] = {}
                    for at, key in enumerate(keys):
                        result = self._merged(group, features, streamed[at], tiles[at], new[key])
                        if result is not None:
                            writes[streamed_keys[at]], writes[tile_keys[at]] = result
                    pipe.multi()
                    if writes:
                        pipe.mset(writes)
                    pipe.execute()
                    return len(writes) // 2
                except redis_py.WatchError:
                    continue

    def _merged(self, group: str, features: Mapping[str, AggregateFeature],
                streamed: bytes | None, stored: bytes | None, new: Mapping[str, Any]
                ) -> tuple[bytes, bytes] | None:
        """A key's streamed events and tiles after adding ``new``; None: nothing to write."""
        held = orjson.loads(streamed) if streamed else {"generation": None, "events": {}}
        events: dict[str, Any] = held["events"]
        moved = held["generation"] != self.generation
        adding = {digest: event for digest, event in new.items() if digest not in events}
        if moved:  # the new generation's tiles hold none of them: all again, from its cut
            events = {d: e for d, e in events.items() if e[0] >= self.cut_us}
            adding = {**events, **adding}
        if not adding and not moved:
            return None
        tiles = decode_key_tiles(features, stored) if stored else {}
        by_output = {output: tiles.get(output, {}) for output in features}
        latest = max(event[0] for event in adding.values()) if adding else None
        for output, spec in self.outputs[group].items():
            by_output[output] = self._add(spec, by_output[output], adding.values(), latest)
        events.update(adding)
        return (orjson.dumps({"generation": self.generation, "events": events}),
                encode_key_tiles(features, by_output))

    @staticmethod
    def _add(output: _Output, tiles: KeyTiles, events: Any, latest: int | None) -> KeyTiles:
        """``tiles`` with ``events`` added, less the tiles no window at ``latest`` covers."""
        feature = output.feature
        operation, window = feature.operation(), feature.window
        tiles = dict(tiles)
        for ts, label, columns in events:
            event = {**columns, LABEL: label}
            if not output.keeps(event):
                continue
            value = event_value(feature.spec, event)
            if value is None:
                continue
            start = 0 if window.hop is None else tile_start(ts, window.hop)
            tiles[start] = operation.add(tiles.get(start, operation.init()), ts, value)
        oldest = window.start(latest) if latest is not None else None
        if oldest is not None:
            tiles = {start: partial for start, partial in tiles.items() if start >= oldest}
        return tiles
