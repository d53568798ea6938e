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

The distribution checks (``js``, ``linf``, ``unseen``) compare a column only where both days
have ``min_values`` values: a few hundred ratings from a handful of sessions (a MovieLens
day) differ from the day before by chance as much as a real fault does. The ids of users
and items (the profile marks them ``key``) are never a closed domain.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from pydantic import Field

from featureline.core.metadata import METADATA_FILE, ChecksVerdict, Metadata, read_metadata
from featureline.core.settings import Settings

PROFILE_FILE = "profile.json"
# The checks' metrics in Prometheus' text format, beside it (every API process exports them).
METRICS_FILE = "checks.prom"
# The report a person reads, beside it: breaches first, then every column against the
# reference's.
REPORT_FILE = "report.html"
# Every check, in the order the report and the metrics list them.
CHECKS = ("schema", "volume", "missing", "js", "linf", "unseen", "label_rate",
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
    # replaces (or, where that output's own day failed and was not published with
    # --accept-drift, the reference it was checked against: a bad day sent again fails again).
    reference: str | None = None
    # Each threshold below may be null: that check is not made.
    # Largest change of the day's events, 1 - smaller / larger (0.5: half or twice as many).
    volume_change: float | None = Field(default=0.5, gt=0, lt=1)
    # Largest absolute change of a column's missing share.
    missing_change: float | None = Field(default=0.1, gt=0, le=1)
    # Largest L-infinity distance of a categorical column's value shares.
    linf: float | None = Field(default=0.3, gt=0, le=1)
    # Largest share of a categorical column's values that its reference never had (checked
    # where the reference lists every value, and never on the ids of users and items).
    unseen_share: float | None = Field(default=0.05, gt=0, le=1)
    # Largest Jensen-Shannon divergence (base 2) of a numeric column's histogram.
    js: float | None = Field(default=0.3, gt=0, le=1)
    # The distribution checks (js, linf, unseen) compare a column only where both days have
    # this many values: two small samples of one distribution differ by chance.
    min_values: int = Field(default=500, ge=0)
    # Largest relative change of the label rate.
    label_rate_change: float | None = Field(default=0.5, gt=0)
    # The quarantined share may grow to this multiple of the reference's (null: not
    # checked) ...
    quarantine_rate_factor: float | None = Field(default=3.0, gt=1)
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


def unseen_share(ours: dict[str, Any], theirs: dict[str, Any]) -> float | None:
    """The share of a categorical column's values that the reference never had; None unless
    the reference's values form a closed domain: all of them listed, each seen
    ``CLOSED_DOMAIN_ROWS`` times on average (event types, devices, categories — not the ids of
    users and items, new ones of which arrive every day)."""
    distinct = theirs.get("distinct", 0)
    if distinct > len(theirs["top"]) or present_values(theirs) < CLOSED_DOMAIN_ROWS * distinct:
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


def _volume_change(events: int, reference: int) -> float:
    larger = max(events, reference)
    return 1 - min(events, reference) / larger if larger else 0.0


def quarantine_rate(profile: dict[str, Any]) -> float:
    """The share of the run's rows read that were quarantined."""
    rows = profile["rows"]
    return sum(rows["quarantined"].values()) / rows["read"] if rows["read"] else 0.0


@dataclass(frozen=True)
class Measurement:
    """One check of one column ("" for the whole day): the value found, the threshold, and
    whether it crossed it."""

    check: str
    column: str
    value: float | str
    threshold: float | str
    breached: bool

    def breach(self) -> Breach:
        return Breach(self.check, self.column, self.value, self.threshold)


def check(profile: dict[str, Any], reference: dict[str, Any] | None,
          config: ChecksConfig) -> list[Breach]:
    """The breaches of ``profile`` against ``reference`` (declared ranges only without one)."""
    return [m.breach() for m in measure(profile, reference, config) if m.breached]


def measure(profile: dict[str, Any], reference: dict[str, Any] | None,
            config: ChecksConfig) -> list[Measurement]:
    """Every check of ``profile`` against ``reference``, breached or not (declared ranges only
    without one): what the report and the metrics show."""
    found = [*_ranges(profile, config)]
    if reference is None:
        return found

    def add(name: str, column: str, value: float, threshold: float | None) -> None:
        if threshold is not None:
            found.append(Measurement(name, column, value, threshold, value > threshold))

    ours, theirs = profile["columns"], reference["columns"]
    for name in sorted(set(theirs) - set(ours)):
        found.append(Measurement("schema", name, "missing", "present", True))
    for name in sorted(set(ours) - set(theirs)):
        found.append(Measurement("schema", name, "added", "absent", True))
    add("volume", "", _volume_change(profile["day_events"], reference["day_events"]),
        config.volume_change)
    for name in sorted(set(ours) & set(theirs)):
        a, b = ours[name], theirs[name]
        if a["kind"] != b["kind"]:
            found.append(Measurement("schema", name, a["kind"], b["kind"], True))
            continue
        add("missing", name, abs(a["missing"] - b["missing"]), config.missing_change)
        if min(present_values(a), present_values(b)) < config.min_values:
            continue
        if a["kind"] == "numeric":
            add("js", name, js_divergence(a["histogram"], b["histogram"]), config.js)
        else:
            add("linf", name, linf_distance(a, b), config.linf)
            unseen = None if a.get("key") else unseen_share(a, b)
            if unseen is not None:
                add("unseen", name, unseen, config.unseen_share)
    add("label_rate", "label", _relative(profile["label_rate"], reference["label_rate"]),
        config.label_rate_change)
    if config.quarantine_rate_factor is not None:
        allowed = max(quarantine_rate(reference) * config.quarantine_rate_factor,
                      config.quarantine_rate_floor)
        add("quarantine_rate", "", quarantine_rate(profile), round(allowed, 6))
    return found


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


def replaced_reference(folder: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """The reference of a run that replaces the output ``folder``, and its name: the output's
    own profile when its day passed, or was published all the same (``--accept-drift``);
    when its day failed and was not accepted, the profile *it* was checked against — the
    last day that passed — so that a bad day sent again is refused again, not compared with
    itself. (None, None) without a profile."""
    own = read_profile(folder)
    if own is None or not (Path(folder) / METADATA_FILE).is_file():
        return own, (str(folder) if own is not None else None)
    metadata = read_metadata(folder)
    checks = latest_verdict(folder, metadata)
    if checks is None or checks.passed or _accepted(folder, metadata.dataset_version):
        return own, str(folder)
    kept = read_profile(folder, REFERENCE_PROFILE_FILE)
    if kept is None:
        return None, None
    return kept, f"{folder}'s reference (day {kept['day']}: {folder}'s own day failed)"


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


def _accepted(folder: str | Path, version: str) -> bool:
    """Whether the output of dataset ``version`` was published with ``--accept-drift``."""
    accepted = Path(folder) / ACCEPTED_DRIFT_FILE
    return accepted.is_file() and any(
        json.loads(line).get("dataset_version") == version
        for line in accepted.read_text().splitlines() if line.strip())


def read_profile(folder: str | Path, name: str = PROFILE_FILE) -> dict[str, Any] | None:
    """The profile an output folder holds, or None (an output written before profiles, or
    no output at all)."""
    path = Path(folder) / name
    return json.loads(path.read_text()) if path.is_file() else None
