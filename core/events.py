"""The raw event: its columns, the checks that accept or quarantine it, and the label rule —
one definition for the batch ETL (Spark, ``etl/ingest.py``) and for events pushed to the API
one at a time (docs/ARCHITECTURE.md, "Raw events").

:data:`CHECKS` is the validator: each check's reason code, the field it names and what it
tests, in the order they run; a row's first failing check is its reason. The ETL builds its
Spark expression chain from this list (a Spark column per ``test``), :func:`validate_event`
evaluates the same list on one decoded JSON object. Where the two engines parse text (a
timestamp, a number), the parsers agree on the inputs ``tests/test_events.py`` lists.

An ETL output records the contract its events were validated under (``metadata.json``'s
``events``: :class:`EventContract`), so that a process serving that output validates and
labels pushed events exactly as the batch did.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

ROLES = ("user_id", "item_id", "event_type", "ts", "value")
REQUIRED_ROLES = ("user_id", "item_id", "event_type", "ts")
# The type of every event of a log without an event type column (its contract's typed_events).
UNTYPED_EVENT = "event"
# Numeric timestamps at or above this are milliseconds under ts_unit: auto (year 5138 in s).
MILLIS_THRESHOLD = 1e11
# Epoch times beyond this many microseconds (the threshold in seconds) are unreadable.
MAX_EPOCH_MICROS = MILLIS_THRESHOLD * 1_000_000
# Epoch seconds / milliseconds: plain decimals, or the exponent form in which Spark's JSON
# reader hands a JSON float to a string column (Java's Double.toString: 1.764085000123E9).
EPOCH_PATTERN = r"^[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?$"
_EPOCH = re.compile(EPOCH_PATTERN)
# What a number's text may hold, as Spark's string → double cast reads it (Python's float()
# also takes digit separators, which Spark does not).
_DECIMAL = re.compile(r"^([+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?)[dDfF]?$")
_SPECIAL = re.compile(r"^[+-]?(nan|inf|infinity)$", re.IGNORECASE)


@dataclass(frozen=True)
class Check:
    """``reason``: the quarantine code; ``field``: the column it names (a role, or
    ``@numeric`` for each numeric column); ``test``: what fails it."""

    reason: str
    field: str | None
    test: Literal["malformed", "missing", "bad_timestamp", "out_of_window", "unknown_value",
                  "bad_number", "non_finite"]


NUMERIC = "@numeric"
CHECKS: tuple[Check, ...] = (
    Check("malformed_record", None, "malformed"),
    *(Check(f"missing_{role}", role, "missing") for role in REQUIRED_ROLES),
    Check("bad_timestamp", "ts", "bad_timestamp"),
    Check("timestamp_out_of_window", "ts", "out_of_window"),
    Check("unknown_event_type", "event_type", "unknown_value"),
    Check("bad_number", NUMERIC, "bad_number"),
    Check("non_finite_number", NUMERIC, "non_finite"),
)
# Reason codes, in the order the checks run; metadata.json counts rows by these.
REASONS = tuple(check.reason for check in CHECKS)


class LabelSpec(BaseModel):
    """``column op value``: 1 where an event matches, else 0 (a missing value never
    matches)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    column: str
    op: Literal[">=", ">", "<=", "<", "==", "!=", "in"]
    value: float | str | list[str | float]


_COMPARISON = re.compile(r"^\s*(\w+)\s*(>=|<=|==|!=|>|<)\s*([^<>=!\s].*?)\s*$")
_MEMBERSHIP = re.compile(r"^\s*(\w+)\s+in\s*[(\[](.*)[)\]]\s*$", re.IGNORECASE)


def _literal(text: str) -> str | float:
    text = text.strip().strip("'\"")
    try:
        return float(text)
    except ValueError:
        return text


def parse_rule(expression: str) -> LabelSpec:
    """``value >= 4`` or ``event_type in (click, purchase)`` → a rule (the label's and the
    aggregations' filters); ValueError saying what is wrong."""
    membership = _MEMBERSHIP.match(expression)
    if membership:
        items = [_literal(part) for part in membership.group(2).split(",") if part.strip()]
        if not items:
            raise ValueError(f"{expression!r}: 'in' needs at least one value")
        return LabelSpec(column=membership.group(1), op="in", value=items)
    comparison = _COMPARISON.match(expression)
    if comparison:
        return LabelSpec(column=comparison.group(1),
                         op=comparison.group(2),  # type: ignore[arg-type]
                         value=_literal(comparison.group(3)))
    raise ValueError(f"cannot parse {expression!r}; expected e.g. 'value >= 4' "
                     "or 'event_type in (click, purchase)'")


# When a raw column is known: ``request`` (the caller sends it), ``user`` / ``item`` (an
# attribute of that entity), ``outcome`` (observed after the event).
ColumnRole = Literal["request", "user", "item", "outcome"]


class EventContract(BaseModel):
    """How an output's raw events were read: ``metadata.json``'s ``events``."""

    model_config = ConfigDict(extra="allow", frozen=True)

    event_types: list[str]
    # The accepted time window's bounds; None: unbounded on that side.
    ts_min: datetime | None = None
    ts_max: datetime | None = None
    ts_unit: Literal["auto", "s", "ms"] = "auto"
    future_tolerance_s: float | None = None
    value: bool = True
    # Whether the log has an event type column; False: every event's type is "event".
    typed_events: bool = True
    continuous: list[str] = Field(default_factory=list)
    categorical: list[str] = Field(default_factory=list)
    # When each of those columns is known: etl.source.roles.
    roles: dict[str, ColumnRole] = Field(default_factory=dict)
    label: LabelSpec
    # The entity tables' rolling window ("recent" aggregates), in days.
    recent_days: int = 7

    @property
    def numeric(self) -> list[str]:
        return (["value"] if self.value else []) + self.continuous

    @property
    def columns(self) -> list[str]:
        """The columns of an accepted event, in order (the ETL's ``event_columns``)."""
        return ["user_id", "item_id", "event_type", "ts", *self.numeric, *self.categorical]

    def latest_accepted(self, now: datetime | None = None) -> datetime | None:
        """The end of the accepted time window: ``ts_max``, or ``now`` plus the future
        tolerance when that is earlier; None: unbounded."""
        if self.future_tolerance_s is None:
            return self.ts_max
        now = now or datetime.now(timezone.utc)
        tolerated = now + timedelta(seconds=self.future_tolerance_s)
        return tolerated if self.ts_max is None else min(self.ts_max, tolerated)

    def in_window(self, ts: datetime, now: datetime | None = None) -> bool:
        """Whether an event time is inside the accepted window."""
        end = self.latest_accepted(now)
        return (self.ts_min is None or self.ts_min <= ts) and (end is None or ts < end)


@dataclass(frozen=True)
class Rejection:
    reason: str
    field: str | None


def field_text(value: Any) -> str | None:
    """A decoded JSON member as the text the ETL's JSON reader gives it (a string's content,
    a number's or a boolean's JSON text, an object's JSON); None for null or absent."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return java_double_text(value)
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def java_double_text(value: float) -> str:
    """A JSON number that is not an integer as Spark's JSON reader gives it to a string
    field: Java's ``Double.toString`` (plain from 10^-3 up to 10^7, else ``d.dddE<n>``)."""
    if math.isnan(value) or math.isinf(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if value == 0 or 1e-3 <= abs(value) < 1e7:
        text = repr(value)
        return text if "." in text else f"{text}.0"
    sign, digits, exponent = Decimal(repr(value)).as_tuple()
    shown = "".join(map(str, digits)).rstrip("0") or "0"
    power = len(digits) - 1 + int(exponent)
    return f"{'-' if sign else ''}{shown[0]}.{shown[1:] or '0'}E{power}"


def epoch_micros(number: float, unit: str) -> int | None:
    """Epoch seconds or milliseconds (``unit``: s, ms, or auto by :data:`MILLIS_THRESHOLD`)
    → microseconds, rounded half up (a float's decimal digits kept to the microsecond: a
    truncation turns 1764085000.123 into ...122999); None when not finite or too large. The
    ETL's ``_timestamp`` does the same arithmetic on Spark columns."""
    millis = unit == "ms" or (unit == "auto" and abs(number) >= MILLIS_THRESHOLD)
    micros = number * (1_000 if millis else 1_000_000)
    if math.isnan(micros) or abs(micros) >= MAX_EPOCH_MICROS:
        return None
    return math.floor(micros + 0.5)


def parse_timestamp(text: str, unit: str) -> datetime | None:
    """ISO-8601 text or epoch seconds / milliseconds → an aware UTC time to the microsecond;
    None when unparseable (the ETL's ``_timestamp``)."""
    if _EPOCH.match(text):
        micros = epoch_micros(float(text), unit)
        return None if micros is None else datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(
            microseconds=micros)
    text = text.strip()
    if text.endswith("Z"):  # UTC, as 3.11's fromisoformat reads it; 3.10's reads no "Z"
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:  # the ETL's session time zone
        return parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


def utc(moment: datetime) -> datetime:
    """An aware time as given; a time without a zone, as UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def micros_of(moment: datetime) -> int:
    """An aware time in whole microseconds since the epoch (exact: no float)."""
    return (moment - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)


def parse_number(text: str) -> float | None:
    """A number's text as Spark's string → double cast reads it; None when it cannot."""
    text = text.strip()
    decimal = _DECIMAL.match(text)
    if decimal:
        return float(decimal.group(1))
    return float(text) if _SPECIAL.match(text) else None


def _unquoted(text: str) -> str:
    # A bare NaN/Infinity token in JSON reaches the ETL as its raw text, quotes included.
    return text.strip().strip('"')


def check_fields(check: Check, numeric: list[str]) -> list[str | None]:
    """The columns one check tests: each numeric column for ``@numeric``, else its own."""
    return list(numeric) if check.field == NUMERIC else [check.field]


class EventValidator:
    """:data:`CHECKS` for one contract at one moment, set up once for the events of a call:
    ``validator(record)`` is a decoded JSON event's typed columns, or the first check it
    fails."""

    def __init__(self, contract: EventContract, now: datetime | None = None) -> None:
        self.contract = contract
        self.numeric = contract.numeric
        self.categorical = contract.categorical
        self.columns = contract.columns
        self.event_types = frozenset(contract.event_types)
        self.now = now
        self.checks = [(check.reason, name, check.test) for check in CHECKS
                       for name in check_fields(check, self.numeric)]

    def __call__(self, record: Any) -> tuple[dict[str, Any] | None, Rejection | None]:
        if not isinstance(record, Mapping):
            return None, Rejection("malformed_record", None)
        roles = {role: (field_text(record.get(role)) or "").strip() for role in REQUIRED_ROLES}
        if not self.contract.typed_events:
            roles["event_type"] = UNTYPED_EVENT
        numbers_text = {n: _number_text(record.get(n)) for n in self.numeric}
        numbers = {n: None if t is None else parse_number(t) for n, t in numbers_text.items()}
        ts = parse_timestamp(roles["ts"], self.contract.ts_unit) if roles["ts"] else None
        for reason, name, test in self.checks:
            if self._fails(test, name, roles, ts, numbers_text, numbers):
                return None, Rejection(reason, name)
        event: dict[str, Any] = {"user_id": roles["user_id"], "item_id": roles["item_id"],
                                 "event_type": roles["event_type"], "ts": ts}
        # -0.0 is 0.0, as Spark groups it.
        event.update((n, None if v is None else v + 0.0) for n, v in numbers.items())
        for column in self.categorical:
            value = field_text(record.get(column))
            event[column] = None if value is None else value.strip()
        return {column: event[column] for column in self.columns}, None

    def _fails(self, test: str, name: str | None, roles: dict[str, str], ts: datetime | None,
               numbers_text: dict[str, str | None], numbers: dict[str, float | None]) -> bool:
        if test == "missing":
            return roles[str(name)] == ""
        if test == "bad_timestamp":
            return ts is None
        if test == "out_of_window":
            return ts is not None and not self.contract.in_window(ts, self.now)
        if test == "unknown_value":
            return roles[str(name)] not in self.event_types
        if test == "bad_number":
            return numbers_text[str(name)] not in (None, "") and numbers[str(name)] is None
        if test == "non_finite":
            return not math.isfinite(numbers[str(name)] or 0.0)
        return False  # malformed: a Mapping is not


def validate_event(record: Any, contract: EventContract, now: datetime | None = None
                   ) -> tuple[dict[str, Any] | None, Rejection | None]:
    """One decoded JSON event: its typed columns, or the first check it fails."""
    return EventValidator(contract, now)(record)


def _number_text(value: Any) -> str | None:
    text = field_text(value)
    return None if text is None else _unquoted(text)


def event_line(event: Mapping[str, Any]) -> bytes:
    """A validated event as one JSON line in the raw log's schema (its typed columns in
    order, ``ts`` in ISO-8601 to the microsecond): what the event log carries and the stream
    archive holds. Two events the ETL counts as one — every typed column equal, a missing
    value equal to a missing value — have the same line."""
    return orjson.dumps(event)


def event_digest(line: bytes) -> bytes:
    """The digest of an event's line (:func:`event_line`): equal for exact duplicates."""
    return hashlib.blake2b(line, digest_size=12).digest()


def labeler(contract: EventContract) -> Callable[[Mapping[str, Any]], int]:
    """The ETL's label of an accepted event (``etl/job.py``'s ``label_column``), its
    literals read once: 1 where the event matches the rule, else 0."""
    match = matcher(contract.label, contract)

    def label(event: Mapping[str, Any]) -> int:
        return int(match(event))

    return label


def compares_text(column: str, numeric: Sequence[str]) -> bool:
    """Whether a rule on ``column`` compares text (its literals read as ``label_text``): not
    a number column of the events (``numeric``), the time, or the label (a filter may test
    it). The Spark side (``etl.aggregations``) and :func:`matcher` both ask this."""
    return column not in (*numeric, "ts", "label")


def matcher(rule: LabelSpec, contract: EventContract) -> Callable[[Mapping[str, Any]], bool]:
    """Whether an accepted event matches ``rule`` (a missing value never matches), as the
    ETL's ``label_column`` reads it; its literals read once."""
    categorical = compares_text(rule.column, contract.numeric)
    wanted = rule.value if isinstance(rule.value, list) else [rule.value]
    literals = [label_text(v) if categorical else float(v) for v in wanted]
    compare: Callable[[Any], bool] = {
        "in": lambda value: value in literals,
        ">=": lambda value: value >= literals[0], ">": lambda value: value > literals[0],
        "<=": lambda value: value <= literals[0], "<": lambda value: value < literals[0],
        "==": lambda value: value == literals[0], "!=": lambda value: value != literals[0],
    }[rule.op]

    def matches(event: Mapping[str, Any]) -> bool:
        value = event.get(rule.column)
        return value is not None and compare(value)

    return matches


def label_text(value: str | float) -> str:
    """A label rule's literal compared with a categorical column: ``4.0`` reads ``4``."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
