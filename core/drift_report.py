"""The validation gate's report: one self-contained HTML page per run (``report.html`` beside
``profile.json``; docs/ARCHITECTURE.md, "The validation gate") — the breaches first, then the
day's volume, label and quarantine rates, then every column's distribution beside the
reference's (histograms of the numbers, the most frequent values of the categories).

Inline CSS and SVG only: no script, font or image is fetched, so the file reads the same
from a laptop, an object store or a CI artifact. The page is a Jinja2 template
(``templates/report.html.j2``); this module shapes the profiles into what it draws.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from featureline.core.drift import (
    NOT_CHECKED,
    OTHER,
    ChecksConfig,
    Measurement,
    bin_edges,
    quarantine_rate,
    value_shares,
    window_days,
)

# Values drawn per categorical column: the largest shares of either side.
SHOWN_VALUES = 12
# Days of the events-per-day chart.
SHOWN_DAYS = 45

# What each check means, for the breaches' table.
MEANINGS = {
    "schema": "the column is missing, new, or of another kind than the reference's",
    "volume": "the day's events against the window's median day: 1 - smaller / larger",
    "missing": "change of the column's missing share",
    "js": "Jensen-Shannon divergence of the histograms (0 same, 1 disjoint), significant",
    "linf": "largest change of one value's share (L-infinity), significant",
    "unseen": "share of the day's values the window never had",
    "beyond": "users (items) holding a value beyond the window's whole range, significant",
    "label_rate": "relative change of the label rate from the window's median day",
    "quarantine_rate": "share of rows quarantined, against a multiple of the window's median",
    "range": "a value outside the declared bounds",
}


@dataclass
class Bar:
    """One pair of bars: this run's share and the reference's."""

    label: str
    ours: float
    theirs: float | None


@dataclass
class ColumnView:
    """What the page shows of one column."""

    name: str
    source: str
    kind: str
    breached: bool
    checks: list[Measurement]
    stats: list[tuple[str, Any, Any]] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)


def _bin_label(index: int) -> str:
    """A histogram bin's lower edge (bins are tenths of a decade of |x|; see core/drift.py)."""
    return f"{bin_edges(index)[0]:.3g}"


def _shares(counts: dict[str, int]) -> dict[str, float]:
    total = sum(counts.values())
    return {key: count / total for key, count in counts.items()} if total else {}


def _histogram_bars(ours: dict[str, Any], theirs: dict[str, Any] | None) -> list[Bar]:
    a = _shares(ours["histogram"])
    b = _shares(theirs["histogram"]) if theirs else {}
    bins = sorted({int(key) for key in (*a, *b)})
    return [Bar(_bin_label(index), a.get(str(index), 0.0),
                b.get(str(index), 0.0) if theirs else None) for index in bins]


def _value_bars(ours: dict[str, Any], theirs: dict[str, Any] | None) -> list[Bar]:
    a = value_shares(ours)
    b = value_shares(theirs) if theirs else {}
    shown = sorted(set(a) | set(b), key=lambda v: -max(a.get(v, 0.0), b.get(v, 0.0)))
    bars = [Bar(value, a.get(value, 0.0), b.get(value, 0.0) if theirs else None)
            for value in shown[:SHOWN_VALUES]]
    rest_a = 1 - sum(bar.ours for bar in bars)
    rest_b = 1 - sum(bar.theirs or 0.0 for bar in bars)
    if rest_a > 1e-9 or (theirs and rest_b > 1e-9):
        bars.append(Bar(OTHER, max(rest_a, 0.0), max(rest_b, 0.0) if theirs else None))
    return bars


def _stats(ours: dict[str, Any], theirs: dict[str, Any] | None) -> list[tuple[str, Any, Any]]:
    rows = [("missing", ours["missing"], theirs["missing"] if theirs else None)]
    if ours["kind"] != "numeric":
        return [*rows, ("distinct", ours.get("distinct"),
                        theirs.get("distinct") if theirs else None)]
    rows += [(key, ours.get(key), theirs.get(key) if theirs else None)
             for key in ("min", "max", "mean", "std")]
    # Profiles written before quantiles have none.
    mine, other = ours.get("quantiles", {}), (theirs or {}).get("quantiles", {})
    return rows + [(name, value, other.get(name)) for name, value in mine.items()]


def _columns(profile: dict[str, Any], reference: dict[str, Any] | None,
             measurements: list[Measurement]) -> list[ColumnView]:
    theirs_all = (reference or {}).get("columns") or {}
    views = []
    for name in sorted(set(profile["columns"]) | set(theirs_all)):
        ours, theirs = profile["columns"].get(name), theirs_all.get(name)
        checks = [m for m in measurements if m.column == name]
        entry = ours or theirs
        assert entry is not None
        view = ColumnView(name, entry["source"], entry["kind"],
                          any(m.breached for m in checks), checks)
        if ours is not None:
            same_kind = theirs if theirs and theirs["kind"] == ours["kind"] else None
            view.stats = _stats(ours, same_kind)
            view.bars = (_histogram_bars(ours, same_kind) if ours["kind"] == "numeric"
                         else _value_bars(ours, same_kind))
        views.append(view)
    # Breached columns first; then raw columns before features, each by name.
    return sorted(views, key=lambda v: (not v.breached, v.source != "raw", v.name))


def render(profile: dict[str, Any], reference: dict[str, Any] | None,
           measurements: list[Measurement], config: ChecksConfig, *, output: str,
           reference_name: str | None) -> str:
    """The report of ``profile`` checked against ``reference`` (named ``reference_name``)."""
    environment = Environment(loader=PackageLoader("featureline.core", "templates"),
                              autoescape=select_autoescape(["html", "j2"]),
                              trim_blocks=True, lstrip_blocks=True)
    breaches = [m for m in measurements if m.breached]
    days = list(profile["events_per_day"].items())[-SHOWN_DAYS:]
    # A window's middle: its median day (core/drift_window.py).
    day = {
        "events": (profile["day_events"], reference["day_events"] if reference else None),
        "label_rate": (profile["label_rate"], reference["label_rate"] if reference else None),
        "quarantined": (quarantine_rate(profile), statistics.median(
            entry["quarantine_rate"] for entry in window_days(reference)) if reference else None),
    }
    return environment.get_template("report.html.j2").render(
        output=output, profile=profile, reference_name=reference_name,
        compared=reference is not None, enabled=config.enabled, breaches=breaches,
        meanings=MEANINGS, day=day, not_checked=NOT_CHECKED,
        window=reference.get("window") if reference else None,
        reasons=profile["rows"]["quarantined"],
        days=days, most_per_day=max((count for _, count in days), default=1),
        day_checks=[m for m in measurements if m.column in ("", "label")],
        columns=_columns(profile, reference, measurements))
