"""The stream's executor of the aggregations: each accepted event added to its keys' tiles in
the served generation of the online store, once — of every group the output has tiles of,
the entity tables' included (docs/ARCHITECTURE.md, "Features as definitions").

Beside a key's tiles (``feature_store/tiles.py``) the processor keeps the key's *streamed
events* — a hash, ``featureline:stream:<project>:agg:<group>:{<key as JSON>}``: the generation
whose tiles hold them, a version (the count of its writes), and per event digest what the
group reads of the event (its time in µs, its label, the columns) — every event at or after
the published output's cut. A batch of events is applied optimistically, in two pipelined
rounds of Lua scripts (up to :data:`SCRIPT_KEYS` keys per call, of all groups together):
the first reads which of the batch's digests each key holds, its version and its tiles; the
engine's ``add`` (``core/aggregations.py``) folds in the new events; the second writes each
key's tiles and new digests and bumps its version — only where the version is still the one
read. A key another processor wrote in between is left unwritten and read again — the cost
of a batch follows the batch, not the events streamed before it. Each key's tiles come back
to the caller as the write left them (the processor's entity rows are computed from them).
Tiles and digests move together in one script, so an event delivered again — after a kill
between the write and the log's commit, or pushed twice — adds nothing.

On a Redis Cluster a script's keys must share a hash slot: the braces in both names (the
tile key's hash tag, ``feature_store.tiles.tile_key``) put a key's tiles of every generation
and its streamed events in one slot, and each call holds one slot's keys (mostly one key);
the pipelines send each call to its slot's node (``core.redis.queue_script``), the scripts
sent by digest and loaded on every primary where a node lacks them.

A publish serves a new generation whose tiles are the batch's, up to a new cut: at its next
look at the publication the processor moves every streamed key to it — the events before
the new cut are dropped (the batch holds them), the others added to the new tiles — in the
same script as its tiles, so a kill mid-way leaves each key wholly moved or not. Events older than
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

from featureline.core import redis
from featureline.core.aggregations import (
    LABEL,
    AggregateFeature,
    GroupSpec,
    Operation,
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

# Per script call, at most this many keys (on a Redis Cluster, of one hash slot) and, unless
# one key has more, of their events: a call holds the server for ~1 ms.
SCRIPT_KEYS = 500
SCRIPT_EVENTS = 1000
# The fields of a key's streamed events naming the generation whose tiles hold them, and
# counting the writes of its tiles (a write expects the count its read saw).
GENERATION = "generation"
VERSION = "version"
# Per key (KEYS: the streamed events' hashes, then the tiles; ARGV: the number of keys, then
# per key its count of digests and the digests): its generation and version (empty: none), a
# flag per digest (1: held), its tiles (empty: none).
READ = """
local n = tonumber(ARGV[1])
local at, result = 2, {}
for i = 1, n do
  local count = tonumber(ARGV[at])
  local fields = {'generation', 'version'}
  for j = 1, count do fields[j + 2] = ARGV[at + j] end
  at = at + count + 1
  local found = redis.call('HMGET', KEYS[i], unpack(fields))
  local flags = {}
  for j = 3, #fields do flags[j - 2] = found[j] and 1 or 0 end
  result[i] = {found[1] or '', found[2] or '', flags, redis.call('GET', KEYS[n + i]) or ''}
end
return result
"""
# Per key (KEYS: its streamed events' hash, its tiles; ARGV: the generation, then per key the
# version its read saw, its tiles (empty: unchanged), the count of new events, their digest
# and event, the count of stale digests, the stale digests): writes them where the key's
# version is still the one read; returns the keys (1-based) where it is not.
WRITE = """
local at, conflicts = 2, {}
for i = 1, #KEYS, 2 do
  local fresh = tonumber(ARGV[at + 2])
  local stale = tonumber(ARGV[at + 3 + 2 * fresh])
  if (redis.call('HGET', KEYS[i], 'version') or '') == ARGV[at] then
    if ARGV[at + 1] ~= '' then redis.call('SET', KEYS[i + 1], ARGV[at + 1]) end
    local args = {'generation', ARGV[1], 'version', (tonumber(ARGV[at]) or 0) + 1}
    for j = 1, 2 * fresh do args[4 + j] = ARGV[at + 2 + j] end
    redis.call('HSET', KEYS[i], unpack(args))
    if stale > 0 then
      local fields = {}
      for j = 1, stale do fields[j] = ARGV[at + 3 + 2 * fresh + j] end
      redis.call('HDEL', KEYS[i], unpack(fields))
    end
  else
    conflicts[#conflicts + 1] = (i + 1) / 2
  end
  at = at + 4 + 2 * fresh + stale
end
return conflicts
"""


@dataclass(frozen=True)
class _Output:
    """One output of a group, ready for the stream: its feature, which events count, and
    what ``_add`` reads per event, looked up once."""

    feature: AggregateFeature
    filter: Callable[[Mapping[str, Any]], bool] | None  # None: every event counts
    operation: Operation

    @classmethod
    def of(cls, feature: AggregateFeature, contract: EventContract) -> _Output:
        return cls(feature, event_filter(feature.spec, contract), feature.operation())


class Streamed(NamedTuple):
    """An event as a group keeps it — its time (µs), its label, the group's columns — and
    that as its record of streamed events stores it (JSON)."""

    event: list[Any]
    line: bytes


# A streamed key: its group's name and its values.
GroupKey = tuple[str, tuple[str, ...]]


class KeyState(NamedTuple):
    """A key's tiles after a batch: as stored (None: none), decoded where the batch wrote
    them (else None), and whether it added events."""

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
        self.columns: dict[str, frozenset[str]] = {}
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
        self.outputs = {group.name: {f.output: _Output.of(f, self.contract)
                                     for f in group.outputs()} for group in groups}
        self.features = {name: {output: o.feature for output, o in outputs.items()}
                         for name, outputs in self.outputs.items()}
        self.columns = {group.name: frozenset({c for f in group.features for c in f.columns()}
                                              - {LABEL}) for group in groups}
        self.generation, self.cut_us = generation, cut_us
        moved: dict[str, dict[tuple[str, ...], KeyState]] = {}
        if not generation:  # nothing served: nothing to write into
            return moved
        for group in groups:
            prefix = self._streamed_prefix(group.name)
            keys: dict[GroupKey, dict[str, Streamed]] = {
                (group.name, tuple(tile_key_values(key[len(prefix):]))): {}
                for key in self.client.scan_iter(match=prefix + "*", count=1000)}
            for (name, key), state in self._apply_all(keys).items():
                if state.added:
                    moved.setdefault(name, {})[key] = state
        return moved

    def add(self, events: Sequence[tuple[bytes, int, int, Mapping[str, Any]]]
            ) -> dict[str, dict[tuple[str, ...], KeyState]]:
        """Add ``(digest, ts µs, label, event)`` to their keys' tiles, each event once. Per
        group, every key of the events (at or after the cut) and its tiles now."""
        if not self.generation or not self.groups:
            return {}
        by_key: dict[GroupKey, dict[str, Streamed]] = {}
        for digest, ts, label, event in events:
            if ts < self.cut_us:
                continue
            name = digest.hex()
            # What groups reading the same columns keep of the event: one record, encoded once.
            shared: dict[frozenset[str], Streamed] = {}
            for group_name, group in self.groups.items():
                key = group.key_of(event)
                if key is not None:
                    columns = self.columns[group_name]
                    streamed = shared.get(columns)
                    if streamed is None:
                        kept = [ts, label, {c: event.get(c) for c in columns}]
                        streamed = shared[columns] = Streamed(kept, orjson.dumps(kept))
                    by_key.setdefault((group_name, key), {})[name] = streamed
        states: dict[str, dict[tuple[str, ...], KeyState]] = {}
        for (group_name, key), state in self._apply_all(by_key).items():
            states.setdefault(group_name, {})[key] = state
        return states

    def _streamed_prefix(self, group: str) -> str:
        return f"featureline:stream:{self.project}:agg:{group}:"

    def _apply_all(self, new: dict[GroupKey, dict[str, Streamed]]) -> dict[GroupKey, KeyState]:
        """:meth:`_apply` over ``new`` until no key is left that another processor wrote
        between the read and the write."""
        states: dict[GroupKey, KeyState] = {}
        while new:
            applied = self._apply(new)
            states.update(applied)
            new = {key: events for key, events in new.items() if key not in applied}
        return states

    def _parts(self, keys: list[GroupKey], events: list[int]) -> list[list[int]]:
        """``keys``' indices, per script call up to :data:`SCRIPT_KEYS` keys and, unless one
        key holds more alone, :data:`SCRIPT_EVENTS` of their ``events`` (each key's count) —
        on a Redis Cluster, each call's keys of one hash slot (a script's keys share one)."""
        groups: list[list[int]] = [list(range(len(keys)))]
        if self.cluster:
            by_slot: dict[int, list[int]] = {}
            for at, (_, key) in enumerate(keys):
                by_slot.setdefault(key_slot(tile_key(key)), []).append(at)
            groups = list(by_slot.values())
        parts: list[list[int]] = []
        for group in groups:
            part: list[int] = []
            held = 0
            for at in group:
                if part and (len(part) == SCRIPT_KEYS or held + events[at] > SCRIPT_EVENTS):
                    parts.append(part)
                    part, held = [], 0
                part.append(at)
                held += events[at]
            if part:
                parts.append(part)
        return parts

    def _scripts(self, script: Any, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """The replies of ``script`` called with each ``(keys, args)``, in one pipeline (a
        cluster's routes each call to its slot's node), by digest; loaded first where a
        server lost it."""
        def queue(pipe: Any) -> None:
            for keys, args in calls:
                redis.queue_script(pipe, script.sha, keys, args)

        return redis.execute_with_scripts(self.client, [self.read, self.write], queue)

    def _apply(self, new: dict[GroupKey, dict[str, Streamed]]) -> dict[GroupKey, KeyState]:
        """``new``'s keys (of any groups) with their new events (by digest): their streamed
        events moved to the served generation if they are of another, and the new events
        added; each key's tiles after it — except the keys another processor wrote after
        they were read here (their version moved), which are left out, unwritten."""
        keys = list(new)
        streamed_keys = [self._streamed_prefix(group) + tile_key(key).decode()
                         for group, key in keys]
        prefixes = {group: tiles_prefix(self.project, self.generation, group).decode()
                    for group in {group for group, _ in keys}}
        tile_keys = [prefixes[group] + tile_key(key).decode() for group, key in keys]
        parts = self._parts(keys, [len(new[key]) for key in keys])
        asked: list[list[Any]] = []
        for part in parts:
            args: list[Any] = [len(part)]
            for at in part:
                events = new[keys[at]]
                args += [len(events), *events]
            asked.append(args)
        held: list[Any] = [None] * len(keys)
        for part, replies in zip(parts, self._scripts(self.read, [
                ([*(streamed_keys[at] for at in part), *(tile_keys[at] for at in part)], args)
                for part, args in zip(parts, asked, strict=True)]), strict=True):
            for at, reply in zip(part, replies, strict=True):
                held[at] = reply
        generation = str(self.generation).encode()
        # Keys with streamed events of another generation (none: nothing to move).
        moved = [at for at, (held_generation, *_) in enumerate(held)
                 if held_generation not in (generation, b"")]
        reads = self.client.pipeline(transaction=False)
        for at in moved:
            reads.hgetall(streamed_keys[at])
        streamed = dict(zip(moved, reads.execute() if moved else [], strict=True))
        states: dict[GroupKey, KeyState] = {}
        calls: list[tuple[list[str], list[Any]]] = []
        written: list[list[int]] = []  # per call, its keys' indices
        for part in parts:
            call_keys: list[str] = []
            indices: list[int] = []
            args = [self.generation]
            for at in part:
                group, key = keys[at]
                _, version, flags, stored_tiles = held[at]
                events = new[(group, key)]
                fresh = {digest: event for (digest, event), found
                         in zip(events.items(), flags, strict=True) if not found}
                stale: list[str] = []
                adding = dict(fresh)
                if at in streamed:  # the served tiles hold none of them: all again
                    for field, value in streamed[at].items():
                        name = field.decode()
                        if name in (GENERATION, VERSION) or name in fresh:
                            continue
                        event = orjson.loads(value)
                        if event[0] >= self.cut_us:
                            adding[name] = Streamed(event, value)
                        else:  # the batch of the new cut holds it
                            stale.append(name)
                stored = stored_tiles or None
                if not fresh and at not in streamed:
                    states[(group, key)] = KeyState(stored, None, False)
                    continue
                indices.append(at)
                call_keys += [streamed_keys[at], tile_keys[at]]
                if adding:
                    tiles = self._tiles_with(group, stored,
                                             [record.event for record in adding.values()])
                    encoded = encode_key_tiles(self.features[group], tiles)
                    states[(group, key)] = KeyState(encoded, tiles, True)
                else:
                    encoded = b""
                    states[(group, key)] = KeyState(stored, None, False)
                args += [version, encoded, len(fresh)]
                for digest, record in fresh.items():
                    args += [digest, record.line]
                args += [len(stale), *stale]
            if indices:
                calls.append((call_keys, args))
                written.append(indices)
        for indices, conflicts in zip(written, self._scripts(self.write, calls) if calls
                                      else [], strict=True):
            for conflict in conflicts:
                del states[keys[indices[int(conflict) - 1]]]
        return states

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
        operation, keeps, feature = output.operation, output.filter, output.feature
        hop, spec = feature.window.hop, feature.spec
        tiles = dict(tiles)
        for ts, event in events:
            if keeps is not None and not keeps(event):
                continue
            value = event_value(spec, event)
            if value is None:
                continue
            start = 0 if hop is None else tile_start(ts, hop)
            partial = tiles.get(start)
            tiles[start] = operation.add(operation.init() if partial is None else partial,
                                         ts, value)
        oldest = feature.window.start(latest)
        if oldest is not None and tiles and min(tiles) < oldest:
            tiles = {start: partial for start, partial in tiles.items() if start >= oldest}
        return tiles
