"""Incremental runs: a day's run reads the day's raw files and the state the last run left in
its output, and produces what a full run over every raw file would (docs/ARCHITECTURE.md,
"Incremental runs").

Every run writes ``state/`` into its output: the accepted events — validated, typed, every
exact duplicate once — each with its label and kept features (the outputs of the ops
without fitted statistics), as Parquet a folder per UTC day, and ``state.json`` (the
state's version, the hash of the settings that decide values, the latest event time, the
cumulative row accounting). An incremental run (``etl run --incremental --input NEW``)
validates only ``NEW``, counts an event the state already holds as a duplicate (so a day
run twice changes nothing), quarantines new events older than the state's latest
(``late_event``) unless ``etl.incremental.allow_late``, computes the kept features of the
new events (and of the stored ones they move) over the stored events they look back to
(``window_context``, ``window_rows``), writes the state's days that changed
(``extend_state_events``), and fits and applies the fitted ops over every stored event — so
every table equals a full run's that extends the same vocabularies (tested table by table).
Raw logs of earlier days are never read again.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from featureline.core.metadata import EVENTS_DIR, EXAMPLE_DAY, METADATA_FILE, STATE_DIR
from featureline.core.time_rule import DAY as DAY_MICROS
from featureline.core.time_rule import floor_to, window_start
from featureline.etl.aggregations import WEIGHT, Lifetime
from featureline.etl.config import (
    EtlConfig,
    changed_outputs,
    other_settings_hash,
    output_fingerprints,
)
from featureline.etl.errors import IncompatibleStateError
from featureline.etl.features.base import (
    EARLIER_EVENTS,
    EARLIER_POSITIVES,
    EVENTS,
    LABEL,
    SPLIT,
    TRAIN,
    TS_MICROS,
    VALID,
    Lookback,
)
from featureline.etl.outputs import read_as_written, write_json, write_parquet

STATE_FILE = "state.json"
# What an incremental run writes while its features stage runs (gone before the output is).
WORK_DIR = "_work"
# The state's events are written a folder per UTC day of the events: ``state_day=YYYY-MM-DD``.
DAY = "state_day"
# Raised when what the state holds, or how, changes: an older state is refused. 8: the
# aggregations' snapshots a file per day (a day's run links the earlier days'); 9: the
# groups' day partials.
STATE_VERSION = 9
# Per entity table, its lifetime partials: what the next run's snapshots start from.
LIFETIME_DIR = "lifetime"
# Per entity table, the events as it reads them (``entities.entity_rows``: a row per key, day
# and label), a folder per UTC day (``DAY``): a later run reads the days it keeps from there.
ENTITY_ROWS_DIR = "entity_rows"
# Per aggregation group with outputs on days, its day partials (``etl.aggregations.
# day_partials``), a file per day: a later run reads the days it keeps from there.
DAY_PARTIALS_DIR = "day_partials"
LATE_EVENT = "late_event"
# Beside the rows the kept features are computed over: whether the result is the output's.
KEEP = "_keep"
# Per user of an incremental run: the time key of the user's earliest event whose kept
# features the run computes (again).
START = "_start"
# Per user of an incremental run: the time key from which its kept rows' features read its
# stored events before its ``START``.
CUT = "_cut"
# Per user of an incremental run: the time key from which its stored events before its
# ``START`` are the rows the kept features read one by one (the latest instant, the rows
# before it); ``CUT`` and the span may reach further back.
ROWS_FROM = "_rows_from"
# Per user of an incremental run: the time key of its latest kept row (its windows' last).
_END = "_end"
# Per user of an incremental run: the midnight (a time key) from which ``users_events`` holds
# its stored events whole, and its stored events and positives of the days before it.
READ_FROM = "_read_from"
# Per user of an incremental run: the midnight (a time key, from ``READ_FROM`` on) from which
# its stored days before its start's hold the rows ``cuts`` counts back through.
_ROWS_DAY = "_rows_day"
_DAYS_EVENTS = "_days_events"
# Per (user, item) pair of an incremental run's kept rows: its latest stored instant before
# the user's ``READ_FROM``.
_PAIR_LATEST = "_pair_latest"
_DAYS_POSITIVES = "_days_positives"
# Windows beyond this many, an incremental run folds events per the finest hop of them all
# (not per the finest of those that hold each).
_MASKED_WINDOWS_UP_TO = 6
# Per user of an incremental run: its stored events, and positives, before its ``START``.
_BEFORE_EVENTS = "_before_events"
_BEFORE_POSITIVES = "_before_positives"
# Before any event (microseconds since the epoch).
_EARLIEST = -(2**62)


def values_hash(config: EtlConfig) -> str:
    """The hash of the settings that decide the output values, less where the raw files
    are: a day's run reads other files than the run before it."""
    return config.hash(exclude_source_path=True)


@dataclass(frozen=True)
class State:
    """What an output's ``state/state.json`` says."""

    folder: Path
    version: int
    values_hash: str
    latest: datetime  # the latest event time the state holds (UTC)
    rows: dict[str, Any]  # the cumulative row accounting of the output
    # Per entity table, where its lifetime partials end (µs; ``lifetime_folder``).
    lifetimes: dict[str, int]
    # The fingerprint of each aggregation output and derived feature, and the hash of the
    # other settings (``etl.config.output_fingerprints``, ``other_settings_hash``); None in
    # a state written before them.
    outputs: dict[str, str] | None = None
    others: str | None = None

    @property
    def events(self) -> Path:
        return self.folder / EVENTS_DIR

    def lifetime(self, spark: SparkSession, entity: str) -> Lifetime | None:
        """The entity table's lifetime partials this state holds (None: none)."""
        if entity not in self.lifetimes:
            return None
        return Lifetime(read_as_written(spark, lifetime_folder(self.folder.parent, entity)),
                        self.lifetimes[entity])


def lifetime_folder(output: Path, entity: str) -> Path:
    """Where an output keeps an entity table's lifetime partials (``entities.Resume``)."""
    return output / STATE_DIR / LIFETIME_DIR / entity


def day_partials_folder(output: Path, group: str) -> Path:
    """Where an output keeps an aggregation group's day partials (``DAY_PARTIALS_DIR``)."""
    return output / STATE_DIR / DAY_PARTIALS_DIR / group


def entity_rows_folder(output: Path, entity: str) -> Path:
    """Where an output keeps an entity table's rows, a folder per day (``ENTITY_ROWS_DIR``)."""
    return output / STATE_DIR / ENTITY_ROWS_DIR / entity


def read_state(output: Path) -> State:
    """The state of the ETL output ``output``; a clear error where there is none."""
    path = output / STATE_DIR / STATE_FILE
    if not (output / METADATA_FILE).is_file():
        raise IncompatibleStateError(f"{output}: no ETL output there to extend (run "
                                     "`featureline etl run` without --incremental first)")
    if not path.is_file():
        raise IncompatibleStateError(f"{output}: the output holds no {STATE_DIR}/{STATE_FILE} "
                                     "(written before incremental runs existed): run "
                                     "`featureline etl run` once without --incremental")
    data = json.loads(path.read_text())
    return State(folder=path.parent, version=int(data["version"]),
                 values_hash=data["values_hash"],
                 latest=datetime.fromisoformat(data["latest"]), rows=data["rows"],
                 lifetimes=data.get("lifetimes", {}), outputs=data.get("outputs"),
                 others=data.get("others"))


def check_compatible(state: State, config: EtlConfig, output: Path) -> None:
    """Refuse to extend an output whose state this run cannot continue, naming what differs
    and the way out."""
    way_out = "run `featureline etl run` without --incremental (a full run) to start over"
    if state.version != STATE_VERSION:
        raise IncompatibleStateError(f"{output}: state version {state.version}, this run "
                                     f"writes {STATE_VERSION}: {way_out}")
    if state.values_hash != values_hash(config):
        raise IncompatibleStateError(
            f"{output}: the output was written with other settings (hash "
            f"{state.values_hash[:12]}, this run's {values_hash(config)[:12]}: "
            f"{_what_differs(state, config)}): {way_out}")
    check_lineage(config, output)


def check_lineage(config: EtlConfig, output: Path) -> None:
    """Refuse a run that extends ``output`` with vocabularies other than its own."""
    settings = config.vocabulary
    if settings.refit or (settings.previous is not None
                          and Path(settings.previous).resolve() != output):
        raise IncompatibleStateError(
            f"{output}: an incremental run extends the output's own vocabularies; "
            "--refit-vocabularies and --vocabulary-from start another lineage: run "
            "`featureline etl run` without --incremental (a full run) to start over")


def _what_differs(state: State, config: EtlConfig) -> str:
    """Which outputs differ from the state's, and whether the other settings do."""
    others = "features, label, validation or columns differ"
    if state.outputs is None or state.others is None:
        return others
    changed = changed_outputs(state.outputs, output_fingerprints(config))
    same = state.others == other_settings_hash(config)
    if changed:
        outputs = f"aggregations and derived features: {changed}"
        return f"{outputs}; the other settings are the same" if same else f"{outputs}; {others} too"
    return "the aggregations or derived features are in another order" if same else others


def stored_events(spark: SparkSession, state: State, columns: list[str],
                  since: datetime | None = None) -> DataFrame:
    """The state's events (``columns`` of them), as they were written; only those from
    ``since`` on where given (the days before are not read)."""
    events = read_as_written(spark, state.events)
    if since is not None:
        events = events.where(from_day(since))
    return events.select(*columns)


def day_folders(events: Path) -> dict[date, Path]:
    """The state's events' folders (``events``: its events folder), by their UTC day."""
    return {date.fromisoformat(folder.name.partition("=")[2]): folder
            for folder in sorted(events.glob(f"{DAY}=*"))}


def day_counts(state: State, new: DataFrame) -> dict[str, int]:
    """Every UTC day's count of events once ``new`` joins the state: the state's from the
    row counts its day files' footers hold (no Spark job: no file of the history read past
    its footer), plus the new ones'."""
    counts = {f"{day:%Y-%m-%d}": sum(pq.read_metadata(file).num_rows
                                     for file in folder.glob("*.parquet"))
              for day, folder in day_folders(state.events).items()}
    for row in with_day(new).groupBy(F.col(DAY).cast("string").alias(DAY)).count().collect():
        counts[row[DAY]] = counts.get(row[DAY], 0) + int(row["count"])
    return counts


def from_day(since: datetime) -> Column:
    """The state's events from ``since`` on: the days' folders before it are not read."""
    return (F.col(DAY) >= F.lit(since.date())) & (F.col("ts") >= F.lit(since))


def cumulative(previous: dict[str, Any], this_run: dict[str, Any]) -> dict[str, Any]:
    """The output's row accounting after this run: the state's plus this run's, reason by
    reason; this run's own under ``this_run``."""
    reasons = dict(previous["quarantined"])
    for reason, count in this_run["quarantined"].items():
        reasons[reason] = reasons.get(reason, 0) + count
    return {**{key: previous[key] + this_run[key] for key in ("read", "accepted", "duplicates")},
            "quarantined": reasons, "this_run": this_run}


def with_day(events: DataFrame) -> DataFrame:
    """``events`` with ``DAY``, the UTC date of each (the session's time zone is UTC)."""
    return events.withColumn(DAY, F.to_date("ts"))


def write_state_events(events: DataFrame, staging: Path, *, append: bool = False
                       ) -> DataFrame:
    """The state's events (each with its label and kept features) written into the output
    being written, a folder per day (``DAY``), and read back from there; ``append``: beside
    the days already there."""
    folder = staging / STATE_DIR / EVENTS_DIR
    write_parquet(with_day(events), folder, files=None, partition_by=DAY,
                  mode="append" if append else "errorifexists")
    return read_as_written(events.sparkSession, folder)


def extend_state_events(state: State, events: DataFrame, since: date,
                        staging: Path) -> DataFrame:
    """The state's events after an incremental run: the stored days before ``since``
    unchanged, their files linked into the output being written (copied where the
    filesystem links none), and ``events``, every event from ``since`` on, written; the
    whole read back."""
    link_days(state.events, staging / STATE_DIR / EVENTS_DIR, since)
    return write_state_events(events, staging, append=True)


def link_days(source: Path, target: Path, before: date) -> None:
    """The day folders of ``source`` (``day_folders``) before ``before``, their files linked
    into ``target`` (``link_folder``): the state's days a run keeps."""
    for day, stored in day_folders(source).items():
        if day < before:
            link_folder(stored, target / stored.name)


def link_or_copy(source: Path, target: Path) -> None:
    """``target`` the same file as ``source`` (a hard link: no bytes copied), or a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def link_folder(source: Path, target: Path, pattern: str = "*") -> None:
    """A new folder ``target`` holding ``source``'s files (those matching ``pattern``),
    each linked (``link_or_copy``)."""
    target.mkdir(parents=True)
    for file in source.glob(pattern):
        link_or_copy(file, target / file.name)


def write_state(events: DataFrame, rows: dict[str, Any], config: EtlConfig,
                staging: Path, lifetimes: dict[str, int]) -> None:
    """``state.json`` beside the state's ``events`` (``write_state_events``) and the entity
    tables' lifetime partials (``lifetimes``: where each ends)."""
    folder = staging / STATE_DIR
    # The latest event is in the newest day's folder: the others are not read.
    newest = max(day_folders(folder / EVENTS_DIR), default=None)
    if newest is not None:
        events = events.where(F.col(DAY) == F.lit(newest))
    latest = events.agg(F.max("ts").cast("double").alias("latest")).collect()[0]["latest"]
    write_json({"version": STATE_VERSION, "values_hash": values_hash(config),
                "outputs": output_fingerprints(config), "others": other_settings_hash(config),
                "latest": datetime.fromtimestamp(latest, tz=timezone.utc).isoformat(),
                "rows": {key: value for key, value in rows.items() if key != "this_run"},
                "lifetimes": lifetimes},
               folder / STATE_FILE)


def dated(path: str, now: datetime | None = None) -> str:
    """``path`` with ``{yesterday}`` and ``{today}`` replaced by those UTC dates
    (YYYY-MM-DD): the daily chain names yesterday's files without a shell."""
    now = now or datetime.now(timezone.utc)
    return (path.replace("{yesterday}", f"{now - timedelta(days=1):%Y-%m-%d}")
            .replace("{today}", f"{now:%Y-%m-%d}"))


def with_row_day(rows: DataFrame) -> DataFrame:
    """``rows`` (with the time key) with ``DAY``, the UTC date of each (the session's time
    zone is UTC: ``with_day``): how the state keeps the entity tables' rows."""
    return rows.withColumn(DAY, F.to_date(F.timestamp_micros(TS_MICROS)))


def _midnight_of(micros: Column) -> Column:
    return floor_to(micros, DAY_MICROS)


def reach(user_rows: DataFrame, starts: DataFrame, lookback: Lookback) -> DataFrame:
    """Per user ``starts`` names, beside its ``START``: ``READ_FROM``, the midnight (a time key)
    from which ``users_events`` reads the user's stored events whole, and the events and
    positives of its days before it (``_DAYS_EVENTS``, ``_DAYS_POSITIVES``), counted from
    ``user_rows``, the user table's rows the state keeps (``ENTITY_ROWS_DIR``: per user, UTC
    day and label). ``READ_FROM`` is the earlier of the midnight before ``START −
    lookback.span_us`` and the latest day from which the user's days before its start's hold
    ``lookback.rows`` events more than its latest such day does — so the events read hold
    the latest instant before the start (on that day or the start's) with its ties and the
    ``lookback.rows`` before them — or its first day where none does (docs/ARCHITECTURE.md,
    "Incremental runs"); that day (``_ROWS_DAY``, ``READ_FROM`` for a user without stored days
    before its start's) is where ``cuts`` starts sorting."""
    weight = F.col(WEIGHT) if WEIGHT in user_rows.columns else F.lit(1)
    # DateDiff from the epoch, not unix_date: the RAPIDS plugin plans DateDiff on the GPU.
    epoch = F.lit("1970-01-01").cast("date")
    day = F.datediff(F.col(DAY), epoch).cast("long") * F.lit(DAY_MICROS)
    days = (user_rows.join(starts, "user_id").where(day < _midnight_of(F.col(START)))
            .groupBy("user_id", day.alias("_day"))
            .agg(F.sum(weight).alias("_n"), F.sum(weight * F.col(LABEL)).alias("_p")))
    latest_first = Window.partitionBy("user_id").orderBy(F.col("_day").desc())
    held = F.sum("_n").over(latest_first.rowsBetween(Window.unboundedPreceding,
                                                     Window.currentRow))
    enough = held >= F.lit(lookback.rows) + F.first("_n").over(latest_first)
    reached = days.withColumn("_enough", enough).groupBy("user_id").agg(
        F.coalesce(F.max(F.when(F.col("_enough"), F.col("_day"))), F.min("_day"))
        .alias(_ROWS_DAY))
    # Least skips a null: a user without stored days before its start's reads from its span.
    read_from = F.least(_ROWS_DAY, _midnight_of(F.col(START) - F.lit(lookback.span_us)))
    bounds = starts.join(reached, "user_id", "left").select(
        "user_id", START, read_from.alias(READ_FROM),
        F.coalesce(_ROWS_DAY, read_from).alias(_ROWS_DAY))
    earlier = (days.join(bounds.select("user_id", READ_FROM), "user_id")
               .where(F.col("_day") < F.col(READ_FROM)).groupBy("user_id")
               .agg(F.sum("_n").alias(_DAYS_EVENTS), F.sum("_p").alias(_DAYS_POSITIVES)))
    return bounds.join(earlier, "user_id", "left").fillna({_DAYS_EVENTS: 0,
                                                          _DAYS_POSITIVES: 0})


def users_events(stored: DataFrame, bounds: DataFrame, pairs: DataFrame, *,
                 broadcast: bool) -> DataFrame:
    """The ``stored`` events that ``cuts`` and ``window_context`` read of the users
    ``bounds`` names (``reach``: a day's users, a small share of the history's): each one's
    from its ``READ_FROM`` on, and before that, of each of its (user, item) pairs in ``pairs``
    (the kept rows'), the events of the pair's latest instant there (``window_context`` reads
    nothing else of them: the pair's latest event before the window; a day's heavy users hold
    hundreds of events of each item they come back to), the pairs broadcast where
    ``broadcast``. One read of ``stored``."""
    # The users not forced to a broadcast: on a day of most users, the planner's choice
    # from the bounds' size.
    theirs = stored.join(bounds.select("user_id", READ_FROM), "user_id")
    marked = theirs.join((F.broadcast(pairs) if broadcast else pairs).withColumn(
        "_pair", F.lit(True)), ["user_id", "item_id"], "left")
    recent = F.col(TS_MICROS) >= F.col(READ_FROM)
    read = marked.where(recent | F.col("_pair").isNotNull())
    pair_latest = F.max(F.when(~recent, F.col(TS_MICROS))).over(
        Window.partitionBy("user_id", "item_id"))
    return (read.withColumn(_PAIR_LATEST, pair_latest)
            .where(recent | (F.col(TS_MICROS) == F.col(_PAIR_LATEST))).select(*stored.columns))


def cuts(stored: DataFrame, bounds: DataFrame, lookback: Lookback) -> DataFrame:
    """Per user ``bounds`` names (``reach``), beside its ``START``: ``CUT``, the time key
    from which the features of the user's kept rows read its stored events before the start
    (docs/ARCHITECTURE.md, "Incremental runs"): those within ``lookback`` of the start, the
    rows of the latest instant before it, and the ``lookback.rows`` before those; and
    ``ROWS_FROM``, where those rows start; and how many events and positives it has before
    its start (``_BEFORE_EVENTS``, ``_BEFORE_POSITIVES``: its days' before ``READ_FROM`` and
    its events' from there). A user without stored events before its start has none of
    these. ``stored`` (``users_events``) holds the time key and the label. Only the time
    keys from the user's ``_ROWS_DAY`` on are sorted: they hold those rows (``reach``), and a
    day's heavy users hold days more of events before them within the span."""
    earlier = (stored.select("user_id", TS_MICROS, LABEL).join(bounds, "user_id")
               .where((F.col(TS_MICROS) < F.col(START)) & (F.col(TS_MICROS) >= F.col(READ_FROM))))
    counted = F.when(F.col(TS_MICROS) >= F.col(_ROWS_DAY), F.col(TS_MICROS))
    times = F.sort_array(F.collect_list(counted), asc=False)
    summary = earlier.groupBy("user_id").agg(times.alias("_times"),
                                             F.count(F.lit(1)).alias("_events"),
                                             F.sum(LABEL).alias("_positives"))
    # The rows before the start: the 2K before it may start before the rows of the user's
    # latest earlier instant, which can sort after it.
    at_latest = F.size(F.filter("_times", lambda t: t == F.col("_times")[0]))
    by_rows = F.coalesce(F.try_element_at("_times", F.lit(lookback.rows) + at_latest),
                         F.lit(_EARLIEST))
    rows_from = F.least(F.col("_times")[0], by_rows)
    cut = F.least(rows_from, F.col(START) - F.lit(lookback.span_us))
    found = F.coalesce(F.col("_events"), F.lit(0)) > 0
    return (bounds.join(summary, "user_id", "left")
            .select("user_id", START, F.when(found, cut).alias(CUT),
                    F.when(found, rows_from).alias(ROWS_FROM),
                    F.when(found, F.col(_DAYS_EVENTS) + F.col("_events")).alias(_BEFORE_EVENTS),
                    F.when(found, F.col(_DAYS_POSITIVES) + F.col("_positives"))
                    .alias(_BEFORE_POSITIVES)))


def kept_rows(stored: DataFrame, new: DataFrame, starts: DataFrame) -> DataFrame:
    """The events whose kept features an incremental run computes: the new ones and each
    user's stored ones from its ``START`` (``starts``) on. ``stored`` (the stored events,
    those from the day of the earliest start on suffice) and ``new`` hold the event columns,
    the label and the time key."""
    again = (stored.join(starts.select("user_id", START), "user_id")
             .where(F.col(TS_MICROS) >= F.col(START)).drop(START))
    return new.unionByName(again)


def window_context(stored: DataFrame, kept: DataFrame, cut: DataFrame, lookback: Lookback, *,
                   broadcast: bool) -> DataFrame:
    """The stored rows an incremental run computes the ``kept_rows``' features with: the
    events they read (from the user's ``CUT`` to its ``START``) and the latest earlier event
    of each (user, item) pair the kept rows hold, each with ``EVENTS`` (the events it stands
    for). ``stored``: the users' stored events, of them the user, the time key, the item, the
    label and what else the ops read of earlier events (``Lookback.columns``). Where the ops
    allow it (``lookback.windows``), the events they read only as counts are folded
    (``folded``). The kept rows' pairs are broadcast where ``broadcast``: no shuffle of the
    events before the cut."""
    found = cut.where(F.col(CUT).isNotNull())
    theirs = (stored.join(found.select("user_id", START, CUT, ROWS_FROM), "user_id")
              .where(F.col(TS_MICROS) < F.col(START)))
    context = theirs.where(F.col(TS_MICROS) >= F.col(CUT)).drop(CUT)
    before = theirs.where(F.col(TS_MICROS) < F.col(CUT)).drop(START, CUT, ROWS_FROM)
    pairs = kept.select("user_id", "item_id").distinct()
    if broadcast:
        pairs = F.broadcast(pairs)
    one = F.lit(1).cast("long").alias(EVENTS)
    if lookback.windows:
        ends = kept.groupBy("user_id").agg(F.max(TS_MICROS).alias(_END))
        context = folded(context.join(F.broadcast(ends) if broadcast else ends, "user_id"),
                         pairs, lookback)
    else:
        context = context.select(*before.columns, one)
    pair_latest = (before.join(pairs, ["user_id", "item_id"], "left_semi")
                   .groupBy("user_id", "item_id").agg(F.max(TS_MICROS).alias(TS_MICROS)))
    latest_rows = before.join(F.broadcast(pair_latest) if broadcast else pair_latest,
                              ["user_id", "item_id", TS_MICROS], "left_semi")
    return context.unionByName(latest_rows.select(*before.columns, one))


def window_rows(context: DataFrame, kept: DataFrame, cut: DataFrame,
                lookback: Lookback) -> DataFrame:
    """The rows an incremental run computes the kept features over: the ``kept_rows``
    (``KEEP`` true: their results are the output's) and the stored rows they read
    (``window_context``'s ``context``: their other columns null), with, per user, the events
    and positives before those (``EARLIER_EVENTS``, ``EARLIER_POSITIVES``); ``EVENTS`` where
    some were folded (``lookback.windows``)."""
    # The events before the start less those the rows stand for.
    read = context.groupBy("user_id").agg(F.sum(EVENTS).alias("_read_events"),
                                          F.sum(LABEL).alias("_read_positives"))
    earlier = cut.where(F.col(CUT).isNotNull()).join(read, "user_id", "left").select(
        "user_id", *((F.col(total) - F.coalesce(F.col(part), F.lit(0))).alias(name)
                     for name, total, part in (
                         (EARLIER_EVENTS, _BEFORE_EVENTS, "_read_events"),
                         (EARLIER_POSITIVES, _BEFORE_POSITIVES, "_read_positives"))))
    rows = (context.withColumn(KEEP, F.lit(False))
            .unionByName(kept.withColumn(KEEP, F.lit(True)), allowMissingColumns=True))
    rows = rows.join(earlier, "user_id", "left").fillna({EARLIER_EVENTS: 0, EARLIER_POSITIVES: 0})
    # Every row one event where nothing was folded: the ops count rows.
    return rows.fillna({EVENTS: 1}) if lookback.windows else rows.drop(EVENTS)


def folded(context: DataFrame, pairs: DataFrame, lookback: Lookback) -> DataFrame:
    """``context`` (stored events with their user's ``START``, ``ROWS_FROM`` and ``_END``)
    with the events the ops read only as counts in ``lookback.windows`` — those before the
    user's rows (``ROWS_FROM``) — folded: per user, and per user and item for the (user,
    item) pairs of ``pairs``, which the user–item scope counts (no item for the others),
    into a row per set of events that no window of a kept row (from ``START`` to ``_END``)
    tells apart. An event every kept row's windows hold or leave alike (a window holds it
    for every kept row, or for none) folds with all the user's events that share its set of
    windows; any other, per the finest hop among the windows that hold it for some kept row
    (its boundaries are multiples of their hops). A row stands for its events: ``EVENTS``
    their number, the label their positives, the time key their latest, no other column.
    The rows that stay have ``EVENTS`` 1. On a long history a day's heavy users hold most of
    the window's rows, and most of theirs are of the items they come back to. One
    aggregation: a row that stays is its own group (equal rows, one group and as many rows
    again)."""
    ts = F.col(TS_MICROS)
    windows = lookback.windows

    # Per window: whether it holds the event for some kept row (the first one's start is the
    # earliest), and for every one (the last one's is the latest).
    some = [ts >= window_start(F.col(START), length, hop) for length, hop in windows]
    every = [ts >= window_start(F.col(_END), length, hop) for length, hop in windows]
    alike = functools.reduce(Column.__and__, (~a | b for a, b in zip(some, every, strict=True)))
    mask = functools.reduce(Column.__add__, (F.when(a, 1 << i).otherwise(0)
                                             for i, a in enumerate(some)))
    finest = math.gcd(*(hop for _, hop in windows))
    size: Column = F.lit(finest)
    if len(windows) <= _MASKED_WINDOWS_UP_TO:
        for bits in range(1, 1 << len(windows)):
            hops = [hop for i, (_, hop) in enumerate(windows) if bits >> i & 1]
            size = F.when(mask == bits, F.lit(math.gcd(*hops))).otherwise(size)
    single = ts >= F.col(ROWS_FROM)
    # The group of an event folded: its set of windows where alike, else its span.
    group = (F.when(single, F.lit(None)).when(alike, -1 - mask)
             .otherwise(floor_to(ts, size)).cast("long"))
    length = F.when(single | alike, F.lit(None)).otherwise(size).cast("long")
    columns = [c for c in context.columns if c not in ("user_id", START, ROWS_FROM, _END)]
    marked = context.join(pairs.withColumn("_pair", F.lit(True)), ["user_id", "item_id"], "left")
    keys = [F.when(single | F.col("_pair") if c == "item_id" else single, F.col(c)).alias(c)
            for c in columns]
    groups = marked.groupBy("user_id", *keys, group.alias("_span"), length.alias("_size")).agg(
        F.max(TS_MICROS).alias("_latest"), F.count(F.lit(1)).alias("_events"),
        F.sum(LABEL).alias("_positives"))
    stays = F.col("_span").isNull()
    label = context.schema[LABEL].dataType
    values = {TS_MICROS: F.col("_latest"), LABEL: F.col("_positives").cast(label)}
    return groups.select(
        "user_id", *(F.when(stays, F.col(c)).otherwise(values[c]).alias(c) if c in values
                     else F.col(c) for c in columns),
        F.when(stays, F.lit(1)).otherwise(F.col("_events")).cast("long").alias(EVENTS),
        F.explode(F.when(stays, F.array_repeat(F.lit(0), F.col("_events").cast("int")))
                  .otherwise(F.array(F.lit(0)))).alias("_copy")).drop("_copy")


def unchanged(stored: DataFrame, starts: DataFrame) -> DataFrame:
    """The stored events ``window_rows`` does not compute again: those before their user's
    ``START``, and every event of the users ``starts`` does not name."""
    return (stored.join(starts, "user_id", "left")
            .where(F.col(START).isNull() | (F.col(TS_MICROS) < F.col(START))).drop(START))


def split_of(day: date, valid_from: datetime) -> str:
    """The split of a day's examples: the validation split starts at a midnight."""
    return TRAIN if day < valid_from.date() else VALID


def link_example_days(previous: Path, staging: Path, before: date, valid_from: datetime
                      ) -> list[date]:
    """The previous output's example days before ``before``, their files linked into the
    examples being written, each under this run's split of its day (a day leaving the
    validation split moves folders, not bytes); the days linked come back."""
    linked = []
    for folder in sorted(previous.glob(f"examples/{SPLIT}=*/{EXAMPLE_DAY}=*")):
        day = date.fromisoformat(folder.name.partition("=")[2])
        if day >= before:
            continue
        link_folder(folder, staging / "examples" / f"{SPLIT}={split_of(day, valid_from)}"
                    / folder.name, "*.parquet")
        linked.append(day)
    return linked


def link_table_days(previous: Path, folder: Path, through: date) -> None:
    """The files of a table written a file per day (``outputs.write_parquet_days``) in the
    previous output's ``previous`` folder, of the days up to ``through``, linked into
    ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for file in previous.glob("????-??-??-part-*.parquet"):
        if date.fromisoformat(file.name[:10]) <= through:
            link_or_copy(file, folder / file.name)


def link_tfrecord_days(files: list[dict[str, Any]], previous: Path, staging: Path,
                       before: date, valid_from: datetime) -> list[dict[str, Any]]:
    """The previous output's TFRecord files (metadata.json's ``files``) of the days before
    ``before``, linked into the TFRecords being written under this run's split of their
    day; their entries come back as this run's metadata.json lists them."""
    linked = []
    for entry in files:
        day = date.fromisoformat(entry["day"])
        if day >= before:
            continue
        split = split_of(day, valid_from)
        path = f"tfrecord/{split}/{Path(entry['path']).name}"
        (staging / path).parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(previous / entry["path"], staging / path)
        linked.append({**entry, "path": path, "split": split})
    return linked
