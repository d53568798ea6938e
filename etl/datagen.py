"""Synthetic interaction logs in the canonical raw-log schema (docs/ARCHITECTURE.md, "Contracts").

Vectorised numpy, deterministic for a seed: Zipf item popularity and user activity,
sessions, daily and weekly cycles, a view → click → add_to_cart → purchase funnel,
per-item price and category, a device per session, and optionally malformed rows of every
kind the validator rejects (plus exact duplicates, which it removes and counts).

With ``taste`` (the default of the CLI and the demo) users differ in what they like, not only
in how much they do: each has a category taste, latent factors matched with the items', a
click propensity and a price sensitivity, and views come back to an item just seen. Without
it a click depends on the item alone.
"""

from __future__ import annotations

import csv
import functools
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from featureline.core.events import REASONS
from featureline.core.files import write_whole
from featureline.etl.stages import InputFormat

FUNNEL = ("view", "click", "add_to_cart", "purchase")
# P(click | view), P(add_to_cart | click), P(purchase | add_to_cart), scaled by item appeal.
FUNNEL_RATES = (0.12, 0.3, 0.5)
# Mean seconds from one funnel step to the next.
FUNNEL_DELAYS = (5.0, 20.0, 60.0)
DEVICES = ("mobile", "desktop", "tablet")
DEVICE_WEIGHTS = (0.62, 0.31, 0.07)
# Activity by hour of day (UTC): quiet nights, a lunch bump and an evening peak.
HOUR_WEIGHTS = np.array(
    [2, 1, 1, 1, 1, 2, 3, 5, 6, 6, 6, 7, 8, 7, 6, 6, 7, 8, 10, 12, 12, 10, 7, 4], dtype=float)
# Activity by day of week, Monday first: busier weekends.
WEEKDAY_WEIGHTS = np.array([1.0, 0.95, 0.95, 1.0, 1.1, 1.35, 1.3])
VIEWS_PER_SESSION = 6.0
SECONDS_BETWEEN_VIEWS = 40.0
MISSING_VALUE_RATE = 0.03
DEFAULT_START = datetime(2026, 1, 5, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Taste:
    """How users differ in the log ``taste`` writes (:func:`generate_events`)."""

    # Each user's taste over the categories: Dirichlet(concentration); small is focused.
    concentration: float = 0.25
    # The share of views drawn from the user's taste (category, then item by popularity in
    # it); the rest follow the items' popularity alone.
    from_taste: float = 0.6
    # The share of views that come back to the session's previous item.
    repeat: float = 0.12
    # Latent factors of users and items: their number and the weight of their match.
    factors: int = 8
    match: float = 0.9
    # The weight of log(taste share × categories) in a click: liked categories click more.
    liking: float = 0.5
    # The spread of users' click propensity (lognormal sigma).
    propensity: float = 0.7
    # log-odds added to a click on a view that came back to an item.
    again: float = 1.0
    # How much a log-price above the median lowers a click, at the users' mean sensitivity.
    price: float = 0.3


TASTE = Taste()

COLUMNS = ("user_id", "item_id", "event_type", "ts", "value", "price", "category", "device")


@dataclass(frozen=True)
class Shape:
    """A public log's shape, for trying Featureline on names that are not its own: the
    columns written and their names (ours → theirs, in order), each event type's name
    (None: such events are left out), the time as epoch milliseconds, ids as numbers."""

    columns: dict[str, str]
    event_types: dict[str, str | None]


# Retailrocket's e-commerce events (timestamp in ms, visitorid, event, itemid), with the
# item's category and price and the visit's device beside them.
SHAPES = {"retailrocket": Shape(
    columns={"ts": "timestamp", "user_id": "visitorid", "event_type": "event",
             "item_id": "itemid", "category": "categoryid", "price": "price",
             "device": "device"},
    event_types={"view": "view", "click": None, "add_to_cart": "addtocart",
                 "purchase": "transaction"})}


def reshaped(events: pd.DataFrame, shape: Shape) -> pd.DataFrame:
    """``events`` (ours) in ``shape``: renamed, ids as numbers, the time in epoch ms."""
    kept = events[events["event_type"].map(shape.event_types).notna()].copy()
    kept["event_type"] = kept["event_type"].map(shape.event_types)
    kept["ts"] = (pd.to_datetime(kept["ts"], utc=True).astype("int64") // 1_000_000)
    for column in ("user_id", "item_id", "category"):
        kept[column] = kept[column].str.slice(1).astype("int64")
    return kept[list(shape.columns)].rename(columns=shape.columns).reset_index(drop=True)


# Every kind of bad row, named by the quarantine reason the validator gives it.
BAD_KINDS_TEXT = (*REASONS, "duplicate")
# A typed Parquet file cannot hold an unparseable line or a non-numeric value.
BAD_KINDS_PARQUET = tuple(k for k in BAD_KINDS_TEXT if k not in {"malformed_record", "bad_number"})


@dataclass(frozen=True)
class GeneratedLog:
    path: Path
    rows: int
    bad_rows: dict[str, int]
    # The log's last UTC day, written apart (split_last_day), and its rows.
    last_day: Path | None = None
    last_day_rows: int = 0


def zipf_probabilities(n: int, alpha: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1, dtype=float) ** alpha
    return weights / weights.sum()


def generate_events(
    events: int,
    users: int,
    items: int,
    days: int,
    seed: int = 0,
    start: datetime = DEFAULT_START,
    taste: Taste | None = None,
) -> pd.DataFrame:
    """``events`` well-formed events sorted by time, as a DataFrame of the canonical columns.
    ``taste``: users differ in what they view and click (:class:`Taste`); None: a click
    depends on the item alone."""
    if min(events, users, items, days) < 1:
        raise ValueError("events, users, items and days must all be at least 1")
    rng = np.random.default_rng(seed)
    events_per_view = 1 + np.cumprod(FUNNEL_RATES).sum()
    views = int(events / events_per_view * 1.1) + 16

    # Sessions: a Zipf-active user, a start time drawn from the weekly and daily cycles.
    lengths = rng.geometric(1 / VIEWS_PER_SESSION, size=int(views / VIEWS_PER_SESSION * 1.3) + 16)
    sessions = int(np.searchsorted(np.cumsum(lengths), views)) + 1
    lengths = lengths[:sessions]
    views = int(lengths.sum())
    user_rank = rng.choice(users, size=sessions, p=zipf_probabilities(users, 1.05))
    session_user = rng.permutation(users)[user_rank]
    day_weights = WEEKDAY_WEIGHTS[(np.arange(days) + start.weekday()) % 7]
    session_day = rng.choice(days, size=sessions, p=day_weights / day_weights.sum())
    session_hour = rng.choice(24, size=sessions, p=HOUR_WEIGHTS / HOUR_WEIGHTS.sum())
    session_start = (start.timestamp() + session_day * 86400.0 + session_hour * 3600.0
                     + rng.uniform(0, 3600, size=sessions))
    session_device = rng.choice(len(DEVICES), size=sessions, p=DEVICE_WEIGHTS)

    # Views: Zipf-popular items at exponential gaps inside each session.
    session_of_view = np.repeat(np.arange(sessions), lengths)
    gaps = rng.exponential(SECONDS_BETWEEN_VIEWS, size=views)
    first_view = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    gaps[first_view] = 0.0
    elapsed = np.cumsum(gaps)
    view_ts = session_start[session_of_view] + elapsed - elapsed[first_view][session_of_view]
    popularity = zipf_probabilities(items, 1.2)
    item_rank = rng.choice(items, size=views, p=popularity)
    ranked = rng.permutation(items)
    view_item = ranked[item_rank]

    # Items: a category (itself Zipf-popular), a lognormal price and an appeal factor.
    categories = max(4, min(64, items // 25))
    item_category = rng.choice(categories, size=items, p=zipf_probabilities(categories, 0.8))
    item_price = np.round(rng.lognormal(3.0, 1.0, size=items), 2)
    item_appeal = np.clip(rng.lognormal(0.0, 0.5, size=items), 0.2, 3.0)
    # What a view's click chance is multiplied by, besides the item's appeal.
    personal = np.ones(views)
    if taste is not None:
        item_popularity = np.empty(items)
        item_popularity[ranked] = popularity
        view_item, personal = _tasted(rng, taste, session_user[session_of_view], first_view,
                                      view_item, item_popularity, item_category, item_price,
                                      users)

    # The funnel: each step happens with its rate times the item's appeal, a little later.
    step_mask = np.ones(views, dtype=bool)
    step_ts = view_ts
    parts_ts, parts_view, parts_type = [view_ts], [np.arange(views)], [np.zeros(views, np.int8)]
    for step, (rate, delay) in enumerate(zip(FUNNEL_RATES, FUNNEL_DELAYS, strict=True), start=1):
        chance = np.minimum(rate * item_appeal[view_item] * (personal if step == 1 else 1.0),
                            0.95)
        step_mask = step_mask & (rng.random(views) < chance)
        step_ts = step_ts + rng.exponential(delay, size=views)
        parts_ts.append(step_ts[step_mask])
        parts_view.append(np.flatnonzero(step_mask))
        parts_type.append(np.full(int(step_mask.sum()), step, np.int8))

    ts = np.concatenate(parts_ts)
    view_index = np.concatenate(parts_view)
    event_type = np.concatenate(parts_type)
    # The surplus goes as views that led nowhere (the first ``views`` entries are the views),
    # picked at random: the log keeps its whole span and no click loses its view.
    # Funnel steps that would land after the last requested day are not in the log.
    keep = ts < start.timestamp() + days * 86400.0
    surplus = int(keep.sum()) - events
    dead_ends = np.setdiff1d(np.flatnonzero(keep[:views]), parts_view[1])
    if 0 < surplus <= len(dead_ends):
        keep[rng.choice(dead_ends, size=surplus, replace=False)] = False
    order = np.flatnonzero(keep)[np.argsort(ts[keep], kind="stable")][:events]
    ts, view_index, event_type = ts[order], view_index[order], event_type[order]
    item = view_item[view_index]
    session = session_of_view[view_index]

    dwell = np.round(rng.lognormal(2.8, 0.9, size=len(ts)), 3)
    dwell[rng.random(len(ts)) < MISSING_VALUE_RATE] = np.nan
    ts_text = np.datetime_as_string((ts * 1000).astype("datetime64[ms]"), unit="ms")
    return pd.DataFrame({
        "user_id": np.char.add("u", session_user[session].astype(str)),
        "item_id": np.char.add("i", item.astype(str)),
        "event_type": np.array(FUNNEL)[event_type],
        "ts": np.char.add(ts_text.astype(str), "Z"),
        "value": dwell,
        "price": item_price[item],
        "category": np.char.add("c", item_category[item].astype(str)),
        "device": np.array(DEVICES)[session_device[session]],
    })


def _tasted(rng: np.random.Generator, taste: Taste, view_user: np.ndarray,
            first_view: np.ndarray, view_item: np.ndarray, item_popularity: np.ndarray,
            item_category: np.ndarray, item_price: np.ndarray, users: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """The views' items as users with ``taste`` pick them, and what each view's click chance
    is multiplied by (a mean of 1 over the views: the funnel keeps its rates)."""
    views, categories = len(view_item), int(item_category.max()) + 1
    liking = rng.dirichlet(np.full(categories, taste.concentration), size=users)
    # A tasted view: a category drawn from its user's taste, then one of its items, the
    # popular ones more often (an empty category keeps the popular item drawn before).
    tasted = np.flatnonzero(rng.random(views) < taste.from_taste)
    drawn = (rng.random(len(tasted))[:, None] > np.cumsum(liking[view_user[tasted]], axis=1))
    category = np.minimum(drawn.sum(axis=1), categories - 1)
    order = np.lexsort((-item_popularity, item_category))
    weights = np.cumsum(item_popularity[order])
    first = np.searchsorted(item_category[order], np.arange(categories), side="left")
    end = np.searchsorted(item_category[order], np.arange(categories), side="right")
    before = np.where(first > 0, weights[np.maximum(first - 1, 0)], 0.0)
    total = np.where(end > first, weights[np.maximum(end - 1, 0)] - before, 0.0)
    target = before[category] + rng.random(len(tasted)) * total[category]
    position = np.clip(np.searchsorted(weights, target, side="right"), first[category],
                       np.maximum(end[category] - 1, first[category]))
    items = view_item.copy()
    filled = total[category] > 0
    items[tasted[filled]] = order[position[filled]]
    # A view that comes back to its session's previous item (never a session's first).
    again = rng.random(views) < taste.repeat
    again[first_view] = False
    items = items[np.maximum.accumulate(np.where(again, 0, np.arange(views)))]
    # The click's log-odds, besides the item's appeal.
    user_factors = rng.normal(size=(users, taste.factors))
    item_factors = rng.normal(size=(len(item_category), taste.factors))
    match = (user_factors[view_user] * item_factors[items]).sum(axis=1) / np.sqrt(taste.factors)
    liked = np.clip(np.log(liking[view_user, item_category[items]] * categories), -3.0, 2.0)
    propensity = rng.normal(0.0, taste.propensity, size=users)
    sensitivity = rng.lognormal(0.0, 0.5, size=users)
    dear = np.log(item_price[items]) - np.median(np.log(item_price))
    logit = (taste.match * match + taste.liking * liked + propensity[view_user]
             - taste.price * sensitivity[view_user] * dear + taste.again * again)
    multiplier = np.exp(logit)
    return items, multiplier / multiplier.mean()


def _corrupt(record: dict[str, Any], kind: str, fmt: InputFormat) -> dict[str, Any]:
    """One good record made bad in exactly the way ``kind`` names."""
    bad = dict(record)
    if kind.startswith("missing_"):
        bad[kind.removeprefix("missing_")] = None
    elif kind == "bad_timestamp":
        bad["ts"] = "yesterday at noon"
    elif kind == "timestamp_out_of_window":
        # 3000-01-01 in epoch seconds: beyond validation.future_tolerance of any run, and no
        # day of the log to split it by (log_day reads ISO times).
        bad["ts"] = "32503680000"
    elif kind == "unknown_event_type":
        bad["event_type"] = "hover"
    elif kind == "bad_number":
        bad["value"] = "twelve"
    elif kind == "non_finite_number":
        bad["value"] = float("inf") if fmt == "parquet" else "Infinity"
    return bad


def _bad_rows(
    good: pd.DataFrame, count: int, fmt: InputFormat, rng: np.random.Generator
) -> tuple[list[dict[str, Any]], list[str], dict[str, int]]:
    kinds = BAD_KINDS_PARQUET if fmt == "parquet" else BAD_KINDS_TEXT
    chosen = [kinds[i % len(kinds)] for i in range(count)]
    sources = good.iloc[rng.integers(0, len(good), size=count)].to_dict("records")
    records = [_corrupt(record, kind, fmt) for record, kind in zip(sources, chosen, strict=True)]
    tally: dict[str, int] = {}
    for kind in chosen:
        tally[kind] = tally.get(kind, 0) + 1
    return records, chosen, tally


def _json_line(record: dict[str, Any]) -> str:
    clean = {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in record.items()}
    return json.dumps({k: v for k, v in clean.items() if v is not None}, separators=(",", ":"))


def _csv_line(record: dict[str, Any]) -> str:
    buffer = io.StringIO()
    row = ["" if v is None or (isinstance(v, float) and np.isnan(v)) else v
           for v in (record[c] for c in COLUMNS)]
    csv.writer(buffer, lineterminator="").writerow(row)
    return buffer.getvalue()


def _interleave(lines: list[str], extra: list[str], rng: np.random.Generator) -> list[str]:
    positions = np.sort(rng.integers(0, len(lines) + 1, size=len(extra)))
    out: list[str] = []
    previous = 0
    for position, line in zip(positions, extra, strict=True):
        out.extend(lines[previous:position])
        out.append(line)
        previous = int(position)
    out.extend(lines[previous:])
    return out


def _text_lines(good: pd.DataFrame, bad: list[dict[str, Any]], kinds: list[str], fmt: InputFormat,
                rng: np.random.Generator) -> str:
    encode: Callable[[dict[str, Any]], str]
    if fmt == "jsonl":
        body = good.to_json(orient="records", lines=True, double_precision=10)
        encode = _json_line
    else:
        body = good.to_csv(index=False, header=False, lineterminator="\n")
        encode = _csv_line
    bad_lines = []
    for record, kind in zip(bad, kinds, strict=True):
        line = encode(record)
        if kind == "malformed_record":
            # A line cut in half: unparseable JSON, or an unterminated quote in CSV.
            line = line[: len(line) // 2] if fmt == "jsonl" else f'"{line[: len(line) // 2]}'
        bad_lines.append(line)
    lines = _interleave(body.splitlines(), bad_lines, rng)
    header = [",".join(COLUMNS)] if fmt == "csv" else []
    return "\n".join(header + lines) + "\n"


def write_log(
    out: str | Path,
    *,
    events: int,
    users: int,
    items: int,
    days: int,
    seed: int = 0,
    bad_fraction: float = 0.0,
    fmt: InputFormat = "jsonl",
    start: datetime = DEFAULT_START,
    shape: str | None = None,
    split_last_day: bool = False,
    taste: Taste | None = None,
) -> GeneratedLog:
    """Write ``events`` log rows to ``out``; ``bad_fraction`` of them are bad rows;
    ``taste``: users differ in what they like (:func:`generate_events`).
    ``shape``: a public log's names (:data:`SHAPES`; no bad rows, a text format; the events
    its event types leave out are not written); with it, ``split_last_day`` writes the last
    UTC day apart, to ``<stem>-<day><suffix>`` beside ``out`` (the next day of one log)."""
    if not 0.0 <= bad_fraction <= 1.0:
        raise ValueError(f"bad_fraction must be within [0, 1], got {bad_fraction}")
    if shape is not None:
        return _write_shaped(Path(out), SHAPES[shape], fmt, generate_events(
            events, users, items, days, seed=seed, start=start, taste=taste), split_last_day)
    if split_last_day:
        raise ValueError("split_last_day needs a shape (the demo holds its day back itself)")
    bad_count = round(events * bad_fraction)
    good = generate_events(events - bad_count, users, items, days, seed=seed, start=start,
                           taste=taste)
    rng = np.random.default_rng(seed + 1)
    bad, kinds, tally = _bad_rows(good, bad_count, fmt, rng) if bad_count else ([], [], {})
    path = Path(out)
    if fmt == "parquet":
        rows = pd.concat([good, pd.DataFrame(bad, columns=list(COLUMNS))], ignore_index=True)
        rows = rows.iloc[rng.permutation(len(rows))] if bad else rows
        table = pa.Table.from_pandas(rows, preserve_index=False)
        write_whole(path, lambda p: pq.write_table(table, p))
    else:
        text = _text_lines(good, bad, kinds, fmt, rng)
        write_whole(path, lambda p: p.write_text(text))
    return GeneratedLog(path=path, rows=events, bad_rows=tally)


def _write_text(path: Path, text: str) -> None:
    path.write_text(text)


def _write_shaped(path: Path, shape: Shape, fmt: InputFormat, events: pd.DataFrame,
                  split_last_day: bool) -> GeneratedLog:
    if fmt not in ("csv", "jsonl"):
        raise ValueError(f"a shaped log is text: csv or jsonl, not {fmt}")
    days = events["ts"].str.slice(0, 10)  # ISO text: its UTC day
    last = days.max()
    parts = [(path, events[days < last] if split_last_day else events)]
    if split_last_day:
        parts.append((path.with_name(f"{path.stem}-{last}{path.suffix}"), events[days == last]))
    written = []
    for target, part in parts:
        rows = reshaped(part, shape)
        text = (rows.to_csv(index=False, lineterminator="\n") if fmt == "csv" else
                rows.to_json(orient="records", lines=True, double_precision=10))
        write_whole(target, functools.partial(_write_text, text=text))
        written.append((target, len(rows)))
    (main, rows_written), *apart = written
    return GeneratedLog(path=main, rows=rows_written, bad_rows={},
                        last_day=apart[0][0] if apart else None,
                        last_day_rows=apart[0][1] if apart else 0)


def log_day(line: str) -> str | None:
    """The UTC day (``YYYY-MM-DD``) of a raw log line with an ISO ``ts``; None without one.
    A string search, not a JSON parse: logs of gigabytes are split by day."""
    marker = '"ts":"2'
    start = line.find(marker)
    return line[start + len(marker) - 1:start + len(marker) + 9] if start >= 0 else None


def last_day_apart(raw: Path, earlier: Path, last: Path) -> str:
    """``raw`` as two files: every line but the last UTC day's (lines without a day too) in
    ``earlier``, the last day's in ``last``; that day."""
    with raw.open() as lines:
        day = max(filter(None, map(log_day, lines)))
    with raw.open() as lines, earlier.open("w") as before, last.open("w") as latest:
        for line in lines:
            (latest if log_day(line) == day else before).write(line)
    return day
