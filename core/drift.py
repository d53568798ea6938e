"""The data validation gate's checks: a run's profile (``profile.json``, written by the ETL)
against a reference profile — the served output's, or a pinned baseline — and the breaches
they find (docs/ARCHITECTURE.md, "The validation gate").

A profile describes the newest UTC day of an output's events: per raw column and per feature
its rows and missing share, and either a histogram (numbers) or its most frequent values
(text and ids); plus events per day, the label rate and the quarantine's reasons. The checks
compare distributions, not rows: a day whose rows are each valid can still be a bad day.

- ``schema``: a column added, missing, or of another kind than the reference's;
- ``volume``: the day's events against the reference day's: 1 − smaller ÷ larger (0.5: half
  or twice as many; a day at 10 % volume is 0.9);
- ``missing``: a column's missing share (absolute change);
- ``linf``: categorical columns, the L-infinity distance of the value shares (TFDV's
  comparator: the largest change of any one value's share);
- ``unseen``: categorical columns of a closed domain (the reference lists every value, each
  seen often: not ids), the share of the day's values the reference never had (a value
  renamed upstream, a flood of a new one);
- ``js``: numeric columns, the Jensen–Shannon divergence (base 2, 0 to 1) of their
  histograms. JS rather than PSI: it is bounded and symmetric, and an empty bin on either
  side (prices ×100 move every value into bins the reference never filled) needs no
  smoothing constant, where PSI divides by it;
- ``label_rate``: the day's positive share (relative change);
- ``quarantine_rate``: the run's share of quarantined rows, against a multiple of the
  reference's (with a floor, so a clean reference does not make one bad row a breach);
- ``range``: declared bounds a column's values must stay within.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from featureline.core.settings import Settings

PROFILE_FILE = "profile.json"
# The reference's profile at the time of the run, kept beside the run's own.
REFERENCE_PROFILE_FILE = "profile.reference.json"
# Histogram bins per decade of |x| (bin = sign(x) · floor(log10(1 + |x|) · BINS_PER_DECADE)):
# one rule for every profile, so any two compare bin for bin.
BINS_PER_DECADE = 10
# Most frequent values kept per categorical column; the rest are one "other" share. A column
# with no more values than this has them all listed: a closed domain, checked for new values.
TOP_K = 100
OTHER = "__other__"
# A column's values are a closed domain when each is seen this many times on average.
CLOSED_DOMAIN_ROWS = 20


class RangeBound(Settings):
    """Bounds a column's values must stay within (either may be left out)."""

    # The smallest allowed value.
    min: float | None = None
    # The largest allowed value.
    max: float | None = None


class ChecksConfig(Settings):
    """The validation gate: each run's profile against the reference's (the served output,
    or ``reference``); a breach fails the run's verdict, and publish refuses it."""

    # false: profiles are written, nothing is checked.
    enabled: bool = True
    # A pinned baseline output whose profile.json is the reference; null: the output the run
    # replaces (the served one).
    reference: str | None = None
    # Largest change of the day's events, 1 - smaller / larger (0.5: half or twice as many).
    volume_change: float = Field(default=0.5, gt=0, lt=1)
    # Largest absolute change of a column's missing share.
    missing_change: float = Field(default=0.1, gt=0, le=1)
    # Largest L-infinity distance of a categorical column's value shares.
    linf: float = Field(default=0.3, gt=0, le=1)
    # Largest share of a categorical column's values that its reference never had (checked
    # where the reference lists every value).
    unseen_share: float = Field(default=0.05, gt=0, le=1)
    # Largest Jensen-Shannon divergence (base 2) of a numeric column's histogram.
    js: float = Field(default=0.3, gt=0, le=1)
    # Largest relative change of the label rate.
    label_rate_change: float = Field(default=0.5, gt=0)
    # The quarantined share may grow to this multiple of the reference's ...
    quarantine_rate_factor: float = Field(default=3.0, gt=1)
    # ... or to this share, whichever is larger.
    quarantine_rate_floor: float = Field(default=0.02, ge=0, le=1)
    # Column → bounds its values must stay within, e.g. {price: {min: 0, max: 10000}}.
    ranges: dict[str, RangeBound] = Field(default_factory=dict)


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
        rows = column["rows"] - column["missing"] * column["rows"]
        if rows <= 0:
            return {}
        top = {str(value): count / rows for value, count in column["top"]}
        top[OTHER] = max(0.0, 1.0 - sum(top.values()))
        return top

    a, b = shares(ours), shares(theirs)
    # A value among one side's top values only counts as 0 on the other side (an upper
    # bound of the change: its share there is at most that side's smallest top share).
    return max((abs(a.get(value, 0.0) - b.get(value, 0.0))
                for value in (set(a) | set(b)) - {OTHER}), default=0.0)


def unseen_share(ours: dict[str, Any], theirs: dict[str, Any]) -> float | None:
    """The share of a categorical column's values that the reference never had; None unless
    the reference's values form a closed domain: all of them listed, each seen
    ``CLOSED_DOMAIN_ROWS`` times on average (event types, devices, categories — not the ids of
    users and items, new ones of which arrive every day)."""
    distinct = theirs.get("distinct", 0)
    present = theirs["rows"] * (1 - theirs["missing"])
    if distinct > len(theirs["top"]) or present < CLOSED_DOMAIN_ROWS * distinct:
        return None
    known = {str(value) for value, _ in theirs["top"]}
    present = ours["rows"] * (1 - ours["missing"])
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


def _volume_change(events: int, reference: int) -> float:
    larger = max(events, reference)
    return 1 - min(events, reference) / larger if larger else 0.0


def _quarantine_rate(profile: dict[str, Any]) -> float:
    rows = profile["rows"]
    return sum(rows["quarantined"].values()) / rows["read"] if rows["read"] else 0.0


def check(profile: dict[str, Any], reference: dict[str, Any] | None,
          config: ChecksConfig) -> list[Breach]:
    """The breaches of ``profile`` against ``reference`` (declared ranges only without one)."""
    breaches = [*_ranges(profile, config)]
    if reference is None:
        return breaches
    ours, theirs = profile["columns"], reference["columns"]
    for name in sorted(set(theirs) - set(ours)):
        breaches.append(Breach("schema", name, "missing", "present"))
    for name in sorted(set(ours) - set(theirs)):
        breaches.append(Breach("schema", name, "added", "absent"))
    volume = _volume_change(profile["day_events"], reference["day_events"])
    if volume > config.volume_change:
        breaches.append(Breach("volume", "", volume, config.volume_change))
    for name in sorted(set(ours) & set(theirs)):
        a, b = ours[name], theirs[name]
        if a["kind"] != b["kind"]:
            breaches.append(Breach("schema", name, a["kind"], b["kind"]))
            continue
        missing = abs(a["missing"] - b["missing"])
        if missing > config.missing_change:
            breaches.append(Breach("missing", name, missing, config.missing_change))
        if a["kind"] == "numeric":
            divergence = js_divergence(a["histogram"], b["histogram"])
            if divergence > config.js:
                breaches.append(Breach("js", name, divergence, config.js))
        else:
            distance = linf_distance(a, b)
            if distance > config.linf:
                breaches.append(Breach("linf", name, distance, config.linf))
            unseen = unseen_share(a, b)
            if unseen is not None and unseen > config.unseen_share:
                breaches.append(Breach("unseen", name, unseen, config.unseen_share))
    label = _relative(profile["label_rate"], reference["label_rate"])
    if label > config.label_rate_change:
        breaches.append(Breach("label_rate", "label", label, config.label_rate_change))
    allowed = max(_quarantine_rate(reference) * config.quarantine_rate_factor,
                  config.quarantine_rate_floor)
    quarantined = _quarantine_rate(profile)
    if quarantined > allowed:
        breaches.append(Breach("quarantine_rate", "", quarantined, round(allowed, 6)))
    return breaches


def _ranges(profile: dict[str, Any], config: ChecksConfig) -> Iterable[Breach]:
    for name, bound in sorted(config.ranges.items()):
        column = profile["columns"].get(name)
        if column is None or column["kind"] != "numeric" or column.get("min") is None:
            continue
        if bound.min is not None and column["min"] < bound.min:
            yield Breach("range", name, float(column["min"]), f">= {bound.min:g}")
        if bound.max is not None and column["max"] > bound.max:
            yield Breach("range", name, float(column["max"]), f"<= {bound.max:g}")


def verdict(breaches: list[Breach], reference: str | None) -> dict[str, Any]:
    """What ``metadata.json`` records of a run's checks."""
    return {"passed": not breaches, "reference": reference,
            "breaches": [b.to_json() for b in breaches]}


def read_profile(folder: str | Path, name: str = PROFILE_FILE) -> dict[str, Any] | None:
    """The profile an output folder holds, or None (an output written before profiles, or
    no output at all)."""
    path = Path(folder) / name
    return json.loads(path.read_text()) if path.is_file() else None
