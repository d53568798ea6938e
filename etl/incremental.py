"""Incremental runs: a day's run reads the day's raw files and the state the last run left in
its output, and produces what a full run over every raw file would (docs/ARCHITECTURE.md,
"Incremental runs").

Every run writes ``state/`` into its output: the accepted events — validated, typed, every
exact duplicate once — as Parquet, and ``state.json`` (the state's version, the hash of the
settings that decide values, the latest event time, the cumulative row accounting). An
incremental run (``etl run --incremental --input NEW``) validates only ``NEW``, counts an
event the state already holds as a duplicate (so a day run twice changes nothing),
quarantines new events older than the state's latest (``late_event``) unless
``etl.incremental.allow_late``, and computes the features over
the state's events and the new ones — so every table equals a full run's that extends the
same vocabularies (tested table by table). Raw logs of earlier days are never read again;
the features are still computed over the whole history.
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
from featureline.etl.outputs import write_json, write_parquet

STATE_DIR = "state"
STATE_FILE = "state.json"
EVENTS_DIR = "events"
# Raised when what the state holds, or how, changes: an older state is refused.
STATE_VERSION = 1
LATE_EVENT = "late_event"


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
    return spark.read.parquet(str(state.events)).select(*columns)


def cumulative(previous: dict[str, Any], this_run: dict[str, Any]) -> dict[str, Any]:
    """The output's row accounting after this run: the state's plus this run's, reason by
    reason; this run's own under ``this_run``."""
    reasons = dict(previous["quarantined"])
    for reason, count in this_run["quarantined"].items():
        reasons[reason] = reasons.get(reason, 0) + count
    return {**{key: previous[key] + this_run[key] for key in ("read", "accepted", "duplicates")},
            "quarantined": reasons, "this_run": this_run}


def write_state(events: DataFrame, rows: dict[str, Any], config: EtlConfig,
                staging: Path) -> None:
    """``state/`` of the output being written: its accepted events and ``state.json``."""
    folder = staging / STATE_DIR
    write_parquet(events, folder / EVENTS_DIR, files=None)
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
