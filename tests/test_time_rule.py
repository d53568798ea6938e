"""The rule of time (core/time_rule.py): the same values on Python integers and on Spark
columns, against the definition written with floors; and no other module rounds a time to a
hop itself."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from featureline.core import time_rule

REPO = Path(__file__).resolve().parent.parent
MICROS = 1_000_000
HOPS = [60 * MICROS, 300 * MICROS, 3_600 * MICROS, 86_400 * MICROS]
# Times around 2026 and before 1970 (Spark's % keeps the dividend's sign), lengths of windows.
TIMES = st.integers(-10**16, 4 * 10**15)
CASES = st.tuples(TIMES, TIMES, st.sampled_from(HOPS),
                  st.integers(6, 60)).map(lambda c: (c[0], c[1], c[2], c[2] * c[3]))


@given(CASES)
def test_the_rule_on_integers_is_its_definition(case):
    ts, t, hop, length = case
    assert time_rule.floor_to(t, hop) == t // hop * hop
    assert time_rule.window_start(t, length, hop) == (t - length) // hop * hop
    assert time_rule.expires(ts, length, hop) == ts // hop * hop + hop + length
    start = (t - length) // hop * hop
    assert time_rule.covers(ts, t, length, hop) == (start <= ts < t)
    assert time_rule.covers(ts, t, None, None) == (ts < t)
    # An event counts until it expires, and not from then on.
    assert time_rule.covers(ts, time_rule.expires(ts, length, hop) - 1, length, hop) == (
        ts < time_rule.expires(ts, length, hop) - 1)
    assert not time_rule.covers(ts, time_rule.expires(ts, length, hop), length, hop)


@settings(max_examples=1, deadline=None)
@given(st.lists(CASES, min_size=60, max_size=60))
def test_the_rule_on_columns_equals_the_rule_on_integers(spark, cases):
    frame = spark.createDataFrame(cases, "ts long, t long, hop long, length long")
    by_case = {}
    for hop in HOPS:
        for length in {c[3] for c in cases if c[2] == hop}:
            part = frame.where((F.col("hop") == hop) & (F.col("length") == length))
            got = part.select(
                "ts", "t", time_rule.floor_to(F.col("t"), hop).alias("floor"),
                time_rule.floor_to(F.col("t"), F.col("hop")).alias("floor_by_column"),
                time_rule.window_start(F.col("t"), length, hop).alias("start"),
                time_rule.expires(F.col("ts"), length, hop).alias("expires"),
                time_rule.covers(F.col("ts"), F.col("t"), length, hop).alias("covers"),
                time_rule.next_midnight(F.col("t")).alias("midnight")).collect()
            for row in got:
                by_case[(row["ts"], row["t"], hop, length)] = (
                    row["floor"], row["floor_by_column"], row["start"], row["expires"],
                    row["covers"], row["midnight"])
    for ts, t, hop, length in cases:
        expected = time_rule.floor_to(t, hop)
        assert by_case[(ts, t, hop, length)] == (
            expected, expected, time_rule.window_start(t, length, hop),
            time_rule.expires(ts, length, hop), time_rule.covers(ts, t, length, hop),
            time_rule.next_midnight(t)), (ts, t, hop, length)


# A time rounded to a hop by hand: pmod of anything but a hash, floor of a quotient, or
# ``x // step ... * step``.
HAND_ROUNDED = [
    re.compile(r"pmod\((?!\s*F\.xxhash64)"),
    re.compile(r"floor\([^()\n]*(\([^()\n]*\)[^()\n]*)*/"),
    re.compile(r"//\s*(\w+)\b[^\n]*\*\s*\1\b"),
]
PACKAGES = ("core", "etl", "stream", "feature_store", "api", "hps", "trainer", "featureline")
# Lines that round something other than a time: an embedding's width to whole rows.
NOT_TIMES = {"etl/embedding_plan.py": ["return -(-width // per_row) * per_row"]}


def _hand_rounded(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()
            if any(pattern.search(line) for pattern in HAND_ROUNDED)]


def test_only_the_time_rule_rounds_a_time_to_a_hop():
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative != "core/time_rule.py":
                found[relative] = _hand_rounded(path.read_text())
    assert {path: lines for path, lines in found.items() if lines} == NOT_TIMES


def test_the_grep_finds_each_hand_rounding():
    assert _hand_rounded("start = back - F.pmod(back, F.lit(hop))")
    assert _hand_rounded("day = (F.floor(F.col(TS_MICROS) / DAY) * DAY).cast('long')")
    assert _hand_rounded("t = (max(starts) // DAY_US + 1) * DAY_US")
    assert _hand_rounded("return ts // step * step")
    assert not _hand_rounded("F.pmod(F.xxhash64(*columns), F.lit(self.buckets))")
    assert not _hand_rounded("return -(-max(spans, default=0) * MICROS // DAY)")
