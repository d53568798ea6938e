"""The job's first stages: ingest (read, validate, label) and split, for a full run and for an
incremental run's new days (docs/ARCHITECTURE.md, "The flow")."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from featureline.core.errors import ConfigError
from featureline.core.events import REASONS
from featureline.etl import ingest, label_join
from featureline.etl.config import EtlConfig, LabelRule, categorical_columns
from featureline.etl.errors import MostlyQuarantinedError, NoInputError
from featureline.etl.features.base import (
    LABEL,
    SPLIT,
    TRAIN,
    VALID,
)
from featureline.etl.incremental import (
    EVENTS_DIR,
    LATE_EVENT,
    STATE_DIR,
    State,
    cumulative,
    stored_events,
)
from featureline.etl.outputs import (
    read_as_written,
    write_parquet,
)

logger = logging.getLogger("featureline.etl")

logger = logging.getLogger("featureline.etl")

# Beside the new rows of an incremental run's ingest: an event older than the state's latest.
LATE = "_late"
# The reasons metadata.json counts quarantined rows by: the validation's, and an incremental
# run's late events (0 in a full run).
QUARANTINE_REASONS = (*REASONS, LATE_EVENT)




def label_column(rule: LabelRule, config: EtlConfig) -> Column:
    """1 where the event matches the rule, else 0 (a missing value never matches)."""
    return label_join.matches(rule, frozenset(categorical_columns(config))).cast("long")


def valid_from_day(events: DataFrame, valid_days: int) -> datetime:
    """Midnight (UTC) starting the last ``valid_days`` days of the events.

    The latest event comes back as epoch seconds: a timestamp collected into Python is a
    naive local time of the machine, which would move the boundary with its time zone.
    """
    last = events.agg(F.max("ts").cast("long").alias("last")).collect()[0]["last"]
    latest = datetime.fromtimestamp(last, tz=timezone.utc)
    start = latest.replace(hour=0, minute=0, second=0, microsecond=0)
    return start - timedelta(days=valid_days - 1)


def _account(validated: DataFrame) -> dict[str | None, int]:
    return {row[ingest.REASON]: row["count"]
            for row in validated.groupBy(ingest.REASON).count().collect()}




def _validated(spark: SparkSession, config: EtlConfig,
               cached: list[DataFrame]) -> tuple[DataFrame, dict[str | None, int]]:
    """The raw rows of ``config.source``, validated and cached, and their count by reason
    (None: valid)."""
    # Parse once; the record text stays for the quarantine and the duplicates lists.
    raw = ingest.read_raw(spark, config.source, config.attributes, config.validation.ts_unit)
    validated = ingest.validate(raw, config)
    validated = validated.persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(validated)
    counts = _account(validated)
    read = sum(counts.values())
    if read == 0:
        raise NoInputError(f"{config.source.path}: the source holds no rows")
    for reason, rows in counts.items():
        if reason is not None and 2 * rows > read:
            raise MostlyQuarantinedError(reason, rows, read, _setting_of(reason, config,
                                                                         validated))
    return validated, counts


# Events before this time, where etl.validation.ts_min is unset, are likely a zero or a time
# in another unit: the run warns of them.
PLAUSIBLE_SINCE = datetime(1980, 1, 1, tzinfo=timezone.utc)
# Events spanning more years than this, the same.
PLAUSIBLE_YEARS = 30


def _warn_of_span(events: DataFrame, config: EtlConfig) -> None:
    """A warning where the accepted events span an implausible time and no bound was set."""
    if config.validation.ts_min is not None:
        return
    first, last = events.agg(F.min("ts"), F.max("ts")).collect()[0]
    first, last = (t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t
                   for t in (first, last))
    if first < PLAUSIBLE_SINCE or (last - first).days > 365 * PLAUSIBLE_YEARS:
        logger.warning("the events span %s to %s: a zero or a time in another unit? "
                       "etl.validation.ts_unit reads numbers; etl.validation.ts_min and "
                       "ts_max quarantine events outside a window",
                       first.date().isoformat(), last.date().isoformat())


def _setting_of(reason: str, config: EtlConfig, validated: DataFrame) -> str:
    """The setting most likely behind a reason that quarantines most rows, as a user reads
    it: the key, and what the rows hold where that helps."""
    role = reason.removeprefix("missing_")
    if reason == "timestamp_out_of_window":
        validation = config.validation
        first, last = (validated.where(F.col(ingest.REASON) == reason)
                       .agg(F.min("ts"), F.max("ts")).collect()[0])
        return (f"etl.validation.ts_min ({validation.ts_min}) and ts_max ({validation.ts_max}),"
                f" or etl.validation.ts_unit: those rows are dated {first} to {last}")
    settings = {
        "malformed_record": "etl.source.format and etl.source.options (sep, quote, header)",
        "bad_timestamp": f"etl.source.columns.ts ({config.source.columns.ts!r}) and "
                         "etl.validation.ts_unit",
        "unknown_event_type": f"etl.validation.event_types ({config.validation.event_types})"
                              " or etl.source.columns.event_type",
        "bad_number": "etl.source.continuous and etl.source.columns.value (numeric columns)",
        "non_finite_number": "etl.source.continuous and etl.source.columns.value",
    }
    if role in ("user_id", "item_id", "event_type", "ts"):
        return f"etl.source.columns.{role} ({getattr(config.source.columns, role)!r})"
    return settings.get(reason, "etl.source and etl.validation")


def _labelled(events: DataFrame, config: EtlConfig,
              cached: list[DataFrame]) -> tuple[DataFrame, int]:
    """The events with their label (with a label join: whether each is a positive), cached,
    and how many."""
    events = events.withColumn(LABEL, label_column(config.positive, config))
    events = events.persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(events)
    return events, events.count()


def _partitions(spark: SparkSession) -> int:
    # Partition by user before removing duplicates: the user-scoped windows of the features
    # and the user snapshots need that partitioning anyway, so it costs the only shuffle.
    return int(cast(str, spark.conf.get("spark.sql.shuffle.partitions")))  # always set


def ingest_full(spark: SparkSession, config: EtlConfig, staging: Path,
            cached: list[DataFrame]) -> tuple[DataFrame, dict[str, Any]]:
    """Validate, write the quarantine, de-duplicate and label; the events come back cached."""
    validated, counts = _validated(spark, config, cached)
    read = sum(counts.values())
    write_parquet(ingest.quarantined(validated), staging / "quarantine")
    valid_rows = counts.pop(None, 0)
    events = ingest.deduplicate(ingest.accepted(validated, config)
                                .repartition(_partitions(spark), "user_id"))
    events, accepted = _labelled(events, config, cached)
    if accepted == 0:
        raise NoInputError(f"{config.source.path}: every row was quarantined: {counts}")
    _warn_of_span(events, config)
    removed = ingest.duplicates(validated, events, config, valid_rows - accepted)
    # A log without duplicates skips the search and gets an empty list with the columns.
    write_parquet(removed if valid_rows > accepted else removed.limit(0),
                  staging / "duplicates")
    validated.unpersist()
    rows = {"read": read, "accepted": accepted, "duplicates": valid_rows - accepted,
            "quarantined": {reason: counts.get(reason, 0) for reason in QUARANTINE_REASONS}}
    return events.drop(ingest.COPIES), rows


def ingest_incremental(spark: SparkSession, config: EtlConfig, staging: Path,
                        cached: list[DataFrame], state: State, output: Path
                        ) -> tuple[DataFrame, dict[str, Any]]:
    """``_ingest`` of the new raw files against the ``state`` of ``output``: the new events
    come back, labelled and cached (an allowed late event among them). A new copy of an event
    the state holds is a duplicate (listed with the stored event as the kept one); a late
    event is quarantined as ``late_event`` unless late events are allowed; the quarantine
    and duplicates lists are the output's and this run's (docs/ARCHITECTURE.md, "Incremental
    runs")."""
    validated, counts = _validated(spark, config, cached)
    read = sum(counts.values())
    valid_rows = counts.pop(None, 0)
    columns = ingest.event_columns(config)
    events, distinct = _labelled(ingest.deduplicate(ingest.accepted(validated, config)
                                                    .repartition(_partitions(spark), "user_id")),
                                 config, cached)
    # The stored copies of new events: only stored events as old as the new ones are read.
    earliest = events.agg(F.min(F.col("ts").cast("long"))).collect()[0][0]
    stored = (stored_events(spark, state, columns,
                            since=datetime.fromtimestamp(earliest, timezone.utc))
              if earliest is not None else stored_events(spark, state, columns).limit(0))
    held_events = ingest.matching(stored, events, config,
                                  broadcast=distinct <= ingest.BROADCAST_DUPLICATES)
    held_events = held_events.persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(held_events)
    held = ingest.matching(events, held_events, config, broadcast=True)
    fresh = (ingest.matching(events, held_events, config, broadcast=True, anti=True)
             .withColumn(LATE, F.col("ts") < F.lit(state.latest)))
    # Late events are kept (``LATE`` still says which) where they are allowed.
    refuse = F.col(LATE) & F.lit(not config.incremental.allow_late)
    fresh_events, late_events, late_rows = fresh.agg(
        F.count(F.lit(1)), F.count_if(refuse),
        F.sum(F.when(refuse, F.col(ingest.COPIES)))).collect()[0]
    late_rows = int(late_rows or 0)
    accepted = fresh_events - late_events
    refused, kept = fresh.where(refuse), fresh.where(~refuse)
    quarantine = (read_as_written(spark, output / "quarantine")
                  .unionByName(ingest.quarantined(validated)))
    if late_rows:
        copies = ingest.copies_of(validated, refused, config,
                                  broadcast=late_rows <= ingest.BROADCAST_DUPLICATES)
        quarantine = quarantine.unionByName(copies.select(
            ingest.record_text(copies), F.lit(LATE_EVENT).alias(ingest.REASON),
            F.lit("ts").alias(ingest.FIELD), ingest.SOURCE_FILE))
    write_parquet(quarantine, staging / "quarantine")
    duplicates = valid_rows - accepted - late_rows
    removed = ingest.duplicates(validated, kept, config, duplicates)
    removed = (read_as_written(spark, output / "duplicates").unionByName(removed)
               .unionByName(ingest.held_copies(
                   validated, held, config, f"{STATE_DIR}/{EVENTS_DIR}",
                   broadcast=duplicates <= ingest.BROADCAST_DUPLICATES)))
    write_parquet(removed, staging / "duplicates")
    validated.unpersist()
    quarantined = {reason: counts.get(reason, 0) for reason in QUARANTINE_REASONS}
    rows = cumulative(state.rows, {"read": read, "accepted": accepted,
                                   "duplicates": duplicates,
                                   "quarantined": {**quarantined, LATE_EVENT: late_rows}})
    return kept.drop(ingest.COPIES, LATE), rows


def split_full(events: DataFrame, config: EtlConfig) -> tuple[DataFrame, dict[str, Any]]:
    """Tag the last ``valid_days`` days as the validation split."""
    valid_from = valid_from_day(events, config.split.valid_days)
    events = events.withColumn(SPLIT, split_column(valid_from))
    split_rows = {TRAIN: 0, VALID: 0} | {
        row[SPLIT]: row["count"] for row in events.groupBy(SPLIT).count().collect()}
    return events, _split_entry(valid_from, split_rows, config)


def split_incremental(events: DataFrame, state: State, newest: DataFrame, new: DataFrame,
                       rows: dict[str, Any], config: EtlConfig
                       ) -> tuple[DataFrame, dict[str, Any]]:
    """``_split`` of an incremental run without reading every event: the latest is among the
    ``newest`` (the state's last day and the new events), the validation split's rows are
    the stored ones from its start (only those days are read) and the new ones, and the
    training split holds the others of the ``rows["accepted"]`` events the state will hold."""
    valid_from = valid_from_day(newest, config.split.valid_days)
    valid = (stored_events(events.sparkSession, state, ["ts"], since=valid_from).count()
             + new.where(F.col("ts") >= F.lit(valid_from)).count())
    split_rows = {TRAIN: rows["accepted"] - valid, VALID: valid}
    return events.withColumn(SPLIT, split_column(valid_from)), _split_entry(
        valid_from, split_rows, config)


def _split_entry(valid_from: datetime, split_rows: dict[str, int], config: EtlConfig
                 ) -> dict[str, Any]:
    """metadata.json's ``split``; a clear error where no training row is left."""
    if split_rows[TRAIN] == 0:
        raise ConfigError("etl.split.valid_days",
                          f"all events fall in the last {config.split.valid_days} day(s) "
                          f"(from {valid_from:%Y-%m-%d}); no training split is left")
    return {"column": SPLIT, "valid_days": config.split.valid_days,
            "valid_from": valid_from.isoformat(), "rows": split_rows}


def split_column(valid_from: datetime) -> Column:
    return F.when(F.col("ts") >= F.lit(valid_from), VALID).otherwise(TRAIN)


