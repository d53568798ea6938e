"""The stream's executor of the aggregations: each accepted event added to its keys' tiles in
the served generation of the online store, once — of every group the output has tiles of,
the entity tables' included (docs/ARCHITECTURE.md, "Features as definitions").

Beside a key's tiles (``feature_store/tiles.py``) the processor keeps the key's *streamed
events* — a hash, ``featureline:stream:<project>:agg:<group>:{<key as JSON>}``: the generation
whose tiles hold them, and per event digest what the group reads of the event (its time in
µs, its label, the columns) — every event at or after the published output's cut. A batch of
events is applied in one optimistic transaction (up to :data:`TRANSACTION_KEYS` keys, of
all groups together): WATCH both keys of every key touched, read in one round trip which
of the batch's digests each key holds and its tiles, add the new events with the engine's
``add`` (``core/aggregations.py``), write the tiles and the new digests (MULTI/EXEC; a
write by another processor in between starts it again) — the cost of a batch follows the
batch, not the events streamed before it. Each key's tiles come back to the caller as the
transaction left them (the processor's entity rows are computed from them). Tiles and
digests move together, so an event delivered again — after a kill between the write and
the log's commit, or pushed twice — adds nothing.

On a Redis Cluster a transaction's keys must share a hash slot: the braces in both names
(the tile key's hash tag, ``feature_store.tiles.tile_key``) put a key's tiles of every
generation and its streamed events in one slot, and a batch is one transaction per slot
(up to :data:`TRANSACTION_KEYS` keys of it) — a round trip or three per key instead of per
500 keys; the scripts are loaded on every primary and sent by digest.

A publish serves a new generation whose tiles are the batch's, up to a new cut: at its next
look at the publication the processor moves every streamed key to it — the events before
the new cut are dropped (the batch holds them), the others added to the new tiles — in the
same transaction, so a kill mid-way leaves each key wholly moved or not. Events older than
the served cut when they arrive (later than the batch's read of the archive) are left to
the next batch run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
import redis as redis_py
from redis.crc import key_slot

from featureline.core.aggregations import (
    LABEL,
    AggregateFeature,
    GroupSpec,
    event_filter,
    event_value,
    tile_start,
)
from featureline.core.events import EventContract
from featureline.feature_store.tiles import (
    KeyTiles,
    decode_key_tiles,
    encode_key_tiles,
    tile_key,
    tile_key_values,
    tiles_prefix,
)

# Keys per WATCH transaction.
TRANSACTION_KEYS = 500
# The field of a key's streamed events naming the generation whose tiles hold them.
GENERATION = "generation"
# Per key (KEYS: the streamed events' hashes, then the tiles; ARGV: the number of keys, then
# per key its count of digests and the digests): its generation (empty: none), a flag per
# digest (1: held), its tiles (empty: none).
READ = """
local n = tonumber(ARGV[1])
local at, result = 2, {}
for i = 1, n do
  local count = tonumber(ARGV[at])
  local fields = {'generation'}
  for j = 1, count do fields[j + 1] = ARGV[at + j] end
  at = at + count + 1
  local found = redis.call('HMGET', KEYS[i], unpack(fields))
  local flags = {}
  for j = 2, #fields do flags[j - 1] = found[j] and 1 or 0 end
  result[i] = {found[1] or '', flags, redis.call('GET', KEYS[n + i]) or ''}
end
return result
"""
# Per key (KEYS: its streamed events' hash, its tiles; ARGV: the generation, then per key its
# tiles (empty: unchanged), the count of new events, their digest and event, the count of
# stale digests, the stale digests): writes them.
WRITE = """
local at = 2
for i = 1, #KEYS, 2 do
  if ARGV[at] ~= '' then redis.call('SET', KEYS[i + 1], ARGV[at]) end
  local fresh = tonumber(ARGV[at + 1])
  local args = {'generation', ARGV[1]}
  for j = 1, 2 * fresh do args[2 + j] = ARGV[at + 1 + j] end
  redis.call('HSET', KEYS[i], unpack(args))
  at = at + 2 + 2 * fresh
  local stale = tonumber(ARGV[at])
  if stale > 0 then
    local fields = {}
    for j = 1, stale do fields[j] = ARGV[at + j] end
    redis.call('HDEL', KEYS[i], unpack(fields))
  end
  at = at + stale + 1
end
return #KEYS / 2
"""


@dataclass(frozen=True)
class _Output:
    """One output of a group, ready for the stream: its feature and which events count."""

    feature: AggregateFeature
    filter: Callable[[Mapping[str, Any]], bool] | None  # None: every event counts


# A streamed key: its group's name and its values.
GroupKey = tuple[str, tuple[str, ...]]


class KeyState(NamedTuple):
    """A key's tiles after a transaction: as stored (None: none), decoded where the
    transaction wrote them (else None), and whether it added events."""

    stored: bytes | None
    tiles: dict[str, KeyTiles] | None
    added: bool


class StreamTiles:
    """Adds streamed events to the tiles of every group of the served output's spec."""

    def __init__(self, client: redis_py.Redis, project: str, contract: EventContract,
                 cluster: bool = False) -> None:
        self.client = client
        self.cluster = cluster
        self.project = project
        self.contract = contract
        self.groups: dict[str, GroupSpec] = {}
        self.outputs: dict[str, dict[str, _Output]] = {}
        self.features: dict[str, dict[str, AggregateFeature]] = {}
        self.columns: dict[str, set[str]] = {}
        self.generation: int | None = None
        self.cut_us = 0
        self.read = client.register_script(READ)
        self.write = client.register_script(WRITE)

    def serve(self, groups: Sequence[GroupSpec], generation: int | None, cut_us: int
              ) -> dict[str, dict[tuple[str, ...], KeyState]]:
        """The spec, generation and cut of the publication served now; every streamed key
        of another generation is moved to this one. Per group, the keys moved with events
        from the cut on (their tiles hold more than the batch's) and their tiles now."""
        self.groups = {group.name: group for group in groups}
        self.outputs = {group.name: {f.output: _Output(f, event_filter(f.spec, self.contract))
                                     for f in group.outputs()} for group in groups}
        self.features = {name: {output: o.feature for output, o in outputs.items()}
                         for name, outputs in self.outputs.items()}
        self.columns = {group.name: {c for f in group.features for c in f.columns()} - {LABEL}
                        for group in groups}
        self.generation, self.cut_us = generation, cut_us
        moved: dict[str, dict[tuple[str, ...], KeyState]] = {}
        if not generation:  # nothing served: nothing to write into
            return moved
        self._load_scripts()  # on every primary of a cluster
        for group in groups:
            prefix = self._streamed_prefix(group.name)
            keys: dict[GroupKey, dict[str, Any]] = {
                (group.name, tuple(tile_key_values(key[len(prefix):]))): {}
                for key in self.client.scan_iter(match=prefix + "*", count=1000)}
            for (name, key), state in self._transactions(keys).items():
                if state.added:
                    moved.setdefault(name, {})[key] = state
        return moved

    def add(self, events: Sequence[tuple[bytes, int, int, Mapping[str, Any]]]
            ) -> dict[str, dict[tuple[str, ...], KeyState]]:
        """Add ``(digest, ts µs, label, event)`` to their keys' tiles, each event once. Per
        group, every key of the events (at or after the cut) and its tiles now."""
        if not self.generation or not self.groups:
            return {}
        by_key: dict[GroupKey, dict[str, Any]] = {}
        for digest, ts, label, event in events:
            if ts < self.cut_us:
                continue
            name = digest.hex()
            for group_name, group in self.groups.items():
                key = group.key_of(event)
                if key is not None:
                    columns = self.columns[group_name]
                    kept = {c: event.get(c) for c in columns} if columns else {}
                    by_key.setdefault((group_name, key), {})[name] = [ts, label, kept]
        states: dict[str, dict[tuple[str, ...], KeyState]] = {}
        for (group_name, key), state in self._transactions(by_key).items():
            states.setdefault(group_name, {})[key] = state
        return states

    def _streamed_prefix(self, group: str) -> str:
        return f"featureline:stream:{self.project}:agg:{group}:"

    def _transactions(self, new: dict[GroupKey, dict[str, Any]]) -> dict[GroupKey, KeyState]:
        """:meth:`_apply` over ``new``, :data:`TRANSACTION_KEYS` keys at a time — on a
        Redis Cluster, of one hash slot at a time (a transaction's keys share one)."""
        parts: list[list[tuple[GroupKey, dict[str, Any]]]] = [list(new.items())]
        if self.cluster:
            by_slot: dict[int, list[tuple[GroupKey, dict[str, Any]]]] = {}
            for item in parts[0]:
                by_slot.setdefault(key_slot(tile_key(item[0][1])), []).append(item)
            parts = list(by_slot.values())
        states: dict[GroupKey, KeyState] = {}
        for items in parts:
            for low in range(0, len(items), TRANSACTION_KEYS):
                states.update(self._apply(dict(items[low:low + TRANSACTION_KEYS])))
        return states

    def _load_scripts(self) -> None:
        for script in (self.read, self.write):
            self.client.script_load(script.script)

    def _apply(self, new: dict[GroupKey, dict[str, Any]]) -> dict[GroupKey, KeyState]:
        """One transaction over ``new``'s keys (of any groups) and their new events (by
        digest): their streamed events moved to the served generation if they are of
        another, and the new events added; each key's tiles after it."""
        keys = list(new)
        streamed_keys = [self._streamed_prefix(group) + tile_key(key).decode()
                         for group, key in keys]
        prefixes = {group: tiles_prefix(self.project, self.generation, group).decode()
                    for group in {group for group, _ in keys}}
        tile_keys = [prefixes[group] + tile_key(key).decode() for group, key in keys]
        asked: list[Any] = [len(keys)]
        for events in new.values():
            asked += [len(events), *events]
        generation = str(self.generation).encode()
        with self.client.pipeline(transaction=True) as watching:
            while True:
                try:
                    watching.watch(*streamed_keys, *tile_keys)
                    # Read on another connection: the WATCH still fails the EXEC on any
                    # write by another client after it.
                    held = self.read(keys=[*streamed_keys, *tile_keys], args=asked)
                    moved = [at for at, (held_generation, _, _) in enumerate(held)
                             if held_generation != generation]
                    reads = self.client.pipeline(transaction=False)
                    for at in moved:
                        reads.hgetall(streamed_keys[at])
                    streamed = dict(zip(moved, reads.execute() if moved else [], strict=True))
                    written: list[str] = []
                    states: dict[GroupKey, KeyState] = {}
                    args: list[Any] = [self.generation]
                    for at, (group, key) in enumerate(keys):
                        events = new[(group, key)]
                        fresh = {digest: event for (digest, event), found
                                 in zip(events.items(), held[at][1], strict=True)
                                 if not found}
                        stale: list[str] = []
                        adding = dict(fresh)
                        if at in streamed:  # the served tiles hold none of them: all again
                            for field, value in streamed[at].items():
                                name = field.decode()
                                if name == GENERATION or name in fresh:
                                    continue
                                event = orjson.loads(value)
                                if event[0] >= self.cut_us:
                                    adding[name] = event
                                else:  # the batch of the new cut holds it
                                    stale.append(name)
                        stored = held[at][2] or None
                        if not fresh and at not in streamed:
                            states[(group, key)] = KeyState(stored, None, False)
                            continue
                        written += [streamed_keys[at], tile_keys[at]]
                        if adding:
                            tiles = self._tiles_with(group, stored, list(adding.values()))
                            encoded = encode_key_tiles(self.features[group], tiles)
                            states[(group, key)] = KeyState(encoded, tiles, True)
                        else:
                            encoded = b""
                            states[(group, key)] = KeyState(stored, None, False)
                        args += [encoded, len(fresh)]
                        for digest, event in fresh.items():
                            args += [digest, orjson.dumps(event)]
                        args += [len(stale), *stale]
                    watching.multi()
                    if written:  # by digest: a cluster's pipeline cannot load a script
                        watching.execute_command("EVALSHA", self.write.sha, len(written),
                                                 *written, *args)
                    watching.execute()
                    return states
                except redis_py.WatchError:
                    continue
                except redis_py.exceptions.NoScriptError:  # the server lost its scripts
                    self._load_scripts()

    def _tiles_with(self, group: str, stored: bytes | None, events: list[Any]
                    ) -> dict[str, KeyTiles]:
        """A key's stored tiles with ``events`` added."""
        tiles = decode_key_tiles(self.features[group], stored) if stored else {}
        latest = max(event[0] for event in events)
        readable = [(ts, {**columns, LABEL: label}) for ts, label, columns in events]
        return {output: self._add(spec, tiles.get(output, {}), readable, latest)
                for output, spec in self.outputs[group].items()}

    @staticmethod
    def _add(output: _Output, tiles: KeyTiles, events: list[tuple[int, dict[str, Any]]],
             latest: int) -> KeyTiles:
        """``tiles`` with ``events`` (µs, columns) added, less the tiles no window at
        ``latest`` covers."""
        feature = output.feature
        operation, window, spec = feature.operation(), feature.window, feature.spec
        tiles = dict(tiles)
        for ts, event in events:
            if output.filter is not None and not output.filter(event):
                continue
            value = event_value(spec, event)
            if value is None:
                continue
            start = 0 if window.hop is None else tile_start(ts, window.hop)
            tiles[start] = operation.add(tiles.get(start, operation.init()), ts, value)
        oldest = window.start(latest)
        if oldest is not None:
            tiles = {start: partial for start, partial in tiles.items() if start >= oldest}
        return tiles
