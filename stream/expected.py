"""What the stream processor should have served, recomputed from its archive: the expected
features of a feature-log row the processor wrote (``featureline consistency --archive``;
docs/ARCHITECTURE.md, "Online/offline consistency").

The processor archives each batch's events with the moments it started and finished
applying them (``.<archive file>.times``: one line per batch, ``count started finished``).
For a row served at instant t, an event is *applied* when its batch finished before t and
*not yet applied* when its batch started after t; the row's expected features are the
processor's own (:func:`features`) over the batch base at the cut (the latest snapshot at
or before t) and the applied events of days from the cut on, each exact duplicate once. A
row is *unsettled* — not compared — when one of its entity's events was being applied at
t, has no recorded time, or is dated before the cut (the processor counts such a late
event only until the next publication drops it).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import pyarrow.compute as pc
import pyarrow.dataset as ds

from featureline.core.events import event_digest, labeler, micros_of, parse_timestamp
from featureline.core.metadata import encoded_name, present, read_metadata
from featureline.stream.processor import (
    ENTITIES,
    Base,
    BatchBase,
    day_of,
    features,
    times_path,
)

# One archived event of an entity: its day, label, and when its batch started and finished
# being applied (None: not recorded).
Applied = tuple[int, int, float | None, float | None]


class Pushed(NamedTuple):
    """An archived event as the aggregations read it: its time (µs), label and columns,
    and when its batch started and finished being applied (None: not recorded)."""

    ts: int
    label: int
    event: dict[str, Any]
    started: float | None
    finished: float | None


class ArchivedStream:
    """The events a stream archive holds, per entity, with their batches' times."""

    def __init__(self, archive: str | Path, output: str | Path) -> None:
        self.metadata = read_metadata(output)
        contract = present(self.metadata.events, self.metadata, "events")
        self.recent_days = contract.recent_days
        label = labeler(contract)
        self.events: dict[str, dict[str, list[Applied]]] = {e: {} for e in ENTITIES}
        # Every archived event once, for the aggregations (``pushed``).
        self.pushed: list[Pushed] = []
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
                if moment is not None:
                    self.pushed.append(Pushed(micros_of(moment), int(label(event)), event,
                                              started, finished))
                day = day_of(datetime.fromisoformat(event["ts"]).astimezone(timezone.utc))
                for entity, key in ENTITIES.items():
                    self.events[entity].setdefault(str(event[key]), []).append(
                        (day, int(label(event)), started, finished))
        stamps: set[datetime] = set()
        for table in self.metadata.entities.values():
            folder_ = (self.metadata.folder or Path(".")) / table.path
            column = ds.dataset(folder_, format="parquet").to_table(
                columns=[table.timestamp_field])[table.timestamp_field]
            stamps.update(pc.unique(column).to_pylist())
        self.cuts = sorted(s.replace(tzinfo=timezone.utc) if s.tzinfo is None else s
                           for s in stamps)
        self._bases: dict[datetime, dict[str, dict[str, Base]]] = {}

    def _base(self, cut: datetime) -> dict[str, dict[str, Base]]:
        """Every entity's batch base at ``cut``, by its id as text."""
        if cut not in self._bases:
            loaded = BatchBase.load(self.metadata, cut, self.recent_days)
            self._bases[cut] = {entity: {str(k): v for k, v in bases.items()}
                                for entity, bases in loaded.entities.items()}
        return self._bases[cut]

    def keys(self, entity: str) -> set[str]:
        """The entity's ids (as text) the archived events touched."""
        return set(self.events[entity])

    def pushed_events(self) -> list[Pushed]:
        """Every archived event once (exact duplicates dropped), in the archive's order."""
        return self.pushed

    def expected(self, entity: str, keys: Sequence[str], times: Sequence[datetime]
                 ) -> list[dict[str, Any] | None]:
        """Per row (an entity id as logged and its request time): the features the
        processor should have served, or None where the archive cannot settle them."""
        join_key = ENTITIES[entity]
        out: list[dict[str, Any] | None] = []
        for key, at in zip(keys, times, strict=True):
            moment = at.timestamp()
            index = bisect.bisect_right(self.cuts, at) - 1
            cut = self.cuts[index] if index >= 0 else None
            cut_day = day_of(cut) if cut is not None else -(2**31)
            base = self._base(cut).get(entity, {}).get(key, Base()) if cut else Base()
            days: dict[int, tuple[int, int]] = {}
            settled = True
            for day, positive, started, finished in self.events[entity].get(key, ()):
                if started is None or finished is None or started <= moment < finished:
                    settled = False
                    break
                if finished > moment:
                    continue  # applied after the request
                if day < cut_day:
                    settled = False
                    break
                n, p = days.get(day, (0, 0))
                days[day] = (n + 1, p + positive)
            if not settled:
                out.append(None)
                continue
            row = features(entity, base, days, self.recent_days)
            row[encoded_name(join_key)] = base.encoded
            out.append(row)
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

