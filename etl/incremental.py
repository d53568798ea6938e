"""Incremental runs: a day's run reads the day's raw files and the state the last run left in
its output, and produces what a full run over every raw file would (docs/ARCHITECTURE.md,
"Incremental runs").

Every run writes ``state/`` into its output: the accepted events — validated, typed, every
exact duplicate once — each with its label and kept features (the outputs of the ops without
fitted statistics), as Parquet, and ``state.json`` (the state's version, the hash of the
settings that decide values, the latest event time, the cumulative row accounting). An
incremental run (``etl run --incremental --input NEW``) validates only ``NEW``, counts an
event the state already holds as a duplicate (so a day run twice changes nothing),
quarantines new events older than the state's latest (``late_event``) unless
``etl.incremental.allow_late``, computes the kept features of the new events over the
stored events they look back to (``window_rows``), and fits and applies the fitted ops over
every stored event — so every table equals a full run's that extends the same vocabularies
(tested table by table). Raw logs of earlier days are never read again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from featureline.core.metadata import METADATA_FILE
from featureline.etl.config import EtlConfig
from featureline.etl.errors import IncompatibleStateError
from featureline.etl.features.base import (
    EARLIER_EVENTS,
    EARLIER_POSITIVES,
    LABEL,
    TS_MICROS,
    Lookback,
)
from featureline.etl.outputs import read_as_written, reread, write_json

STATE_DIR = "state"
STATE_FILE = "state.json"
EVENTS_DIR = "events"
# What an incremental run writes while its features stage runs (gone before the output is).
WORK_DIR = "_work"
# Raised when what the state holds, or how, changes: an older state is refused.
STATE_VERSION = 2
LATE_EVENT = "late_event"
# Beside the rows the kept features are computed over: whether the result is the output's.
KEEP = "_keep"
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

    @property
    def events(self) -> Path:
        return self.folder / EVENTS_DIR


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
                 latest=datetime.fromisoformat(data["latest"]), rows=data["rows"])


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
            f"{state.values_hash[:12]}, this run's {values_hash(config)[:12]}: features, "
            f"label, validation or columns differ): {way_out}")
    settings = config.vocabulary
    if settings.refit or (settings.previous is not None
                          and Path(settings.previous).resolve() != output):
        raise IncompatibleStateError(
            f"{output}: an incremental run extends the output's own vocabularies; "
            f"--refit-vocabularies and --vocabulary-from start another lineage: {way_out}")


def stored_events(spark: SparkSession, state: State, columns: list[str]) -> DataFrame:
    """The state's events (``columns`` of them), as they were written."""
    return read_as_written(spark, state.events).select(*columns)


def cumulative(previous: dict[str, Any], this_run: dict[str, Any]) -> dict[str, Any]:
    """The output's row accounting after this run: the state's plus this run's, reason by
    reason; this run's own under ``this_run``."""
    reasons = dict(previous["quarantined"])
    for reason, count in this_run["quarantined"].items():
        reasons[reason] = reasons.get(reason, 0) + count
    return {**{key: previous[key] + this_run[key] for key in ("read", "accepted", "duplicates")},
            "quarantined": reasons, "this_run": this_run}


def write_state_events(events: DataFrame, staging: Path) -> DataFrame:
    """The state's events (each with its label and kept features) written into the output
    being written, and read back from there."""
    return reread(events, staging / STATE_DIR / EVENTS_DIR, files=None)


def write_state(events: DataFrame, rows: dict[str, Any], config: EtlConfig,
                staging: Path) -> None:
    """``state.json`` beside the state's ``events`` (``write_state_events``)."""
    folder = staging / STATE_DIR
    latest = events.agg(F.max("ts").cast("double").alias("latest")).collect()[0]["latest"]
    write_json({"version": STATE_VERSION, "values_hash": values_hash(config),
                "latest": datetime.fromtimestamp(latest, tz=timezone.utc).isoformat(),
                "rows": {key: value for key, value in rows.items() if key != "this_run"}},
               folder / STATE_FILE)


def dated(path: str, now: datetime | None = None) -> str:
    """``path`` with ``{yesterday}`` and ``{today}`` replaced by those UTC dates
    (YYYY-MM-DD): the daily chain names yesterday's files without a shell."""
    now = now or datetime.now(timezone.utc)
    return (path.replace("{yesterday}", f"{now - timedelta(days=1):%Y-%m-%d}")
            .replace("{today}", f"{now:%Y-%m-%d}"))


def window_rows(stored: DataFrame, new: DataFrame, dirty: DataFrame,
                lookback: Lookback) -> DataFrame:
    """The rows an incremental run computes the kept features over (docs/ARCHITECTURE.md,
    "Incremental runs"), ``KEEP`` true where the result is the output's: the new events and
    every stored event of a ``dirty`` user (one whose stored features moved). For the new
    events' other users, only the stored events their features read (``KEEP`` false): those
    within ``lookback`` of the user's first new event, the rows of the user's latest instant,
    and the latest event of each (user, item) pair the new events hold; with, per user, the
    events and positives before those (``EARLIER_EVENTS``, ``EARLIER_POSITIVES``).

    ``stored`` and ``new`` hold the event columns, the label and the time key."""
    touched = new.select("user_id").distinct().join(dirty, "user_id", "left_anti")
    theirs = stored.join(F.broadcast(touched), "user_id", "left_semi")
    times = F.sort_array(F.collect_list(TS_MICROS), asc=False)
    summary = theirs.groupBy("user_id").agg(F.max(TS_MICROS).alias("_last"),
                                             times.alias("_times"))
    first_new = new.groupBy("user_id").agg(F.min(TS_MICROS).alias("_first"))
    # The rows before the event: the 2K before the first new one may start before the rows
    # of the user's latest instant, which can sort after it.
    at_last = F.size(F.filter("_times", lambda t: t == F.col("_times")[0]))
    by_rows = F.coalesce(F.try_element_at("_times", F.lit(lookback.rows) + at_last),
                         F.lit(_EARLIEST))
    cut = F.least(F.col("_last"), F.col("_first") - F.lit(lookback.span_us), by_rows)
    cuts = summary.join(first_new, "user_id").select("user_id", cut.alias("_cut"))
    marked = theirs.join(F.broadcast(cuts), "user_id")
    before = marked.where(F.col(TS_MICROS) < F.col("_cut")).drop("_cut")
    pairs = new.select("user_id", "item_id").distinct()
    pair_latest = (before.join(pairs, ["user_id", "item_id"], "left_semi")
                   .groupBy("user_id", "item_id").agg(F.max(TS_MICROS).alias(TS_MICROS)))
    pair_keys = ["user_id", "item_id", TS_MICROS]
    context = (marked.where(F.col(TS_MICROS) >= F.col("_cut")).drop("_cut")
               .unionByName(before.join(pair_latest, pair_keys, "left_semi")))
    earlier = before.join(pair_latest, pair_keys, "left_anti").groupBy("user_id").agg(
        F.count(F.lit(1)).alias(EARLIER_EVENTS), F.sum(LABEL).alias(EARLIER_POSITIVES))
    rows = (context.withColumn(KEEP, F.lit(False))
            .unionByName(new.withColumn(KEEP, F.lit(True)))
            .unionByName(stored.join(F.broadcast(dirty), "user_id", "left_semi")
                         .withColumn(KEEP, F.lit(True))))
    return (rows.join(earlier, "user_id", "left")
            .fillna({EARLIER_EVENTS: 0, EARLIER_POSITIVES: 0}))
