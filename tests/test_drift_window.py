"""The validation gate's reference window on hand-made day profiles: the days' values pooled
(histograms and value counts added, moments combined as if over every value), and each
day's totals and distributions judged against the spread of the window's own days — uneven
days that are usual for the log pass, a real fault still fails."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from pyspark.sql import functions as F

from featureline.core.drift import (
    NOT_CHECKED,
    ChecksConfig,
    check,
    histogram_index,
    measure,
    robust_spread,
)
from featureline.core.drift_window import pooled, window

# Prices per day as raw values, and the profile entries the ETL would write of them.
RNG = np.random.default_rng(7)


def _day(day: str, events: int, *, label_rate: float = 0.5, prices: np.ndarray | None = None,
         categories: dict[str, int] | None = None) -> dict:
    prices = RNG.lognormal(3, 0.5, events) if prices is None else prices
    bins: dict[str, int] = {}
    for price in prices:
        index = str(math.floor(math.log10(1 + price) * 10))
        bins[index] = bins.get(index, 0) + 1
    categories = categories or {"c0": events // 2, "c1": events - events // 2}
    return {
        "day": day, "day_events": events, "label_rate": label_rate,
        "events_per_day": {day: events},
        "rows": {"read": events, "quarantined": {}},
        "columns": {
            "price": {"kind": "numeric", "source": "raw", "rows": events, "missing": 0.0,
                      "min": float(prices.min()), "max": float(prices.max()),
                      "mean": float(prices.mean()), "std": float(prices.std(ddof=1)),
                      "histogram": bins},
            "category": {"kind": "categorical", "source": "raw", "rows": events,
                         "missing": 0.0, "distinct": len(categories),
                         "top": [[value, count] for value, count in categories.items()]},
        },
    }


def test_pooled_adds_the_days_values():
    prices = [RNG.lognormal(3, 0.5, n) for n in (200, 50, 400)]
    days = [_day(f"2026-01-0{i + 1}", len(p), prices=p, label_rate=rate,
                 categories={"c0": len(p) - 10, "c1": 10})
            for i, (p, rate) in enumerate(zip(prices, (0.2, 0.6, 0.3), strict=True))]
    reference = pooled(days)
    together = np.concatenate(prices)
    price = reference["columns"]["price"]
    assert price["rows"] == 650 and price["missing"] == 0.0
    assert sum(price["histogram"].values()) == 650
    assert price["mean"] == pytest.approx(together.mean())
    assert price["std"] == pytest.approx(together.std(ddof=1))
    assert (price["min"], price["max"]) == (together.min(), together.max())
    assert reference["columns"]["category"]["top"] == [["c0", 620], ["c1", 30]]
    assert reference["columns"]["category"]["distinct"] == 2
    assert reference["window"] == {"first": "2026-01-01", "last": "2026-01-03", "days": 3,
                                   "profiled": 3, "events": 650}
    assert reference["day_events"] == 200 and reference["label_rate"] == 0.3  # medians
    assert [d["events"] for d in reference["days"]] == [200, 50, 400]
    assert len(price["spread"]) == 3 and all(0 < js < 1 for js in price["spread"])


def test_window_keeps_the_last_days_up_to_a_day_and_the_later_profile_of_one():
    days = [_day(f"2026-01-{d:02d}", 100) for d in range(1, 11)]
    again = _day("2026-01-05", 999)
    kept = window([*days, again], 3, until="2026-01-06")
    assert [d["day"] for d in kept] == ["2026-01-04", "2026-01-05", "2026-01-06"]
    assert kept[1]["day_events"] == 999
    assert len(window(days, 14)) == 10


# MovieLens 100K's fourteen days before its last (1998-04-08 to 04-21).
UNEVEN = [345, 117, 108, 347, 36, 177, 229, 368, 387, 696, 248, 98, 193, 120]


def _uneven_window() -> dict:
    return pooled([_day(f"2026-01-{i + 1:02d}", n, label_rate=rate)
                   for i, (n, rate) in enumerate(zip(UNEVEN, [0.35, 0.6, 0.5, 0.55, 0.7, 0.45,
                                                              0.6, 0.5, 0.4, 0.65, 0.55, 0.5,
                                                              0.3, 0.6], strict=True))])


def test_uneven_days_usual_for_the_log_pass_and_a_real_drop_fails():
    """A window of days of 36 to 696 events: a day of 50 is usual; against one day of 120
    (the gate before windows) it would fail; a day of 5 fails."""
    reference = _uneven_window()
    config = ChecksConfig()
    quiet = _day("2026-01-15", 50)
    assert not [b for b in check(quiet, reference, config) if b.check == "volume"]
    one_day = pooled([_day("2026-01-14", 120)])
    assert "volume" in {b.check for b in check(quiet, one_day, config)}
    [volume] = [m for m in measure(_day("2026-01-15", 5), reference, config)
                if m.check == "volume"]
    assert volume.breached and volume.value == pytest.approx(1 - 5 / statistics.median(UNEVEN))
    # The threshold: the window's spread of log counts, 3.5 robust deviations.
    spread = robust_spread([math.log(n) for n in UNEVEN])
    assert volume.threshold == pytest.approx(1 - math.exp(-3.5 * spread), abs=1e-4)


def test_even_days_keep_the_configured_thresholds():
    even = pooled([_day(f"2026-01-{d:02d}", 1000 + d) for d in range(1, 15)])
    measured = {m.check: m for m in measure(_day("2026-01-15", 600), even, ChecksConfig())}
    assert measured["volume"].threshold == 0.5 and not measured["volume"].breached
    assert measured["label_rate"].threshold == 0.5
    low = {m.check: m for m in measure(_day("2026-01-15", 400), even, ChecksConfig())}
    assert low["volume"].breached


def test_a_constant_label_fails_where_the_rate_varies_by_day():
    """Label rates from 0.3 to 0.7 a day: 0.3 passes; every event positive, or none, fails
    (on the log-odds scale a rate of 1 is far from any of them)."""
    reference, config = _uneven_window(), ChecksConfig()
    for rate, refused in ((0.3, False), (0.72, False), (1.0, True), (0.0, True)):
        measured = {m.check: m for m in
                    measure(_day("2026-01-15", 500, label_rate=rate), reference, config)}
        assert measured["label_rate"].breached == refused, (rate, measured["label_rate"])


def test_a_column_whose_days_differ_is_judged_by_their_spread():
    """Prices whose level moves day to day (each day's JS against the others up to ~0.5):
    a day as different as they are passes; prices ×100 (disjoint) fail. With a window of
    like days, the same ordinary-looking day fails."""
    levels = [2.0, 3.5, 2.5, 4.0, 3.0, 2.2, 3.8, 2.8, 3.3, 2.4, 3.6, 2.6, 3.1, 3.9]
    days = [_day(f"2026-01-{i + 1:02d}", 800, prices=RNG.lognormal(level, 0.3, 800))
            for i, level in enumerate(levels)]
    moving = pooled(days)
    assert max(moving["columns"]["price"]["spread"]) > 0.3
    config = ChecksConfig()
    shifted = _day("2026-01-15", 800, prices=RNG.lognormal(4.2, 0.3, 800))
    js = next(m for m in measure(shifted, moving, config) if m.check == "js")
    assert js.value > config.js and js.threshold > js.value and not js.breached
    cents = _day("2026-01-15", 800, prices=RNG.lognormal(3.0, 0.3, 800) * 100)
    assert ("js", "price") in {(b.check, b.column) for b in check(cents, moving, config)}
    steady = pooled([_day(f"2026-01-{i + 1:02d}", 800, prices=RNG.lognormal(3.0, 0.3, 800))
                     for i in range(14)])
    assert ("js", "price") in {(b.check, b.column) for b in check(shifted, steady, config)}


def test_a_window_of_totals_only_checks_the_day_totals():
    """A first run's seeded days (events and label rate, no columns): the volume and label
    rate are checked, no column is."""
    seeded = [{"day": f"2026-01-{d:02d}", "day_events": 1000, "label_rate": 0.5,
               "rows": {"read": 14_000, "quarantined": {}}} for d in range(1, 14)]
    reference = pooled(seeded)
    assert reference["columns"] is None and reference["window"]["profiled"] == 0
    measured = measure(_day("2026-01-15", 100), reference, ChecksConfig())
    assert {m.check for m in measured} == {"volume", "label_rate", "quarantine_rate"}
    assert [m.check for m in measured if m.breached] == ["volume"]


def _occupations(day: int, counts: dict[str, int]) -> dict:
    return _day(f"2026-02-{day:02d}", sum(counts.values()), categories=counts)


def _unseen(breach_or_measure: list, column: str = "category") -> list:
    return [m for m in breach_or_measure if m.check == "unseen" and m.column == column]


def test_new_values_of_an_open_column_are_judged_against_the_windows_rate():
    """Raters' occupations: a few are seen on one day only and days bring new ones, so a day
    with a new rater of a new occupation passes, however many rows they rate; ten new values
    in a day breach; declared closed, the one new value breaches."""
    common = {"student": 120, "other": 80, "engineer": 60}
    days = [_occupations(d, {**common, **extra}) for d, extra in enumerate(
        [{}, {"lawyer": 30}, {}, {"doctor": 40}, {"lawyer": 20}, {}, {"homemaker": 25}], 1)]
    reference = pooled(days)
    occupation = reference["columns"]["category"]
    assert occupation["new_per_day"] == [1, 0, 1, 0, 0, 1]
    assert occupation["once"] == 2 and occupation["days_listed"] == 7  # doctor, homemaker
    newcomer = _occupations(8, {**common, "retired": 160})  # 38 % of the day's rows
    [found] = _unseen(measure(newcomer, reference, ChecksConfig()))
    assert (found.value, found.threshold, found.breached) == (1.0, "0.5 new values a day",
                                                              False)
    # Ten new values in a day, where the window found one every other day: breached.
    flood = _occupations(8, {**common, **{f"new{n}": 5 for n in range(10)}})
    [found] = _unseen(measure(flood, reference, ChecksConfig()))
    assert found.value == 10.0 and found.breached and found.p_value < 1e-4
    declared = ChecksConfig(closed=["category"])
    [found] = _unseen(measure(newcomer, reference, declared))
    assert found.breached and found.value == pytest.approx(160 / 420)


def test_a_domain_the_windows_days_show_closed_breaches_on_a_share_of_new_values():
    days = [_occupations(d, {"mobile": 100, "desktop": 60, "tablet": 20}) for d in range(1, 8)]
    reference = pooled(days)
    assert reference["columns"]["category"]["new_per_day"] == [0] * 6
    flood = _occupations(8, {"mobile": 100, "desktop": 60, "tv": 20})
    [found] = _unseen(measure(flood, reference, ChecksConfig()))
    assert found.breached and found.value == pytest.approx(20 / 180)
    assert found.threshold == ChecksConfig().unseen_share


def test_a_window_of_one_day_does_not_judge_a_users_attribute():
    """The first run's window profiles one day: a new rater's occupation is no fault there;
    the demo's closed columns still are (not attributes), and a declared one is."""
    day = _occupations(1, {"student": 120, "other": 80})
    day["columns"]["category"]["entity"] = "user"
    newcomer = _occupations(2, {"student": 100, "retired": 100})
    assert _unseen(measure(newcomer, day, ChecksConfig())) == []
    [found] = _unseen(measure(newcomer, day, ChecksConfig(closed=["category"])))
    assert found.breached and found.value == 0.5
    del day["columns"]["category"]["entity"]
    [found] = _unseen(measure(newcomer, day, ChecksConfig()))
    assert found.breached


def _ages(day: int, ages: dict[str, float], rows_each: int = 3) -> dict:
    """A day of raters (user → age), each rating ``rows_each`` films: its profile's ``age``
    entry, with how many raters hold each bin (``entity_histogram``)."""
    values = np.repeat(np.array(list(ages.values()), dtype=float), rows_each)
    profile = _day(f"2026-03-{day:02d}", len(values), prices=values)
    age = profile["columns"].pop("price")
    held: dict[str, int] = {}
    for value in ages.values():
        index = str(histogram_index(value))
        held[index] = held.get(index, 0) + 1
    listed: dict[str, int] = {}
    for value in ages.values():
        listed[repr(value)] = listed.get(repr(value), 0) + 1
    profile["columns"]["age"] = {**age, "entity": "user", "entity_histogram": held,
                                 "entity_values": listed}
    profile["columns"]["user_id"] = {"kind": "categorical", "source": "raw", "key": True,
                                     "rows": len(values), "missing": 0.0,
                                     "distinct": len(ages), "top": []}
    return profile


def _beyond(measured: list) -> list:
    return [m for m in measured if m.check == "beyond"]


def test_values_beyond_the_windows_range_breach_by_the_users_holding_them():
    """Raters aged 18 to 60 for two weeks. A day of eight raters each 40 years older breaches
    (the distributions cannot tell from eight); one new 75-year-old who rates 200 films does
    not (one user, however many rows); nor does a day within the range."""
    rng = np.random.default_rng(3)
    days = [_ages(d, {f"u{d}_{n}": float(rng.integers(18, 61)) for n in range(30)})
            for d in range(1, 15)]
    reference = pooled(days)
    assert reference["columns"]["age"]["entities_per_day"] == [30] * 14
    assert (reference["columns"]["age"]["min"], reference["columns"]["age"]["max"]) == (18, 60)
    older = {f"new{n}": 20.0 + 40 + 3 * n for n in range(8)}  # 60 to 81: 7 past 60's bin
    [found] = _beyond(measure(_ages(15, older), reference, ChecksConfig()))
    assert found.breached and found.value == 7.0 and found.p_value < 1e-4
    assert found.threshold == "0.516 of 8 users by chance"
    # Five raters are too few for the distributions, not for this: each 40 years older.
    few = {f"f{n}": age + 40 for n, age in enumerate([25.0, 31.0, 38.0, 44.0, 52.0])}
    measured = measure(_ages(15, few), reference, ChecksConfig())
    assert {m.value for m in measured if m.check == "js"} == {NOT_CHECKED}
    [found] = _beyond(measured)
    assert found.breached and found.value == 5.0
    # A day of too many values to list is judged by the bins beyond the window's: 61 shares
    # 60's bin, so it is not counted there.
    listed_not = _ages(15, older)
    del listed_not["columns"]["age"]["entity_values"]
    [found] = _beyond(measure(listed_not, reference, ChecksConfig()))
    assert found.value == 7.0 and found.breached
    edge = _ages(15, {f"e{n}": 61.0 for n in range(8)})
    [found] = _beyond(measure(edge, reference, ChecksConfig()))
    assert found.value == 8.0 and found.breached
    del edge["columns"]["age"]["entity_values"]
    [found] = _beyond(measure(edge, reference, ChecksConfig()))
    assert found.value == 0.0 and not found.breached
    one = {**{f"u{n}": 30.0 for n in range(20)}, "elder": 75.0}
    [found] = _beyond(measure(_ages(15, one, rows_each=10), reference, ChecksConfig()))
    assert found.value == 1.0 and not found.breached
    within = {f"w{n}": 18.0 + n for n in range(40)}
    [found] = _beyond(measure(_ages(15, within), reference, ChecksConfig()))
    assert found.value == 0.0 and not found.breached
    # Without entity counts (an older output's window), nothing is judged.
    del reference["columns"]["age"]["entities_per_day"]
    assert _beyond(measure(_ages(15, older), reference, ChecksConfig())) == []


def test_a_days_profile_counts_the_users_holding_each_bin_once(spark):
    """``profiles``' ``entity_histogram`` of a user's numeric attribute: per bin, the day's
    distinct users, however many rows each has; the plain histogram counts rows."""
    from featureline.etl.data_profile import profiles

    ages = {f"u{n}": 15 + 4 * n for n in range(12)}
    rows = [(user, f"2026-03-0{day} 1{n % 10}:00:00", float(age), n % 2)
            for day in (1, 2) for user, age in ages.items() for n in range(1 + len(user))]
    events = spark.createDataFrame(rows, "user_id string, ts string, age double, label int"
                                   ).withColumn("ts", F.to_timestamp("ts"))
    days = profiles(events, events.select("ts"), 2, raw_numeric=["age"], raw_categorical=[],
                    feature_numeric=[], feature_categorical=[],
                    rows={"read": len(rows), "quarantined": {}}, entities={"age": "user"})
    expected: dict[str, int] = {}
    for age in ages.values():
        expected[str(histogram_index(age))] = expected.get(str(histogram_index(age)), 0) + 1
    for day in days:
        age = day["columns"]["age"]
        assert age["entity"] == "user" and age["entity_histogram"] == expected
        assert age["entity_values"] == {repr(float(a)): 1 for a in sorted(ages.values())}
        assert sum(age["histogram"].values()) == len(rows) // 2
