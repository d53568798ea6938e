"""Features as definitions: the ``aggregations:`` spec, the rule of time, and the one engine of
partial aggregates every executor calls (docs/ARCHITECTURE.md, "Features as definitions").

A **group** is one entity kind: its ``keys`` (raw event columns: ``[user_id]``,
``[user_id, category]``) and its features. A **feature** is an operation over an optional
column, for the events an optional filter keeps (the label rule's syntax, or ``label``), over
one or more windows. Its output names are ``<name>_<window>`` (``name``: ``<op>``, or
``<column>_<op>`` with a column, unless given; no window → the lifetime, no suffix).

**The rule of time.** The value at time ``t`` aggregates the key's events with ``ts`` in
``[start, t)``, ``start = floor((t − window) / hop) · hop``: a window covers at most one hop
more than its length, its start moves a hop at a time, and an idle key decays (its ``1h``
count reads 0 an hour or so after its last event). The ``all`` window has no start.
:func:`hop_seconds` picks the hop: 5 minutes for windows up to a day, an hour up to 14 days,
a day beyond; a feature's ``hop`` overrides it, within a sixth of its window.

**The engine.** Each operation owns its *partial aggregate* — ``init`` / ``add`` / ``merge``
/ ``finish`` over JSON-able values — so the events of one hop fold into a *tile*, tiles
merge in any order, and the same functions serve the batch's tiles, the stream's updates
and the API's read-time merge. Events missing the operation's column are skipped (``count``
without a column counts every event the filter keeps).
"""

from __future__ import annotations

import functools
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pydantic import Field, field_validator, model_validator

from featureline.core.events import EventContract, LabelSpec, matcher, parse_rule
from featureline.core.settings import Settings, duration_seconds

ALL = "all"
LABEL = "label"
MICROS = 1_000_000
# Hops by window length: (longest window, hop), in seconds.
HOPS = ((86_400, 300), (14 * 86_400, 3_600))
LONG_HOP = 86_400
# A window spans at least this many hops, so its start moves by at most a sixth of it.
MIN_HOPS_PER_WINDOW = 6
# approx_distinct's HyperLogLog: 2^14 registers (0.8 % standard error), ranks capped at 40
# (exact far beyond 2^40 distinct values; the sum of 2^(40 − rank) fits a long exactly).
HLL_BITS = 14
HLL_REGISTERS = 1 << HLL_BITS
HLL_MAX_RANK = 40
HLL_ALPHA = 0.7213 / (1 + 1.079 / HLL_REGISTERS)
# Spark's xxhash64 seed.
XXHASH_SEED = 42
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

Partial = Any


class Operation(ABC):
    """One aggregation: its partial aggregate's life (init → add … → merge … → finish)."""

    name: ClassVar[str]
    needs_column: ClassVar[bool] = True

    def __init__(self, k: int | None = None) -> None:
        self.k = k

    @abstractmethod
    def init(self) -> Partial:
        """The partial aggregate of no events."""

    @abstractmethod
    def add(self, partial: Partial, ts: int, value: Any) -> Partial:
        """``partial`` with one more event (``ts`` in microseconds, ``value`` not None)."""

    @abstractmethod
    def merge(self, left: Partial, right: Partial) -> Partial:
        """The partial of both sets of events (commutative and associative)."""

    @abstractmethod
    def finish(self, partial: Partial) -> Any:
        """The feature value."""

    @abstractmethod
    def from_fields(self, fields: Mapping[str, Any]) -> Partial:
        """The partial from the named fields a table of tiles holds (the batch's columns:
        ``etl.aggregations.output_tiles``); a missing or null field is no events."""

    def to_json(self, partial: Partial) -> Any:
        """The partial as JSON holds it (the online store's tiles)."""
        return partial

    def json_column(self, fields: pa.Table) -> list[Any]:
        """Each row's partial as :meth:`to_json` holds it, from a table of tiles' fields
        (:meth:`from_fields`' names): row by row here, from the columns where an operation
        can (publish encodes every key's tiles)."""
        return [self.to_json(self.from_fields(row)) for row in fields.to_pylist()]

    def from_json(self, stored: Any) -> Partial:
        """The partial :meth:`to_json` stored."""
        return stored


class Count(Operation):
    name = "count"
    needs_column = False

    def init(self) -> int:
        return 0

    def add(self, partial: int, ts: int, value: Any) -> int:
        return partial + 1

    def merge(self, left: int, right: int) -> int:
        return left + right

    def finish(self, partial: int) -> int:
        return partial

    def from_fields(self, fields: Mapping[str, Any]) -> int:
        return int(fields.get("n") or 0)

    def json_column(self, fields: pa.Table) -> list[Any]:
        return _filled(fields, "n", 0, pa.int64())


class Sum(Operation):
    name = "sum"

    def init(self) -> float:
        return 0.0

    def add(self, partial: float, ts: int, value: float) -> float:
        return partial + value

    def merge(self, left: float, right: float) -> float:
        return left + right

    def finish(self, partial: float) -> float:
        return partial

    def from_fields(self, fields: Mapping[str, Any]) -> float:
        return float(fields.get("s") or 0.0)

    def json_column(self, fields: pa.Table) -> list[Any]:
        return _filled(fields, "s", 0.0, pa.float64())


class Mean(Operation):
    """Partial: [sum, count]; no events → None."""

    name = "mean"

    def init(self) -> list[float]:
        return [0.0, 0]

    def add(self, partial: list[float], ts: int, value: float) -> list[float]:
        return [partial[0] + value, partial[1] + 1]

    def merge(self, left: list[float], right: list[float]) -> list[float]:
        return [left[0] + right[0], left[1] + right[1]]

    def finish(self, partial: list[float]) -> float | None:
        return partial[0] / partial[1] if partial[1] else None

    def from_fields(self, fields: Mapping[str, Any]) -> list[float]:
        return [float(fields.get("s") or 0.0), int(fields.get("n") or 0)]

    def json_column(self, fields: pa.Table) -> list[Any]:
        return [list(pair) for pair in zip(_filled(fields, "s", 0.0, pa.float64()),
                                           _filled(fields, "n", 0, pa.int64()), strict=True)]


class _Extreme(Operation):
    """Partial: the value, or None for no events."""

    pick: ClassVar[Any]

    def init(self) -> Any:
        return None

    def add(self, partial: Any, ts: int, value: Any) -> Any:
        return value if partial is None else type(self).pick(partial, value)

    def merge(self, left: Any, right: Any) -> Any:
        if left is None or right is None:
            return right if left is None else left
        return type(self).pick(left, right)

    def finish(self, partial: Any) -> Any:
        return partial

    def from_fields(self, fields: Mapping[str, Any]) -> Any:
        return fields.get("m")

    def json_column(self, fields: pa.Table) -> list[Any]:
        if "m" not in fields.column_names:
            return [None] * fields.num_rows
        return fields["m"].to_pylist()


class Min(_Extreme):
    name = "min"
    pick = min


class Max(_Extreme):
    name = "max"
    pick = max


class Last(Operation):
    """Partial: [ts, value] of the latest event (equal times: the greater value), or None."""

    name = "last"

    def init(self) -> list[Any] | None:
        return None

    def add(self, partial: list[Any] | None, ts: int, value: Any) -> list[Any] | None:
        return self.merge(partial, [ts, value])

    def merge(self, left: list[Any] | None, right: list[Any] | None) -> list[Any] | None:
        if left is None or right is None:
            return right if left is None else left
        return max(left, right)

    def finish(self, partial: list[Any] | None) -> Any:
        return None if partial is None else partial[1]

    def from_fields(self, fields: Mapping[str, Any]) -> list[Any] | None:
        pair = fields.get("p")
        return None if pair is None else [pair["ts"], pair["v"]]


class LastK(Operation):
    """Partial: the latest ``k`` [ts, value] pairs, newest first (equal times: the greater
    value first); finished: their values."""

    name = "last_k"

    def init(self) -> list[list[Any]]:
        return []

    def add(self, partial: list[list[Any]], ts: int, value: Any) -> list[list[Any]]:
        return self.merge(partial, [[ts, value]])

    def merge(self, left: list[list[Any]], right: list[list[Any]]) -> list[list[Any]]:
        return sorted([*left, *right], reverse=True)[: self.k]

    def finish(self, partial: list[list[Any]]) -> list[Any]:
        return [value for _, value in partial]

    def from_fields(self, fields: Mapping[str, Any]) -> list[list[Any]]:
        return self.merge([], [[pair["ts"], pair["v"]] for pair in fields.get("p") or []])


class ApproxDistinct(Operation):
    """HyperLogLog over xxhash64 (Spark's ``xxhash64``, seed 42, of the value's UTF-8 text):
    partial {register: rank}, merged by the greater rank; finished: :func:`hll_estimate`.

    Written here rather than taken from a sketch library: the merge is an exact maximum, so
    the batch and the online store agree to the bit in any order (Apache DataSketches'
    union depends on the order of its inputs), and Spark builds the same registers with
    built-in functions the GPU runs (docs/ARCHITECTURE.md, "Features as definitions")."""

    name = "approx_distinct"

    def init(self) -> dict[int, int]:
        return {}

    def add(self, partial: dict[int, int], ts: int, value: Any) -> dict[int, int]:
        register, rank = hll_register(value if isinstance(value, str) else str(value))
        if partial.get(register, 0) < rank:
            partial = {**partial, register: rank}
        return partial

    def merge(self, left: dict[int, int], right: dict[int, int]) -> dict[int, int]:
        merged = dict(left)
        for register, rank in right.items():
            if merged.get(register, 0) < rank:
                merged[register] = rank
        return merged

    def finish(self, partial: dict[int, int]) -> int:
        return hll_estimate(partial)

    def from_fields(self, fields: Mapping[str, Any]) -> dict[int, int]:
        return dict(zip(fields.get("registers") or [], fields.get("ranks") or [],
                        strict=True))

    def json_column(self, fields: pa.Table) -> list[Any]:
        if "registers" not in fields.column_names:
            return [[] for _ in range(fields.num_rows)]
        return [sorted([register, rank] for register, rank
                       in dict(zip(registers or [], ranks or [], strict=True)).items())
                for registers, ranks in zip(fields["registers"].to_pylist(),
                                            fields["ranks"].to_pylist(), strict=True)]

    def to_json(self, partial: dict[int, int]) -> list[list[int]]:
        """[register, rank] pairs: JSON's object keys are text."""
        return sorted([register, rank] for register, rank in partial.items())

    def from_json(self, stored: list[list[int]]) -> dict[int, int]:
        return {register: rank for register, rank in stored}


def _filled(fields: pa.Table, name: str, empty: Any, dtype: pa.DataType) -> list[Any]:
    """A column of a table of tiles' fields as Python values of ``dtype``, a null or missing
    field ``empty`` (no events)."""
    if name not in fields.column_names:
        return [empty] * fields.num_rows
    return pc.fill_null(fields[name].cast(dtype), empty).to_numpy().tolist()


def hll_register(text: str) -> tuple[int, int]:
    """The register (the hash's low :data:`HLL_BITS` bits) and rank (1 + the trailing zeros
    of the rest, at most :data:`HLL_MAX_RANK`) of one value."""
    import xxhash

    hashed = xxhash.xxh64_intdigest(text.encode(), seed=XXHASH_SEED)
    rest = hashed >> HLL_BITS
    rank = (rest & -rest).bit_length() if rest else HLL_MAX_RANK
    return hashed & (HLL_REGISTERS - 1), min(rank, HLL_MAX_RANK)


def hll_estimate(registers: Mapping[int, int]) -> int:
    """The distinct count the registers estimate: HyperLogLog's harmonic mean, linear
    counting while it is below 2.5 × registers and some register is empty. The sum of
    2^(max rank − rank) is an exact integer, so Spark's sum equals this one."""
    empty = HLL_REGISTERS - len(registers)
    powers = sum(1 << (HLL_MAX_RANK - rank) for rank in registers.values())
    harmonic = (empty * (1 << HLL_MAX_RANK) + powers) / float(1 << HLL_MAX_RANK)
    raw = HLL_ALPHA * HLL_REGISTERS * HLL_REGISTERS / harmonic
    if raw <= 2.5 * HLL_REGISTERS and empty:
        return round(HLL_REGISTERS * math.log(HLL_REGISTERS / empty))
    return round(raw)


OPERATIONS: dict[str, type[Operation]] = {
    op.name: op for op in (Count, Sum, Mean, Min, Max, Last, LastK, ApproxDistinct)}
OpName = Literal["count", "sum", "mean", "min", "max", "last", "last_k", "approx_distinct"]


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

    def constant_until(self, t: int) -> int | None:
        """The first time after ``t`` (µs) at which the window's value from unchanged tiles may
        differ from its value at ``t``: its start moves a hop on, or ``t`` reaches the start
        of a tile (a tile counts once it has started); None: never (the lifetime window)."""
        if self.hop is None:
            return None
        hop = self.hop * MICROS
        until = t // hop * hop + hop
        if self.seconds is not None:
            length = self.seconds * MICROS
            until = min(until, (t - length) // hop * hop + hop + length)
        return until

    def start(self, t: int) -> int | None:
        """The first microsecond of the window's events at ``t`` (µs); None: no start."""
        if self.seconds is None or self.hop is None:
            return None
        hop = self.hop * MICROS
        return (t - self.seconds * MICROS) // hop * hop

    def expires(self, ts: int) -> int | None:
        """The first time (µs) at which an event at ``ts`` no longer counts (a hop after the
        window's length past its tile's start); None: it always counts."""
        if self.seconds is None or self.hop is None:
            return None
        return tile_start(ts, self.hop) + (self.hop + self.seconds) * MICROS

    def covers(self, ts: int, t: int) -> bool:
        """Whether an event at ``ts`` counts in the value at ``t`` (both µs)."""
        start = self.start(t)
        return ts < t and (start is None or ts >= start)


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

    # The operation: count, sum, mean, min, max, last, last_k, approx_distinct.
    op: OpName
    # The event column it reads (a raw column, or ``label``); count needs none.
    column: str | None = None
    # Output name before the window suffix; default <op>, or <column>_<op>.
    name: str | None = None
    # Which events count: the label rule's syntax ("event_type in (purchase)"), or "label".
    filter: str | None = None
    # Durations (30m, 1h, 7d) or "all"; none: the lifetime, without a suffix.
    windows: list[str] = Field(default_factory=list)
    # How many values last_k keeps.
    k: int | None = Field(default=None, ge=1)
    # Overrides the windows' default hop (a sixth of the window at most).
    hop: str | None = None

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
        if (self.op == "last_k") != (self.k is not None):
            raise ValueError("k: last_k needs k, and only last_k takes it")
        if self.name is not None and not _NAME.match(self.name):
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
    name: str
    # The raw columns whose values key it (user_id; [user_id, category]).
    keys: list[str] = Field(min_length=1)
    # Its features.
    features: list[FeatureSpec] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError(f"{name!r} must be lower case letters, digits and _")
        return name

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
    have (or ``label``); approx_distinct over a text column. ValueError naming ``[i].…``
    otherwise."""
    known = {*contract.columns, LABEL}
    numeric = {*contract.numeric, LABEL, "ts"}
    names: dict[str, int] = {}
    for g, group in enumerate(groups):
        if group.name in names:
            raise ValueError(f"[{g}].name: group {group.name} is also [{names[group.name]}]")
        if group.name in ENTITIES:
            raise ValueError(f"[{g}].name: {group.name} is the {group.name} table's group; "
                             f"name it otherwise (not one of {sorted(ENTITIES)})")
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
            if feature.op == "approx_distinct" and feature.column in numeric:
                raise ValueError(f"[{g}].features[{f}].column: approx_distinct counts text "
                                 f"values; {feature.column!r} is a number")


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
        return operation_of(self.spec.op, self.spec.k)


@functools.cache
def operation_of(op: str, k: int | None) -> Operation:
    """The operation ``op`` (with ``k``): one object per pair, operations hold no state."""
    return OPERATIONS[op](k)


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
    them: (ts µs, the columns the group reads and ``label``)."""
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
    step = hop * MICROS
    return ts // step * step


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
