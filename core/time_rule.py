"""The rule of time, written once (docs/ARCHITECTURE.md, "The rule of time").

The value of a window at ``t`` aggregates the events with ``ts`` in ``[start, t)``, where
``start = floor((t − length) / hop) · hop``. An event leaves the window a hop after the
window's length past the start of its hop's tile.

Every function takes times as Python integers (the stream, the API, the consistency report)
or as Spark columns (the backfill, the ETL's features, its incremental runs), and is the same
arithmetic on both: no pyspark import, so the API process never loads it. Times, lengths and
hops are microseconds. Only this module rounds a time down to a hop:
``tests/test_time_rule.py`` greps every other module for it.
"""

from __future__ import annotations

from typing import Any

MICROS = 1_000_000
DAY = 86_400 * MICROS

# A time: a Python integer, or a Spark column of longs.
Time = Any


def floor_to(t: Time, step: int | Time) -> Time:
    """``t`` rounded down to a multiple of ``step`` (a number, or a column with a column):
    the start of the hop, or day, holding it. Spark's ``%`` keeps the dividend's sign and
    Python's the divisor's; adding ``step`` once gives the floor's remainder in both, exact
    integer arithmetic the RAPIDS Accelerator runs."""
    return t - (t % step + step) % step


def window_start(t: Time, length: int, hop: int) -> Time:
    """The first microsecond of the events a window ``length`` long, moving by ``hop``,
    aggregates at ``t``."""
    return floor_to(t - length, hop)


def expires(ts: Time, length: int, hop: int) -> Time:
    """The first time at which an event at ``ts`` no longer counts in the window: a hop after
    the window's length past its tile's start (a tile's own start gives its events')."""
    return floor_to(ts, hop) + (hop + length)


def covers(ts: Time, t: Time, length: int | None, hop: int | None) -> Time:
    """Whether an event at ``ts`` counts in the window's value at ``t``; no ``length`` or
    ``hop``: the lifetime, every event before ``t``."""
    before = ts < t
    if length is None or hop is None:
        return before
    return before & (ts >= window_start(t, length, hop))


def constant_until(t: int, length: int | None, hop: int | None) -> int | None:
    """The first time after ``t`` at which the window's value from unchanged tiles may
    differ from its value at ``t``: its start moves a hop on, or ``t`` reaches the start of a
    tile (a tile counts once it has started); None: never (the lifetime window)."""
    if hop is None:
        return None
    until = floor_to(t, hop) + hop
    if length is not None:
        until = min(until, window_start(t, length, hop) + hop + length)
    return until


def next_midnight(t: Time) -> Time:
    """The midnight (UTC) after the day holding ``t``."""
    return floor_to(t, DAY) + DAY
