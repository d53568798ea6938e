"""Features as definitions: the ``aggregations:`` spec, the rule of time, and the one engine of
partial aggregates every executor calls (docs/ARCHITECTURE.md, "Features as definitions").

A **group** is one entity kind: its ``keys`` (raw event columns: ``[user_id]``,
``[user_id, category]``) and its features. A **feature** is an operation over an optional
column, for the events an optional filter keeps (the label rule's syntax, or ``label``), over
one or more windows. Its output names are ``<name>_<window>`` (``name``: ``<op>``, or
``<column>_<op>`` with a column, unless given; no window → the lifetime, no suffix).

**The rule of time** (``core/time_rule.py``). The value at time ``t`` aggregates the key's
events with ``ts`` in ``[start, t)``, ``start`` = ``t − window`` rounded down to a multiple of
the hop: a window covers at most one hop more than its length, its start moves a hop at a
time, and an idle key decays (its ``1h`` count reads 0 an hour or so after its last event).
The ``all`` window has no start. :func:`hop_seconds` picks the hop: 5 minutes for windows up
to a day, an hour up to 14 days, a day beyond; a feature's ``hop`` overrides it, within a
sixth of its window.

**The engine** (``core/operations/``). Each operation owns its *partial aggregate* —
``init`` / ``add`` / ``merge`` / ``finish``, and the same in Spark columns — so the events of
one hop fold into a *tile*, tiles merge in any order, and the same class serves the batch's
backfill and tiles, the stream's updates and the API's read-time merge.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pydantic import (
    AfterValidator,
    Field,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_validator,
)

from featureline.core import time_rule
from featureline.core.events import EventContract, LabelSpec, matcher, parse_rule
from featureline.core.operations import OPERATIONS, Operation, Parameters, Partial
from featureline.core.settings import Settings, duration_seconds
from featureline.core.time_rule import MICROS, Time

ALL = "all"
LABEL = "label"
# Hops by window length: (longest window, hop), in seconds.
HOPS = ((86_400, 300), (14 * 86_400, 3_600))
LONG_HOP = 86_400
# A window spans at least this many hops, so its start moves by at most a sixth of it.
MIN_HOPS_PER_WINDOW = 6
# A group's, an output's or a derived feature's name.
NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def _checked_name(name: str) -> str:
    if not NAME.match(name):
        raise ValueError(f"{name!r} must be lower case letters, digits and _")
    return name


# A setting that names a group, an output or a derived feature, checked on load.
Name = Annotated[str, AfterValidator(_checked_name)]


def hop_seconds(window_s: int) -> int:
    """The default hop of a window: 5 min up to a day, 1 h up to 14 days, 1 d beyond."""
    return next((hop for longest, hop in HOPS if window_s <= longest), LONG_HOP)


@dataclass(frozen=True)
class Window:
    """A window as written (``1h``, ``all``), its length and hop in seconds (None: the
    lifetime)."""

    text: str
    seconds: int | None
    hop: int | None

    @property
    def length_micros(self) -> int | None:
        """The window's length in µs; None: the lifetime."""
        return None if self.seconds is None else self.seconds * MICROS

    @property
    def hop_micros(self) -> int | None:
        """The window's hop in µs; None: the lifetime."""
        return None if self.hop is None else self.hop * MICROS

    def constant_until(self, t: int) -> int | None:
        """The first time after ``t`` (µs) at which the window's value from unchanged tiles may
        differ from its value at ``t`` (:func:`core.time_rule.constant_until`)."""
        return time_rule.constant_until(t, self.length_micros, self.hop_micros)

    def start(self, t: Time) -> Time | None:
        """The first microsecond of the window's events at ``t`` (µs: an integer or a Spark
        column); None: no start."""
        if self.length_micros is None or self.hop_micros is None:
            return None
        return time_rule.window_start(t, self.length_micros, self.hop_micros)

    def expires(self, ts: Time) -> Time | None:
        """The first time (µs) at which an event at ``ts`` no longer counts (a hop after the
        window's length past its tile's start); None: it always counts."""
        if self.length_micros is None or self.hop_micros is None:
            return None
        return time_rule.expires(ts, self.length_micros, self.hop_micros)

    def covers(self, ts: int, t: int) -> bool:
        """Whether an event at ``ts`` counts in the value at ``t`` (both µs)."""
        return time_rule.covers(ts, t, self.length_micros, self.hop_micros)


def parse_window(text: str, hop: str | None = None) -> Window:
    """``1h`` / ``7d`` / ``all`` (and a hop that overrides the default) → a :class:`Window`;
    ValueError when the window is not a duration or spans fewer than six hops."""
    if text == ALL:
        return Window(ALL, None, None)
    seconds = duration_seconds(text)
    hop_s = duration_seconds(hop) if hop else hop_seconds(seconds)
    if seconds < MIN_HOPS_PER_WINDOW * hop_s or seconds % hop_s:
        raise ValueError(f"window {text} must be a multiple of its hop of {hop_s}s and span at "
                         f"least {MIN_HOPS_PER_WINDOW} of them; set the feature's hop (e.g. "
                         f"hop: 1m)")
    return Window(text, seconds, hop_s)


class FeatureSpec(Settings):
    """One entry of a group's ``features``."""

    # The operation: count, sum, mean, variance, min, max, latest (the latest event's time,
    # µs), last, last_k, approx_distinct (core/operations/).
    op: str
    # The event column it reads (a raw column, or ``label``); count needs none.
    column: str | None = None
    # Output name before the window suffix; default <op>, or <column>_<op>.
    name: str | None = None
    # Which events count: the label rule's syntax ("event_type in (purchase)"), or "label".
    filter: str | None = None
    # Durations (30m, 1h, 7d) or "all"; none: the lifetime, without a suffix.
    windows: list[str] = Field(default_factory=list)
    # Overrides the windows' default hop (a sixth of the window at most).
    hop: str | None = None
    # The operation's parameters (last_k's k), written beside op; its own model types them.
    params: SerializeAsAny[Parameters] = Field(default_factory=Parameters)

    @model_validator(mode="before")
    @classmethod
    def _parameters(cls, data: Any) -> Any:
        """The operation's parameters, written beside ``op``, typed by its model into
        ``params``; another operation's parameter is an error naming it."""
        if not isinstance(data, dict) or data.get("op") not in OPERATIONS:
            return data
        op = data["op"]
        model = OPERATIONS[op].parameters
        given = data.get("params")
        written = dict(given.model_dump() if isinstance(given, Parameters) else given or {})
        written.update((key, data[key]) for key in model.model_fields if key in data)
        for key in data.keys() - cls.model_fields.keys() - written.keys():
            taking = [name for name, other in OPERATIONS.items()
                      if key in other.parameters.model_fields]
            if taking:
                raise ValueError(f"{key}: {op} takes no {key} ({', '.join(taking)} does)")
        try:
            params = model.model_validate(written)
        except ValidationError as exc:
            error = exc.errors()[0]
            key = ".".join(map(str, error["loc"]))
            message = (f"{op} needs {key}" if error["type"] == "missing"
                       else f"{op} takes no {key}" if error["type"] == "extra_forbidden"
                       else error["msg"])
            raise ValueError(f"{key}: {message}") from None
        kept = {key: value for key, value in data.items() if key not in model.model_fields}
        return {**kept, "params": params}

    @field_validator("op")
    @classmethod
    def _op(cls, op: str) -> str:
        if op not in OPERATIONS:
            raise ValueError(f"{op!r} is not an operation; one of "
                             f"{', '.join(repr(name) for name in OPERATIONS)}")
        return op

    @field_validator("windows")
    @classmethod
    def _windows(cls, windows: list[str]) -> list[str]:
        if len(set(windows)) != len(windows):
            raise ValueError(f"a window is listed twice: {windows}")
        return windows

    @field_validator("filter")
    @classmethod
    def _filter(cls, text: str | None) -> str | None:
        if text is not None and text.strip() != LABEL:
            parse_rule(text)
        return text

    @model_validator(mode="after")
    def _consistent(self) -> FeatureSpec:
        if OPERATIONS[self.op].needs_column and self.column is None:
            raise ValueError(f"column: {self.op} needs a column")
        if self.name is not None and not NAME.match(self.name):
            raise ValueError(f"name: {self.name!r} must be lower case letters, digits and _")
        for index, window in enumerate(self.windows):
            try:
                parse_window(window, self.hop)
            except ValueError as exc:
                raise ValueError(f"windows[{index}]: {exc}") from None
        return self

    @property
    def base_name(self) -> str:
        if self.name:
            return self.name
        return self.op if self.column is None else f"{self.column}_{self.op}"

    def outputs(self) -> list[tuple[str, Window]]:
        """(output name, window) per window; no window: the lifetime under the base name."""
        if not self.windows:
            return [(self.base_name, parse_window(ALL))]
        return [(f"{self.base_name}_{w}", parse_window(w, self.hop)) for w in self.windows]

    def parameters(self) -> dict[str, Any]:
        """Its parameters, flat, as metadata.json and the outputs' fingerprints hold them
        (``k`` null for an operation without one)."""
        return {"k": None, **self.params.model_dump(mode="json")}

    def rule(self) -> LabelSpec | None:
        """The filter's rule; None for no filter or ``label``."""
        if self.filter is None or self.filter.strip() == LABEL:
            return None
        return parse_rule(self.filter)

    def columns(self) -> set[str]:
        """The event columns it reads."""
        read = {self.column} if self.column else set()
        rule = self.rule()
        if rule is not None:
            read.add(rule.column)
        elif self.filter is not None:
            read.add(LABEL)
        return read


class GroupSpec(Settings):
    """One entry of ``aggregations``: a feature view of one entity kind."""

    # The group's name: its feature view, and the prefix of its features' names.
    name: Name
    # The raw columns whose values key it (user_id; [user_id, category]).
    keys: list[str] = Field(min_length=1)
    # Its features.
    features: list[FeatureSpec] = Field(min_length=1)

    @field_validator("keys")
    @classmethod
    def _keys(cls, keys: list[str]) -> list[str]:
        if len(set(keys)) != len(keys):
            raise ValueError(f"a key is listed twice: {keys}")
        return keys

    @model_validator(mode="after")
    def _unique_outputs(self) -> GroupSpec:
        seen: dict[str, int] = {}
        for index, feature in enumerate(self.features):
            for output, _ in feature.outputs():
                if output in seen:
                    raise ValueError(f"features[{index}].name: {output} is also the output "
                                     f"of features[{seen[output]}]; give one a name")
                seen[output] = index
        return self

    def outputs(self) -> list[AggregateFeature]:
        """Every output of the group, in the order of the spec."""
        return [AggregateFeature(self.name, tuple(self.keys), output, feature, window)
                for feature in self.features for output, window in feature.outputs()]

    def key_of(self, event: Mapping[str, Any]) -> tuple[str, ...] | None:
        """An event's key in the group, each value as text; None where a key column is
        missing (the event counts for no key of the group)."""
        values = [event.get(key) for key in self.keys]
        return None if None in values else tuple(map(str, values))


# The entities with a table of their own (entities/<entity>, Feast's <entity>_features view),
# each keyed by one raw column.
ENTITIES = {"user": "user_id", "item": "item_id"}
# The model inputs' groups (``core.model_inputs``) are named with this prefix.
INPUTS_PREFIX = "inputs_"


def entity_group(entity: str, recent_days: int) -> GroupSpec:
    """The entity table's features as a group of the engine: ``<e>_events`` (a count over the
    lifetime), ``<e>_events_<N>d`` (over ``recent_days``), ``<e>_positives`` (a count of the
    labelled events), ``<e>_positive_rate`` (the label's mean). At a midnight — where the
    tables take their daily snapshots — the N-day window is the N calendar days before it;
    its hop is a day where the window spans enough of them (a key's tiles: one per day)."""
    hop = "1d" if recent_days >= MIN_HOPS_PER_WINDOW else None
    return GroupSpec(name=entity, keys=[ENTITIES[entity]], features=[
        FeatureSpec(op="count", name=f"{entity}_events"),
        FeatureSpec(op="count", name=f"{entity}_events", windows=[f"{recent_days}d"], hop=hop),
        FeatureSpec(op="count", name=f"{entity}_positives", filter=LABEL),
        FeatureSpec(op="mean", column=LABEL, name=f"{entity}_positive_rate"),
    ])


def check_groups(groups: Sequence[GroupSpec], contract: EventContract) -> None:
    """Group names unique and none an entity table's group (``user``, ``item``: their tiles
    share the online store's names); every key, column and filter column one the events
    have (or ``label``), of the kind its operation reads (approx_distinct text, sum
    numbers). ValueError naming ``[i].…`` otherwise."""
    known = {*contract.columns, LABEL}
    numeric = {*contract.numeric, LABEL, "ts"}
    names: dict[str, int] = {}
    for g, group in enumerate(groups):
        if group.name in names:
            raise ValueError(f"[{g}].name: group {group.name} is also [{names[group.name]}]")
        if group.name in ENTITIES:
            raise ValueError(f"[{g}].name: {group.name} is the {group.name} table's group; "
                             f"name it otherwise (not one of {sorted(ENTITIES)})")
        if group.name.startswith(INPUTS_PREFIX):
            raise ValueError(f"[{g}].name: {group.name}: names starting {INPUTS_PREFIX} are "
                             f"the model inputs' groups; name it otherwise")
        names[group.name] = g
        for index, key in enumerate(group.keys):
            if key not in known - numeric:
                raise ValueError(f"[{g}].keys[{index}]: {key!r} is not a text column of the "
                                 f"events (they have {sorted(known - numeric)})")
        for f, feature in enumerate(group.features):
            for column in sorted(feature.columns() - known):
                field = "column" if column == feature.column else "filter"
                raise ValueError(f"[{g}].features[{f}].{field}: the events have no column "
                                 f"{column!r} (they have {sorted(known)})")
            reads = OPERATIONS[feature.op].reads
            if feature.column is not None and reads != "any" and (
                    feature.column in numeric) != (reads == "number"):
                kind = "a number" if feature.column in numeric else "text"
                raise ValueError(f"[{g}].features[{f}].column: {feature.op} reads "
                                 f"{'numbers' if reads == 'number' else 'text values'}; "
                                 f"{feature.column!r} is {kind}")


@dataclass(frozen=True)
class AggregateFeature:
    """One output: a window of one feature of one group."""

    group: str
    keys: tuple[str, ...]
    output: str
    spec: FeatureSpec
    window: Window

    @property
    def qualified(self) -> str:
        """``<group>:<feature>``, as the API and Feast name it."""
        return f"{self.group}:{self.output}"

    @property
    def column_name(self) -> str:
        """``<group>__<feature>``, the examples' column."""
        return f"{self.group}__{self.output}"

    def operation(self) -> Operation:
        return operation_of(self.spec.op, self.spec.params)


@functools.cache
def operation_of(op: str, params: Parameters) -> Operation:
    """The operation ``op`` with its parameters: one object per pair, operations hold no
    state."""
    return OPERATIONS[op](params)


def event_value(feature: FeatureSpec, event: Mapping[str, Any]) -> Any:
    """What the feature reads of an event: its column's value (None: skipped); ``True`` for
    a count without a column."""
    return True if feature.column is None else event.get(feature.column)


def event_filter(feature: FeatureSpec, contract: EventContract
                 ) -> Callable[[Mapping[str, Any]], bool] | None:
    """Whether an event (its columns and ``label``) counts for ``feature``: its filter, as
    the backfill's ``rule_column`` reads it; None: every event counts."""
    if feature.filter is None:
        return None
    rule = feature.rule()
    if rule is None:  # "label"
        return lambda event: bool(event.get(LABEL))
    return matcher(rule, contract)


def value_at(feature: AggregateFeature, events: Iterable[tuple[int, Mapping[str, Any]]],
             t: int, keeps: Callable[[Mapping[str, Any]], bool] | None = None) -> Any:
    """The rule of time's value at ``t`` (µs) over one key's events (ts µs, columns), read
    event by event — the definition itself, which ``featureline consistency`` compares the
    served values with; ``keeps``: :func:`event_filter`'s."""
    operation = feature.operation()
    return operation.finish(fold(operation, (
        (ts, event_value(feature.spec, event)) for ts, event in events
        if feature.window.covers(ts, t) and (keeps is None or keeps(event)))))


def accepted_events(folder: str | Path, group: GroupSpec, wanted: set[tuple[str, ...]]
                    ) -> dict[tuple[str, ...], list[tuple[int, dict[str, Any]]]]:
    """An output's accepted events (``folder``: its ``Metadata.events_folder``) of the
    ``wanted`` keys (the group's key columns' values, as text), as :func:`value_at` reads
    them: (ts µs, the columns the group reads and ``label``). A key missing a value (an
    attribute the request lacks) has no events."""
    wanted = {own for own in wanted if None not in own}
    if not wanted:
        return {}
    keys = list(group.keys)
    read = sorted({*keys, "ts", LABEL, *(c for f in group.features for c in f.columns())})
    # Read by each key column's wanted values, then kept by the whole key.
    condition = None
    for index, key in enumerate(keys):
        values = sorted({own[index] for own in wanted})
        test = pc.field(key).cast(pa.string()).isin(values)
        condition = test if condition is None else condition & test
    table = ds.dataset(folder, format="parquet", partitioning="hive").to_table(
        columns=read, filter=condition)
    times = table["ts"].cast(pa.timestamp("us")).cast(pa.int64()).to_pylist()
    by_key: dict[tuple[str, ...], list[tuple[int, dict[str, Any]]]] = {}
    for ts, row in zip(times, table.to_pylist(), strict=True):
        own = group.key_of(row)
        if own in wanted:
            by_key.setdefault(own, []).append((ts, row))
    return by_key


class PushedEvent(NamedTuple):
    """A pushed event as the stream's archive holds it: its time (µs), label and columns, and
    when its batch started and finished being applied (epoch seconds; None: not recorded)."""

    ts: int
    label: int
    event: dict[str, Any]
    started: float | None
    finished: float | None


def pushed_by_key(group: GroupSpec, pushed: Iterable[PushedEvent], cut_us: int
                  ) -> dict[tuple[str, ...], list[PushedEvent]]:
    """The pushed events from ``cut_us`` on (an output's cut: the earlier ones are in its
    batch) by their key in ``group``; an event without the group's key columns counts for
    none."""
    by_key: dict[tuple[str, ...], list[PushedEvent]] = {}
    for event in pushed:
        own = group.key_of(event.event)
        if event.ts >= cut_us and own is not None:
            by_key.setdefault(own, []).append(event)
    return by_key


def applied_events(pushed: Iterable[PushedEvent], moment: float
                   ) -> list[tuple[int, dict[str, Any]]] | None:
    """The events of ``pushed`` the stream had applied at ``moment`` (epoch seconds), as
    :func:`value_at` reads them; None when one of them was being applied then or has no
    recorded times (what it served then cannot be settled)."""
    applied = []
    for event in pushed:
        if (event.started is None or event.finished is None
                or event.started <= moment < event.finished):
            return None
        if event.finished <= moment:
            applied.append((event.ts, {**event.event, LABEL: event.label}))
    return applied


def fold(operation: Operation, events: Iterable[tuple[int, Any]]) -> Partial:
    """The partial of (ts µs, value) pairs; None values are skipped (accepted events hold no
    NaN: validation quarantines it)."""
    partial = operation.init()
    for ts, value in events:
        if value is not None:
            partial = operation.add(partial, ts, value)
    return partial


def tile_start(ts: int, hop: int) -> int:
    """The start (µs) of the tile of ``hop`` seconds holding an event at ``ts`` (µs)."""
    return time_rule.floor_to(ts, hop * MICROS)


def tiles(operation: Operation, window: Window,
          events: Iterable[tuple[int, Any]]) -> dict[int, Partial]:
    """Per tile of the window's hop (its start in µs; one tile for the lifetime), the partial
    of its events."""
    by_tile: dict[int, list[tuple[int, Any]]] = {}
    for ts, value in events:
        start = 0 if window.hop is None else tile_start(ts, window.hop)
        by_tile.setdefault(start, []).append((ts, value))
    return {start: fold(operation, members) for start, members in by_tile.items()}


def merge_tiles(operation: Operation, window: Window, by_tile: Mapping[int, Partial],
                t: int) -> Partial:
    """The partial at ``t`` (µs) from a key's tiles: those from the window's start to the tile
    of ``t``, merged."""
    start = window.start(t)
    partial = operation.init()
    for tile, member in by_tile.items():
        if (start is None or tile >= start) and tile <= t:
            partial = operation.merge(partial, member)
    return partial


def value_from_tiles(operation: Operation, window: Window, by_tile: Mapping[int, Partial],
                     t: int) -> Any:
    """The value at ``t`` (µs) from a key's tiles. Exact when no event of the tile of ``t`` is
    at or after ``t``: serving at the request time; the batch splits that tile, merging the
    tiles before it with the partial of its events before ``t`` (docs/ARCHITECTURE.md)."""
    return operation.finish(merge_tiles(operation, window, by_tile, t))
