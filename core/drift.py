"""The data validation gate's checks: a run's profile (``profile.json``, written by the ETL)
against a reference window — the days before it, pooled (``core/drift_window.py``) — and the
breaches they find (docs/ARCHITECTURE.md, "The validation gate").

A profile describes the newest UTC day of an output's events: per raw column and per feature
its rows and missing share, and either a histogram (numbers) or its most frequent values
(text and ids); plus events per day, the label rate and the quarantine's reasons. The checks
compare distributions, not rows: a day whose rows are each valid can still be a bad day.

The day's totals against the window's days — their median, and their spread (so that a log
of uneven days is judged by its own unevenness; Deequ's anomaly strategies do the same):

- ``volume``: the day's events against the median day: 1 − smaller ÷ larger (0.5: half or
  twice as many); allowed: ``volume_change``, or ``spread_z`` robust deviations of the
  window's log counts where that is more;
- ``label_rate``: the day's positive share (relative change), the same way;
- ``quarantine_rate``: the run's share of quarantined rows, against a multiple of the
  window's median (with a floor, so a clean window does not make one bad row a breach).

Each column against the window's pooled values:

- ``schema``: a column added, missing, or of another kind than the window's;
- ``missing``: a column's missing share (absolute change, or what chance allows a small day);
- ``js``: numeric columns, the Jensen–Shannon divergence (base 2, 0 to 1) of their
  histograms. JS rather than PSI: it is bounded and symmetric, and an empty bin on either
  side (prices ×100 move every value into bins the reference never filled) needs no
  smoothing constant, where PSI divides by it;
- ``linf``: categorical columns, the L-infinity distance of the value shares (TFDV's
  comparator: the largest change of any one value's share);
- ``unseen``: categorical columns of a closed domain (the window lists every value, each
  seen often: not ids), the share of the day's values the window never had (a value renamed
  upstream, a flood of a new one);
- ``range``: declared bounds a column's values must stay within.

``js`` and ``linf`` are effect sizes; a day breaches them only where a G-test also finds the
difference significant (``p_value``): a few hundred ratings from a handful of sessions (a
MovieLens day) differ from their window by chance. The test counts at most one value per
user of the day, since a user's events are one session, not independent draws; a day with
fewer than ``min_values`` such values is "not checked (n too small)". The ids of users and
items (the profile marks them ``key``) are never a closed domain.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from pydantic import Field
from scipy.stats import binom, chi2, poisson

from featureline.core.aggregations import ENTITIES
from featureline.core.metadata import ChecksVerdict, Metadata
from featureline.core.settings import Settings

PROFILE_FILE = "profile.json"
# The checks' metrics in Prometheus' text format, beside it (every API process exports them).
METRICS_FILE = "checks.prom"
# The report a person reads, beside it: breaches first, then every column against the
# reference's.
REPORT_FILE = "report.html"
# Every check, in the order the report and the metrics list them.
CHECKS = ("schema", "volume", "missing", "js", "linf", "unseen", "beyond", "label_rate",
          "quarantine_rate", "range")
# The reference's profile at the time of the run, kept beside the run's own.
REFERENCE_PROFILE_FILE = "profile.reference.json"
# Why an output whose day failed was published all the same (featureline publish
# --accept-drift): one JSON line per publish.
ACCEPTED_DRIFT_FILE = "accepted_drift.jsonl"
# Each `featureline validate` of an output, one JSON line per check (its dataset version and
# verdict): the latest stands over the run's own (metadata.json's checks), for publish and
# for the next run's reference.
VERDICTS_FILE = "verdicts.jsonl"
# Histogram bins per decade of |x| (bin = sign(x) · floor(log10(1 + |x|) · BINS_PER_DECADE)):
# one rule for every profile, so any two compare bin for bin.
BINS_PER_DECADE = 10
# The quantiles a profile lists per numeric column, read off its histogram.
QUANTILES = (0.01, 0.25, 0.5, 0.75, 0.99)
# Most frequent values kept per categorical column; the rest are one "other" share. A column
# with no more values than this has them all listed: a closed domain, checked for new values.
TOP_K = 100
OTHER = "__other__"
# The distribution checks' G-test merges cells until each expects this many of the day's
# independent values (Cochran's rule: no expected count under 1).
MIN_EXPECTED = 1
# A column's values are a closed domain when each is seen this many times on average.
CLOSED_DOMAIN_ROWS = 20


class RangeBound(Settings):
    """Bounds a column's values must stay within (either may be left out)."""

    # The smallest allowed value.
    min: float | None = None
    # The largest allowed value.
    max: float | None = None


class ChecksConfig(Settings):
    """The validation gate: each run's newest day against a reference window — the days
    before it (the output the run replaces, or ``reference``'s); a breach fails the run's
    verdict, and publish refuses it."""

    # false: profiles are written, nothing is checked.
    enabled: bool = True
    # A pinned baseline output: its days are the reference window. null: the days before
    # this run's, as the output it replaces kept them (days whose checks failed and were not
    # published with --accept-drift are left out: a bad day sent again fails again).
    reference: str | None = None
    # How many days before the run's day form the reference window, pooled.
    reference_days: int = Field(default=14, ge=1)
    # How far the day's events, label rate and quarantine rate may stray from the window's
    # median, in robust standard deviations of the window's days (1.4826 × their median
    # absolute deviation; events on a log scale). The thresholds below are the least
    # allowed: a window of even days allows them.
    spread_z: float = Field(default=3.5, gt=0)
    # The distribution checks (js, linf) breach only where a G-test of the day's values
    # against the window's finds the difference significant at this level, as well as
    # larger than their threshold: a small day differs from its window by chance.
    p_value: float = Field(default=1e-4, gt=0, lt=1)
    # Each threshold below may be null: that check is not made.
    # Largest change of the day's events against the window's median day,
    # 1 - smaller / larger (0.5: half or twice as many).
    volume_change: float | None = Field(default=0.5, gt=0, lt=1)
    # Largest absolute change of a column's missing share.
    missing_change: float | None = Field(default=0.1, gt=0, le=1)
    # Largest L-infinity distance of a categorical column's value shares.
    linf: float | None = Field(default=0.3, gt=0, le=1)
    # Largest share of a categorical column's values that the window never had (checked
    # where the window lists every value, and never on the ids of users and items).
    unseen_share: float | None = Field(default=0.05, gt=0, le=1)
    # Largest Jensen-Shannon divergence (base 2) of a numeric column's histogram.
    js: float | None = Field(default=0.3, gt=0, le=1)
    # The distribution checks compare a column only where the day has this many independent
    # values: its values, but at most one per user of the day (a user's events are one
    # session, not independent draws). Fewer: "not checked (n too small)".
    min_values: int = Field(default=8, ge=1)
    # Largest relative change of the label rate.
    label_rate_change: float | None = Field(default=0.5, gt=0)
    # The quarantined share may grow to this multiple of the window's median (null: not
    # checked) ...
    quarantine_rate_factor: float | None = Field(default=3.0, gt=1)
    # ... or to this share, whichever is larger.
    quarantine_rate_floor: float = Field(default=0.02, ge=0, le=1)
    # Column → bounds its values must stay within, e.g. {price: {min: 0, max: 10000}}.
    ranges: dict[str, RangeBound] = Field(default_factory=dict)
    # Categorical columns whose values are a closed domain (e.g. [event_type, device]): any
    # share of new values above unseen_share breaches. Other columns are closed only where the
    # window's days show it (no value seen on one day alone, none new day after day); else
    # the day's new values are judged against the rate at which the window found new ones.
    closed: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class Breach:
    """One failed check: which, on which column ("" for the whole day), the value found and
    the threshold it crossed."""

    check: str
    column: str
    value: float | str
    threshold: float | str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        value = f"{self.value:.4g}" if isinstance(self.value, float) else self.value
        where = f" {self.column}" if self.column else ""
        return f"{self.check}{where}: {value} (threshold {self.threshold})"


def bin_edges(index: int) -> tuple[float, float]:
    """The values a histogram bin holds, from its lower to its upper edge (bin 0 holds
    both sides of 0 up to a tenth of a decade)."""
    near, far = (10 ** (abs(index) / BINS_PER_DECADE) - 1,
                 10 ** ((abs(index) + 1) / BINS_PER_DECADE) - 1)
    if index > 0:
        return near, far
    return (-far, -near) if index < 0 else (-far, far)


def quantiles(column: dict[str, Any]) -> dict[str, float | None]:
    """A numeric column's ``QUANTILES`` from its histogram (as Prometheus reads a
    histogram's): linear within the bin that holds each, within the column's min and max —
    as precise as a bin, a tenth of a decade."""
    counts = sorted((int(index), count) for index, count in column["histogram"].items())
    total = sum(count for _, count in counts)
    found: dict[str, float | None] = {}
    for q in QUANTILES:
        name = f"p{round(q * 100)}"
        if not total or column.get("min") is None:
            found[name] = None
            continue
        target, seen = q * total, 0
        for index, count in counts:
            if seen + count >= target:
                low, high = bin_edges(index)
                value = low + (target - seen) / count * (high - low)
                found[name] = min(max(value, column["min"]), column["max"])
                break
            seen += count
    return found


def js_divergence(ours: dict[str, int], theirs: dict[str, int]) -> float:
    """Jensen–Shannon divergence (base 2) of two histograms (bin → count)."""
    total_a, total_b = sum(ours.values()), sum(theirs.values())
    if not total_a or not total_b:
        return 0.0 if total_a == total_b else 1.0
    divergence = 0.0
    for key in set(ours) | set(theirs):
        p, q = ours.get(key, 0) / total_a, theirs.get(key, 0) / total_b
        m = (p + q) / 2
        if p:
            divergence += p / 2 * math.log2(p / m)
        if q:
            divergence += q / 2 * math.log2(q / m)
    return min(max(divergence, 0.0), 1.0)


def linf_distance(ours: dict[str, Any], theirs: dict[str, Any]) -> float:
    """The largest change of one value's share between two categorical columns' profiles
    (their top values, the rest as one share)."""
    def shares(column: dict[str, Any]) -> dict[str, float]:
        top = value_shares(column)
        if top:
            top[OTHER] = max(0.0, 1.0 - sum(top.values()))
        return top

    a, b = shares(ours), shares(theirs)
    # A value among one side's top values only counts as 0 on the other side (an upper
    # bound of the change: its share there is at most that side's smallest top share).
    return max((abs(a.get(value, 0.0) - b.get(value, 0.0))
                for value in (set(a) | set(b)) - {OTHER}), default=0.0)


def value_shares(column: dict[str, Any]) -> dict[str, float]:
    """A categorical column's top values, each as its share of the present values."""
    present = present_values(column)
    return {str(value): count / present for value, count in column["top"]} \
        if present > 0 else {}


def unseen_share(ours: dict[str, Any], theirs: dict[str, Any], declared: bool = False
                 ) -> float | None:
    """The share of a categorical column's values that the reference never had; None unless
    the reference lists all its values, each seen ``CLOSED_DOMAIN_ROWS`` times on average
    (event types, devices, categories — not the ids of users and items, new ones of which
    arrive every day) or the column is ``declared`` a closed domain."""
    distinct = theirs.get("distinct", 0)
    if distinct > len(theirs["top"]) or (
            not declared and present_values(theirs) < CLOSED_DOMAIN_ROWS * distinct):
        return None
    known = {str(value) for value, _ in theirs["top"]}
    present = present_values(ours)
    if present <= 0:
        return 0.0
    listed = sum(count for _, count in ours["top"])
    new = sum(count for value, count in ours["top"] if str(value) not in known)
    # Values beyond our own top list are new ones too unless the reference had them: at most.
    return (new + (present - listed)) / present


def _relative(value: float, reference: float) -> float:
    if reference == 0:
        return 0.0 if value == 0 else math.inf
    return abs(value / reference - 1)


def _volume_change(events: float, reference: float) -> float:
    larger = max(events, reference)
    return 1 - min(events, reference) / larger if larger else 0.0


def quarantine_rate(profile: dict[str, Any]) -> float:
    """The share of the run's rows read that were quarantined."""
    rows = profile["rows"]
    return sum(rows["quarantined"].values()) / rows["read"] if rows["read"] else 0.0


def _logit(rate: float) -> float:
    rate = min(max(rate, 1e-4), 1 - 1e-4)
    return math.log(rate / (1 - rate))


def _sigmoid(value: float) -> float:
    return 1 / (1 + math.exp(-value))


def robust_spread(values: Sequence[float]) -> float:
    """1.4826 × the median absolute deviation: the standard deviation of normal values,
    which one odd day in the window moves little."""
    if len(values) < 2:
        return 0.0
    center = statistics.median(values)
    return 1.4826 * statistics.median(abs(value - center) for value in values)


def homogeneity_p(ours: dict[str, float], theirs: dict[str, float], order: Sequence[str],
                  independent_values: float) -> float:
    """The p-value of a G-test (the likelihood-ratio test of a 2 × k table) that two sets of
    counts (bin or value → count) are draws of one distribution. Cells are merged in
    ``order`` (keys missing from it last) until each expects ``MIN_EXPECTED`` of our values,
    so that sparse cells do not inflate the statistic; the statistic is scaled where our
    counts hold fewer independent values than their sum (``independent_values``)."""
    keys = [*order, *sorted(set(ours) - set(order))]
    a, b = _merged([ours.get(key, 0) for key in keys], [theirs.get(key, 0) for key in keys],
                   MIN_EXPECTED * sum(theirs.values()) / max(independent_values, 1))
    if len(a) < 2 or not a.sum() or not b.sum():
        return 1.0
    total = a + b
    statistic = 0.0
    for counts in (a, b):
        expected = total * counts.sum() / total.sum()
        seen = counts > 0
        statistic += 2 * float(np.sum(counts[seen] * np.log(counts[seen] / expected[seen])))
    weight = independent_values / a.sum()
    return float(chi2.sf(max(statistic, 0.0) * weight, len(a) - 1))


def _merged(ours: Sequence[float], theirs: Sequence[float], least: float
            ) -> tuple[np.ndarray, np.ndarray]:
    """Adjacent cells added together until each of ``theirs`` holds ``least``; the rest
    joins the last."""
    a: list[float] = []
    b: list[float] = []
    held_a = held_b = 0.0
    for mine, other in zip(ours, theirs, strict=True):
        held_a, held_b = held_a + mine, held_b + other
        if held_b >= least:
            a.append(held_a)
            b.append(held_b)
            held_a = held_b = 0.0
    if a:
        a[-1], b[-1] = a[-1] + held_a, b[-1] + held_b
    else:
        a, b = [held_a], [held_b]
    return np.array(a), np.array(b)


def _value_counts(column: dict[str, Any]) -> dict[str, float]:
    """A categorical column's top values' counts, the rest as one count."""
    counts = {str(value): float(count) for value, count in column["top"]}
    rest = present_values(column) - sum(counts.values())
    if rest > 0.5:
        counts[OTHER] = rest
    return counts


def independent(profile: dict[str, Any], count: float) -> float:
    """How many independent values ``count`` values of a day hold: at most one per user of
    the day (a user's events are one session: alike, not independent draws)."""
    users = profile["columns"].get(ENTITIES["user"], {}).get("distinct")
    return min(count, users) if users else count


@dataclass(frozen=True)
class Measurement:
    """One check of one column ("" for the whole day): the value found, the threshold, and
    whether it crossed it; a distribution check's p-value where it made one."""

    check: str
    column: str
    value: float | str
    threshold: float | str
    breached: bool
    p_value: float | None = None

    def breach(self) -> Breach:
        return Breach(self.check, self.column, self.value, self.threshold)


# A distribution check of a column with too few independent values on its day.
NOT_CHECKED = "not checked (n too small)"


def check(profile: dict[str, Any], reference: dict[str, Any] | None,
          config: ChecksConfig) -> list[Breach]:
    """The breaches of ``profile`` against ``reference`` (declared ranges only without one)."""
    return [m.breach() for m in measure(profile, reference, config) if m.breached]


def measure(profile: dict[str, Any], reference: dict[str, Any] | None,
            config: ChecksConfig) -> list[Measurement]:
    """Every check of ``profile`` against ``reference`` — a window's pooled profile
    (``core/drift_window.py``) or one day's — breached or not (declared ranges only without
    one): what the report and the metrics show."""
    found = [*_ranges(profile, config)]
    if reference is None:
        return found
    found += _day_rates(profile, reference, config)
    ours, theirs = profile["columns"], reference["columns"]
    if theirs is None:  # a window of days known by their totals only
        return found
    for name in sorted(set(theirs) - set(ours)):
        found.append(Measurement("schema", name, "missing", "present", True))
    for name in sorted(set(ours) - set(theirs)):
        found.append(Measurement("schema", name, "added", "absent", True))
    for name in sorted(set(ours) & set(theirs)):
        a, b = ours[name], theirs[name]
        if a["kind"] != b["kind"]:
            found.append(Measurement("schema", name, a["kind"], b["kind"], True))
            continue
        found += _column(profile, name, a, b, config)
    return found


def _day_rates(profile: dict[str, Any], reference: dict[str, Any],
               config: ChecksConfig) -> Iterable[Measurement]:
    """The day's events, label rate and quarantine rate against the window's days: each may
    stray from their median by ``spread_z`` robust deviations, or by its threshold where
    that is larger."""
    days = window_days(reference)
    z = config.spread_z
    if config.volume_change is not None:
        counts = [max(day["events"], 1) for day in days]
        allowed = max(-math.log(1 - config.volume_change),
                      z * robust_spread([math.log(count) for count in counts]))
        value = _volume_change(profile["day_events"], statistics.median(counts))
        threshold = round(1 - math.exp(-allowed), 4)
        yield Measurement("volume", "", value, threshold, value > threshold)
    if config.label_rate_change is not None:
        rates = [day["label_rate"] for day in days]
        center, rate = statistics.median(rates), profile["label_rate"]
        # On the log-odds scale, where a rate near 0 or 1 is far: the window's days' spread
        # and the chance a day of so many independent values has.
        chance = 1 / (independent(profile, profile["day_events"])
                      * max(center * (1 - center), 1e-4))
        reach = z * math.sqrt(robust_spread([_logit(r) for r in rates]) ** 2 + chance)
        bound = _sigmoid(_logit(center) + (reach if rate > center else -reach))
        threshold = round(max(config.label_rate_change, _relative(bound, center)), 4)
        value = _relative(rate, center)
        yield Measurement("label_rate", "label", value, threshold, value > threshold)
    if config.quarantine_rate_factor is not None:
        rates = [day["quarantine_rate"] for day in days]
        center = statistics.median(rates)
        threshold = round(max(center * config.quarantine_rate_factor,
                              config.quarantine_rate_floor,
                              center + z * robust_spread(rates)), 6)
        value = quarantine_rate(profile)
        yield Measurement("quarantine_rate", "", value, threshold, value > threshold)


def _column(profile: dict[str, Any], name: str, a: dict[str, Any], b: dict[str, Any],
            config: ChecksConfig) -> Iterable[Measurement]:
    """The checks of one column of the day (``a``) against the window's (``b``)."""
    n = independent(profile, present_values(a))
    if config.missing_change is not None:
        # How far the day's missing share may stray by chance from the window's.
        chance = config.spread_z * math.sqrt(b["missing"] * (1 - b["missing"])
                                             / max(independent(profile, a["rows"]), 1))
        threshold = round(max(config.missing_change, chance), 4)
        value = abs(a["missing"] - b["missing"])
        yield Measurement("missing", name, value, threshold, value > threshold)
    if a.get("key"):  # which users and items come changes every day: ids have no shape
        return
    numeric = a["kind"] == "numeric"
    if numeric:  # counted by users (items), however few: before the day's size is judged
        yield from beyond_range(name, a, b, config)
    made = [("js", config.js)] if numeric else [("linf", config.linf),
                                                ("unseen", config.unseen_share)]
    if n < config.min_values or not present_values(b):
        yield from (Measurement(kind, name, NOT_CHECKED, f"{config.min_values} values", False)
                    for kind, threshold in made if threshold is not None)
        return
    if numeric:
        if config.js is not None:
            bins = sorted({*a["histogram"], *b["histogram"]}, key=int)
            yield _distribution("js", name, js_divergence(a["histogram"], b["histogram"]),
                                a["histogram"], b["histogram"], bins, n, b, config.js, config)
        return
    if config.linf is not None:
        theirs = _value_counts(b)
        yield _distribution("linf", name, linf_distance(a, b), _value_counts(a), theirs,
                            sorted(theirs, key=lambda v: -theirs[v]), n, b, config.linf, config)
    yield from new_values(name, a, b, config)


def new_values(name: str, a: dict[str, Any], b: dict[str, Any], config: ChecksConfig
               ) -> Iterable[Measurement]:
    """The ``unseen`` check of a categorical column (``a``: the day's, ``b``: the window's).

    A closed domain — declared (``checks.closed``), or shown by the window's days: each value
    seen on two days or more and no day bringing a new one — breaches where the share of the
    day's values it never had is above ``unseen_share``. Another column's values arrive as
    new users and items do: the count of the day's new values breaches only where it is
    significant (``p_value``) against the rate at which the window found new ones, the
    larger of the new values per day and Good–Turing's estimate from the values seen on one
    day only (``once`` / days). Either needs a window that lists every value; an attribute of
    users or items (``entity``) is not judged by a window of one day."""
    share, threshold = unseen_share(a, b, declared=name in config.closed), config.unseen_share
    if share is None or threshold is None:
        return
    rate = _discovery_rate(b)
    if rate is None and b.get("entity") and name not in config.closed:
        return  # one day cannot tell a new user's (item's) value from a new value
    if name in config.closed or not rate:
        yield Measurement("unseen", name, share, threshold, share > threshold)
        return
    known = {str(value) for value, _ in b["top"]}
    new = sum(1 for value, _ in a["top"] if str(value) not in known)
    new += max(a.get("distinct", 0) - len(a["top"]), 0)  # beyond the day's list: at most
    p = float(poisson.sf(new - 1, rate)) if new else 1.0
    yield Measurement("unseen", name, float(new), f"{rate:.3g} new values a day",
                      p < config.p_value, p)


def beyond_range(name: str, a: dict[str, Any], b: dict[str, Any], config: ChecksConfig
                 ) -> Iterable[Measurement]:
    """The ``beyond`` check of a numeric attribute of users or items (``a``: the day's,
    ``b``: the window's): how many of the day's users (items) hold a value below the
    window's least or above its largest (``entity_values``; where the day has too many
    values to list, a value in a histogram bin beyond every bin the window reaches). A
    user's value drawn as the window's were lies beyond their range with a chance of at most
    2 / (users + 1), the users being the most the window saw on one day (fewer than it saw
    in all: a larger chance, a safer bound); the count breaches where a binomial test finds
    it significant (``p_value``), however few the day's users: a day of a few raters each
    40 years older breaches here where the distribution checks need more values."""
    held, per_day = a.get("entity_histogram"), b.get("entities_per_day")
    if not held or not per_day or b.get("min") is None:
        return
    values = a.get("entity_values")
    if values is not None:
        beyond = sum(count for value, count in values.items()
                     if not b["min"] <= float(value) <= b["max"])
    else:
        low, high = histogram_index(b["min"]), histogram_index(b["max"])
        beyond = sum(count for index, count in held.items() if not low <= int(index) <= high)
    users = sum(held.values())
    chance = min(1.0, 2 / (max(per_day) + 1))
    p = float(binom.sf(beyond - 1, users, chance)) if beyond else 1.0
    yield Measurement("beyond", name, float(beyond),
                      f"{chance * users:.3g} of {users} {a.get('entity', 'entity')}s by chance",
                      p < config.p_value, p)


def histogram_index(value: float) -> int:
    """The histogram bin of a number, as the profile's Spark column computes it."""
    return int(math.copysign(math.floor(math.log10(abs(value) + 1) * BINS_PER_DECADE), value)
               if value else 0)


def _discovery_rate(window: dict[str, Any]) -> float | None:
    """New values a day the window's days show: None where they cannot tell (one day)."""
    per_day = window.get("new_per_day")
    if not per_day:
        return None
    return max(statistics.mean(per_day), window.get("once", 0) / window["days_listed"])


def _distribution(kind: str, name: str, value: float, ours: dict[str, Any],
                  theirs: dict[str, Any], order: Sequence[str], n: float,
                  window: dict[str, Any], threshold: float,
                  config: ChecksConfig) -> Measurement:
    """A distribution check: breached where ``value`` (the effect) is above the threshold
    the window allows and the G-test of the day's ``n`` independent values finds the
    difference significant."""
    p = homogeneity_p(ours, theirs, order, n)
    allowed = _allowed(threshold, window, config)
    return Measurement(kind, name, value, allowed, value > allowed and p < config.p_value, p)


def _allowed(threshold: float, window: dict[str, Any], config: ChecksConfig) -> float:
    """A distribution check's threshold on a column of the window: ``threshold``, or, where
    the window's own days differ from one another more (their ``spread``: each day against
    the others), ``spread_z`` robust deviations above their median."""
    spread = window.get("spread") or []
    if not spread:
        return threshold
    return round(max(threshold, statistics.median(spread)
                     + config.spread_z * robust_spread(spread)), 4)


def day_summary(profile: dict[str, Any]) -> dict[str, Any]:
    """A day's totals, as a window lists its days: events, label rate, quarantine rate."""
    return {"day": profile["day"], "events": profile["day_events"],
            "label_rate": profile["label_rate"], "quarantine_rate": quarantine_rate(profile)}


def window_days(reference: dict[str, Any]) -> list[dict[str, Any]]:
    """The days of a reference window (``drift_window.pooled``'s ``days``); a single day's
    profile is a window of one."""
    return reference.get("days") or [day_summary(reference)]


def present_values(column: dict[str, Any]) -> float:
    """A column's present values on its day."""
    return column["rows"] * (1 - column["missing"])


def _ranges(profile: dict[str, Any], config: ChecksConfig) -> Iterable[Measurement]:
    for name, bound in sorted(config.ranges.items()):
        column = profile["columns"].get(name)
        if column is None or column["kind"] != "numeric" or column.get("min") is None:
            continue
        if bound.min is not None:
            yield Measurement("range", name, float(column["min"]), f">= {bound.min:g}",
                              column["min"] < bound.min)
        if bound.max is not None:
            yield Measurement("range", name, float(column["max"]), f"<= {bound.max:g}",
                              column["max"] > bound.max)


def verdict(breaches: list[Breach], reference: str | None) -> dict[str, Any]:
    """What ``metadata.json`` records of a run's checks."""
    return {"passed": not breaches, "reference": reference,
            "breaches": [b.to_json() for b in breaches]}


def prometheus(measurements: list[Measurement], profile: dict[str, Any], *, compared: bool,
               run_at: float) -> str:
    """The checks of a run in Prometheus' text format (node_exporter's textfile collector,
    or the API's /metrics, which exports the served output's file)."""
    registry = CollectorRegistry()
    labels = ["check", "column"]
    value = Gauge("featureline_check_value", "What a check of the newest day found (0 to 1; "
                  "label_rate is a relative change)", labels, registry=registry)
    threshold = Gauge("featureline_check_threshold", "The threshold the value is checked "
                      "against (featureline.yaml, checks:)", labels, registry=registry)
    breached = Gauge("featureline_check_breached", "1 when the check failed, else 0", labels,
                     registry=registry)
    per_check = Gauge("featureline_check_breaches", "Breaches of the newest day, per check",
                      ["check"], registry=registry)
    for m in measurements:
        if isinstance(m.value, float) and isinstance(m.threshold, float):
            value.labels(m.check, m.column).set(m.value)
            threshold.labels(m.check, m.column).set(m.threshold)
        breached.labels(m.check, m.column).set(int(m.breached))
    for name in CHECKS:
        per_check.labels(name).set(sum(m.breached and m.check == name for m in measurements))
    Gauge("featureline_checks_passed", "1 when the newest day passed every check, else 0",
          registry=registry).set(int(not any(m.breached for m in measurements)))
    Gauge("featureline_checks_compared", "1 when the day was compared with a reference, 0 "
          "when only declared ranges were checked", registry=registry).set(int(compared))
    Gauge("featureline_checks_day_events", "Events of the checked day",
          registry=registry).set(profile["day_events"])
    Gauge("featureline_checks_run_timestamp_seconds", "When the checks ran (Unix time)",
          registry=registry).set(run_at)
    return generate_latest(registry).decode()


def record_verdict(folder: str | Path, checked: dict[str, Any], dataset_version: str) -> None:
    """Append a ``featureline validate`` verdict (:func:`verdict`'s) on the output
    ``folder`` of ``dataset_version``."""
    record = {"checked_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "dataset_version": dataset_version, **checked}
    with (Path(folder) / VERDICTS_FILE).open("a") as log:
        log.write(json.dumps(record) + "\n")


def latest_verdict(folder: str | Path, metadata: Metadata) -> ChecksVerdict | None:
    """The verdict that stands on the output ``folder``: the latest ``featureline validate``
    recorded of its dataset, else its run's own (None: not checked)."""
    recorded = Path(folder) / VERDICTS_FILE
    lines = recorded.read_text().splitlines() if recorded.is_file() else []
    ours = [record for record in map(json.loads, filter(str.strip, lines))
            if record.get("dataset_version") == metadata.dataset_version]
    if not ours:
        return metadata.checks
    latest = ours[-1]
    return ChecksVerdict(passed=latest["passed"], reference=latest.get("reference"),
                         breaches=latest.get("breaches", []))


def read_profile(folder: str | Path, name: str = PROFILE_FILE) -> dict[str, Any] | None:
    """The profile an output folder holds, or None (an output written before profiles, or
    no output at all)."""
    path = Path(folder) / name
    return json.loads(path.read_text()) if path.is_file() else None
