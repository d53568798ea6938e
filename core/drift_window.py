"""The validation gate's reference window (docs/ARCHITECTURE.md, "The validation gate"): the
profiles of the days up to a run's day, kept in the output (``profiles/DAY.json``) and
pooled into one reference for ``core/drift.py``'s checks.

An output keeps the window its own day was checked against. The next run's window is that
one plus the output's own day where it passed, up to the next run's day: its last
``reference_days`` days. A bad day is never part of a later window, so a bad day sent again
fails again. A day published all the same (``--accept-drift``: the change was meant) starts
a new window of its own.

A run with no window to carry (a first run) seeds one for the runs after it from its own
events: the day before its newest profiled in full, the days before that by their totals
only (events, label rate) — profiling every day would cost the run a tenth more. Its own day
is not checked against the seed: nothing is served yet, and a log's last day may be partial.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from featureline.core.drift import (
    ACCEPTED_DRIFT_FILE,
    REFERENCE_PROFILE_FILE,
    TOP_K,
    day_summary,
    js_divergence,
    latest_verdict,
    linf_distance,
    present_values,
    quantiles,
    read_profile,
)
from featureline.core.metadata import METADATA_FILE, read_metadata

# The window an output's own day was checked against: one profile per day.
PROFILES_DIR = "profiles"


def pooled(days: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One reference of a window's days (oldest first): each day's totals (``days``), their
    medians, and every column of the newest profiled day with its values pooled over the
    profiled days (``columns`` None where no day was profiled in full)."""
    profiled = [day for day in days if day.get("columns") is not None]
    totals = [day_summary(day) for day in days]
    columns = None
    if profiled:
        columns = {}
        for name, entry in profiled[-1]["columns"].items():
            alike = [day["columns"][name] for day in profiled
                     if day["columns"].get(name, {}).get("kind") == entry["kind"]]
            columns[name] = _pooled_column(alike)
    return {
        "day": days[-1]["day"],
        "window": {"first": days[0]["day"], "last": days[-1]["day"], "days": len(days),
                   "profiled": len(profiled), "events": sum(t["events"] for t in totals)},
        "days": totals,
        "day_events": round(statistics.median(t["events"] for t in totals)),
        "label_rate": statistics.median(t["label_rate"] for t in totals),
        "events_per_day": days[-1].get("events_per_day", {}),
        "rows": days[-1]["rows"],
        "columns": columns,
    }


def _pooled_column(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One column over several days: rows and present values summed, histograms or value
    counts added, moments combined; and each day's divergence from the others (``spread``:
    how much the log's own days differ, against which the checked day's is judged)."""
    newest = entries[-1]
    rows = sum(entry["rows"] for entry in entries)
    present = [present_values(entry) for entry in entries]
    column: dict[str, Any] = {key: newest[key] for key in ("source", "kind") if key in newest}
    column.update(rows=rows, missing=1 - sum(present) / rows if rows else 0.0)
    if newest.get("key"):
        column["key"] = True
    if newest.get("entity"):
        column["entity"] = newest["entity"]
    if newest["kind"] == "numeric":
        days = [entry["histogram"] for entry in entries]
        histogram = _added(days)
        column["histogram"] = dict(sorted(histogram.items(), key=lambda item: int(item[0])))
        column.update(_moments(entries, present))
        column["quantiles"] = quantiles(column)
        column["spread"] = _spread(days, histogram, js_divergence)
        held = [entry["entity_histogram"] for entry in entries if "entity_histogram" in entry]
        if held:  # how many users (items) held a value, each day: drift.beyond_range
            column["entities_per_day"] = [sum(day.values()) for day in held]
        return column
    days = [{str(value): count for value, count in entry["top"]} for entry in entries]
    counts = _added(days)
    top = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:TOP_K]
    # Every value is known where every day listed all of its own: else more than listed.
    listed_all = all(entry.get("distinct", 0) <= len(entry["top"]) for entry in entries)
    distinct = max([len(counts), *(entry.get("distinct", 0) for entry in entries)])
    column.update(top=[[value, count] for value, count in top],
                  distinct=distinct if listed_all else max(distinct, len(top) + 1))
    if listed_all and len(days) > 1:
        column.update(_discovery(days))
    column["spread"] = _spread(days, counts,
                               lambda day, rest: linf_distance(_listed(day), _listed(rest)))
    return column


def _discovery(days: Sequence[dict[str, int]]) -> dict[str, Any]:
    """How a categorical column's values came to the window: the new values each day after
    the first brought (``new_per_day``), and how many values were seen on one day only
    (``once``): the counts ``core.drift.new_values`` judges a day's new values by."""
    seen: dict[str, int] = {}
    new_per_day = []
    for index, day in enumerate(days):
        fresh = [value for value in day if value not in seen]
        if index:
            new_per_day.append(len(fresh))
        for value in day:
            seen[value] = seen.get(value, 0) + 1
    return {"new_per_day": new_per_day, "once": sum(1 for n in seen.values() if n == 1),
            "days_listed": len(days)}


def _spread(days: Sequence[dict[str, int]], total: dict[str, int],
            divergence: Callable[[dict[str, int], dict[str, int]], float]) -> list[float]:
    """Each day's divergence from the window's other days (none in a window of one)."""
    if len(days) < 2:
        return []
    return [divergence(day, _less(total, day)) for day in days if sum(day.values())]


def _added(days: Sequence[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for day in days:
        for key, count in day.items():
            total[key] = total.get(key, 0) + count
    return total


def _less(total: dict[str, int], day: dict[str, int]) -> dict[str, int]:
    """The other days' counts: the total less one day's."""
    return {key: count - day.get(key, 0) for key, count in total.items()
            if count - day.get(key, 0)}


def _listed(counts: dict[str, int]) -> dict[str, Any]:
    """Value counts as a categorical column's entry (every value listed)."""
    return {"top": list(counts.items()), "rows": sum(counts.values()), "missing": 0.0}


def _moments(entries: Sequence[dict[str, Any]], present: Sequence[float]) -> dict[str, Any]:
    """Min, max, mean and standard deviation of the days' values together."""
    known = [(entry, n) for entry, n in zip(entries, present, strict=True)
             if n and entry.get("mean") is not None]
    if not known:
        return {"min": None, "max": None, "mean": None, "std": None}
    total = sum(n for _, n in known)
    mean = sum(entry["mean"] * n for entry, n in known) / total
    squares = sum((n - 1) * (entry.get("std") or 0.0) ** 2 + n * (entry["mean"] - mean) ** 2
                  for entry, n in known)
    return {"min": min(entry["min"] for entry, _ in known),
            "max": max(entry["max"] for entry, _ in known), "mean": mean,
            "std": math.sqrt(squares / (total - 1)) if total > 1 else None}


def window(days: Sequence[dict[str, Any]], size: int, until: str | None = None
           ) -> list[dict[str, Any]]:
    """The last ``size`` days of ``days`` (up to the day ``until``, where given), oldest
    first; of two profiles of one day, the later in ``days``."""
    by_day = {day["day"]: day for day in days if until is None or day["day"] <= until}
    return [by_day[day] for day in sorted(by_day)][-size:]


def kept_days(folder: str | Path) -> list[dict[str, Any]]:
    """The days an output keeps: the window its own day was checked against."""
    kept = Path(folder) / PROFILES_DIR
    return [json.loads(path.read_text()) for path in sorted(kept.glob("*.json"))] \
        if kept.is_dir() else []


def replaced_days(folder: str | Path) -> tuple[list[dict[str, Any]], str]:
    """The days a run replacing the output ``folder`` may be checked against, and their
    name: the output's window and its own day where that passed; its window alone where its
    day failed; its day alone where that was published all the same (``--accept-drift``:
    the change was meant, the day is the new baseline). An output written before windows
    were kept gives its own day if admitted, else the one profile it was checked against."""
    own = read_profile(folder)
    if own is None:
        return [], str(folder)
    days = kept_days(folder)
    verdict = _verdict(folder)
    if verdict == "passed":
        return [*days, own], str(folder)
    if verdict == "accepted":
        return [own], f"{folder} (its day {own['day']}, published with --accept-drift)"
    name = f"{folder}'s window (its own day failed, {own['day']}: left out)"
    if days:
        return days, name
    earlier = read_profile(folder, REFERENCE_PROFILE_FILE)
    return ([earlier] if earlier is not None and "window" not in earlier else []), name


def pinned_days(folder: str | Path) -> list[dict[str, Any]]:
    """The days of a pinned baseline output (``checks.reference``, ``validate
    --reference``): its window and its own day, admitted or not, whatever day it is — the
    baseline was named."""
    own = read_profile(folder)
    return [*kept_days(folder), own] if own is not None else []


def _verdict(folder: str | Path) -> str:
    """Whether an output's own day "passed" its checks (or was not checked), failed and was
    "accepted" (published with --accept-drift), or "failed"."""
    if not (Path(folder) / METADATA_FILE).is_file():
        return "passed"
    metadata = read_metadata(folder)
    checks = latest_verdict(folder, metadata)
    if checks is None or checks.passed:
        return "passed"
    accepted = Path(folder) / ACCEPTED_DRIFT_FILE
    if accepted.is_file() and any(
            json.loads(line).get("dataset_version") == metadata.dataset_version
            for line in accepted.read_text().splitlines() if line.strip()):
        return "accepted"
    return "failed"


def write_window(days: Sequence[dict[str, Any]], folder: str | Path) -> None:
    """Keep ``days`` in the output ``folder`` being written, one file per day."""
    kept = Path(folder) / PROFILES_DIR
    kept.mkdir(parents=True, exist_ok=True)
    for day in days:
        (kept / f"{day['day']}.json").write_text(json.dumps(day))

