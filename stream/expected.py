"""What the stream processor should have written, recomputed from its archive: the expected
encoded id of a feature-log row of an entity the processor wrote (``featureline
consistency --archive``; docs/ARCHITECTURE.md, "Online/offline consistency"), and the
archive's events, which the check applies to the aggregations' and entity groups'
definitions.

The processor archives each batch's events with the moments it started and finished
applying them (``.<archive file>.times``: one line per batch, ``count started finished``).
For a row served at instant t, an event is *applied* when its batch finished before t and
*not yet applied* when its batch started after t. A row is *unsettled* — not compared —
when one of its entity's events was being applied at t or has no recorded time, or when t
is before the cut (an earlier output was served).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from featureline.core.aggregations import (
    PushedEvent,
    accepted_events,
    applied_events,
)
from featureline.core.events import event_digest, labeler, micros_of, parse_timestamp
from featureline.core.metadata import OOV_ID, encoded_name, present, read_metadata
from featureline.stream.processor import ENTITIES, encoded_ids, times_path


class ArchivedStream:
    """The events a stream archive holds, per entity, with their batches' times."""

    def __init__(self, archive: str | Path, output: str | Path) -> None:
        self.metadata = read_metadata(output)
        self.contract = present(self.metadata.events, self.metadata, "events")
        self.cut_us = present(self.metadata.tiles, self.metadata, "tiles").cut_us
        label = labeler(self.contract)
        # Every archived event once (``pushed``), and those from the cut on per entity id.
        self.pushed: list[PushedEvent] = []
        self.events: dict[str, dict[str, list[PushedEvent]]] = {e: {} for e in ENTITIES}
        seen: set[bytes] = set()
        folder = Path(archive)
        files = sorted(folder.glob("events-*.jsonl")) + sorted(folder.glob(".events-*.jsonl"))
        for path in files:
            lines = [line for line in path.read_bytes().split(b"\n") if line]
            for line, (started, finished) in zip(lines, _line_times(path, len(lines)),
                                                  strict=True):
                digest = event_digest(line)
                if digest in seen:
                    continue
                seen.add(digest)
                event = orjson.loads(line)
                moment = parse_timestamp(event["ts"], "auto")  # as the processor reads it
                if moment is None:
                    continue
                pushed = PushedEvent(micros_of(moment), int(label(event)), event, started, finished)
                self.pushed.append(pushed)
                if pushed.ts >= self.cut_us:
                    for entity, key in ENTITIES.items():
                        self.events[entity].setdefault(str(event[key]), []).append(pushed)
        self.groups = {group.name: group for group in self.metadata.tile_groups()
                       if group.name in ENTITIES}
        self._encoded: dict[str, dict[str, int]] = {}

    def keys(self, entity: str) -> set[str]:
        """The entity's ids (as text) the archived events from the cut on touched."""
        return set(self.events[entity])

    def pushed_events(self) -> list[PushedEvent]:
        """Every archived event once (exact duplicates dropped), in the archive's order."""
        return self.pushed

    def expected(self, entity: str, keys: Sequence[str], times: Sequence[datetime]
                 ) -> list[dict[str, Any] | None]:
        """Per row (an entity id as logged and its request time): what the processor's row
        of the entity should have said — its encoded id (the vocabulary's; the
        out-of-vocabulary id for an id it lacks), none where no event of it is in the output
        or applied — or None where the archive cannot settle it. (The row's group features
        are served from the tiles at the request time, and checked as the aggregations are:
        ``feature_store.consistency``.)"""
        batch = accepted_events(self.metadata.events_folder(), self.groups[entity],
                                {(k,) for k in keys})
        if entity not in self._encoded:
            self._encoded[entity] = encoded_ids(self.metadata, entity)
        encoded = self._encoded[entity]
        name = encoded_name(ENTITIES[entity])
        out: list[dict[str, Any] | None] = []
        for key, at in zip(keys, times, strict=True):
            applied = applied_events(self.events[entity].get(key, ()), at.timestamp())
            if applied is None or micros_of(at) < self.cut_us:
                out.append(None)
            elif batch.get((key,)) or applied:
                out.append({name: encoded.get(key, OOV_ID)})
            else:  # nothing served, nothing expected
                out.append({name: None})
        return out


def _line_times(path: Path, lines: int) -> list[tuple[float | None, float | None]]:
    """Each line's batch times, from the file's times file (None for lines it lacks: a
    processor killed between the two writes)."""
    times: list[tuple[float | None, float | None]] = []
    sidecar = times_path(path)
    if sidecar.exists():
        for record in sidecar.read_text().splitlines():
            count, started, finished = record.split()
            times += [(float(started), float(finished))] * int(count)
    times = times[:lines]
    return times + [(None, None)] * (lines - len(times))

