"""The ETL job: ingest → validate → label and split → features → write, timed per stage."""

from __future__ import annotations

import functools
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from featureline.core import __version__
from featureline.core.aggregations import ENTITIES, GroupSpec, entity_group
from featureline.core.drift import (
    METRICS_FILE,
    PROFILE_FILE,
    REFERENCE_PROFILE_FILE,
    REPORT_FILE,
    Measurement,
    measure,
    prometheus,
    verdict,
)
from featureline.core.drift_report import render
from featureline.core.drift_window import (
    pinned_days,
    pooled,
    replaced_days,
    window,
    write_window,
)
from featureline.core.errors import ConfigError
from featureline.core.events import REASONS, micros_of
from featureline.core.files import staged_directory
from featureline.core.metadata import (
    AGGREGATIONS_DIR,
    EVENT_TIMESTAMP,
    EXAMPLE_DAY,
    FORMAT_VERSION,
    METADATA_FILE,
    TILES_DIR,
    VOCABULARY_DIR,
    Metadata,
    present,
    read_metadata,
)
from featureline.core.model_inputs import ModelInputs, attribute_name
from featureline.etl import ingest, label_join, stages
from featureline.etl.aggregations import (
    Lifetime,
    events_cut,
    last_snapshot,
    output_tiles,
)
from featureline.etl.config import EtlConfig, LabelRule, categorical_columns
from featureline.etl.data_profile import day_totals, profile_columns, profiles, seeded_totals
from featureline.etl.embedding_plan import embedding_plan
from featureline.etl.entities import Resume, entity_rows, entity_snapshots, resume_from
from featureline.etl.errors import MostlyQuarantinedError, NoInputError
from featureline.etl.features.aggregate import Aggregations
from featureline.etl.features.base import (
    LABEL,
    MICROS,
    SPLIT,
    TRAIN,
    TS_MICROS,
    VALID,
    FeatureSpec,
    epoch_micros,
    with_time_key,
)
from featureline.etl.features.categorify import Categorify
from featureline.etl.features.pipeline import LABEL_SHORT_NAME, FeaturePipeline
from featureline.etl.fit import Fit, keeps, load_fit, new_fit, scheduled_fit
from featureline.etl.incremental import (
    DAY,
    EVENTS_DIR,
    KEEP,
    LATE_EVENT,
    START,
    STATE_DIR,
    WORK_DIR,
    State,
    check_compatible,
    cumulative,
    cuts,
    day_counts,
    day_partials_folder,
    entity_rows_folder,
    extend_state_events,
    from_day,
    kept_rows,
    lifetime_folder,
    link_days,
    link_example_days,
    link_table_days,
    link_tfrecord_days,
    reach,
    read_state,
    stored_events,
    unchanged,
    users_events,
    values_hash,
    window_context,
    window_rows,
    with_row_day,
    write_state,
    write_state_events,
)
from featureline.etl.outputs import (
    local_path,
    read_as_written,
    reread,
    write_each,
    write_json,
    write_parquet,
    write_parquet_days,
)
from featureline.etl.tfrecord.layout import build_layout
from featureline.etl.tfrecord.writer import split_sources, write_split
from featureline.etl.vocabulary import (
    PreviousVocabularies,
    lineage_entry,
    load_previous,
    previous_output,
)

logger = logging.getLogger("featureline.etl")

KEYS = ("user_id", "item_id", "ts")
# Beside the new rows of an incremental run's ingest: an event older than the state's latest.
LATE = "_late"
# The reasons metadata.json counts quarantined rows by: the validation's, and an incremental
# run's late events (0 in a full run).
QUARANTINE_REASONS = (*REASONS, LATE_EVENT)
# Seconds between progress lines while a stage runs.
PROGRESS_EVERY_S = 5.0
# Up to this many events an incremental run computes kept features for, their (user, item)
# pairs are broadcast to find the pairs' latest stored events.
BROADCAST_KEPT = 1_000_000
SPARK_TYPES = {"categorical": "long", "continuous": "float", "multi_hot": "array<long>"}


@dataclass(frozen=True)
class JobResult:
    output: Path
    metadata: dict[str, Any]


@dataclass
class Stage:
    """What a stage says of its work when it is done (``StageTimer``'s last line)."""

    summary: str = ""


class StageTimer:
    """Times the job's stages, tags the Spark jobs each one runs, and while a stage runs
    reports every ``PROGRESS_EVERY_S`` seconds the Spark stages and tasks done (in our own
    lines: the profiles switch Spark's console bar off); a stage's last line adds what it
    wrote (``Stage.summary``)."""

    def __init__(self, progress: Callable[[str], None],
                 spark: SparkSession | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.progress = progress
        self.context = spark.sparkContext if spark is not None else None

    def _watch(self, stage: str, started: float, done: threading.Event) -> None:
        assert self.context is not None
        tracker = self.context.statusTracker()
        while not done.wait(PROGRESS_EVERY_S):
            running = [info for info in map(tracker.getStageInfo, tracker.getActiveStageIds())
                       if info is not None]
            if running:
                finished = sum(info.numCompletedTasks for info in running)
                total = sum(info.numTasks for info in running)
                self.progress(f"{stage}: {time.perf_counter() - started:.0f}s, "
                              f"{len(running)} Spark stage(s) running, tasks {finished}/{total}")

    def _tag(self, stage: str | None) -> None:
        if self.context is not None:
            self.context.setLocalProperty(stages.STAGE_PROPERTY, stage)  # type: ignore[arg-type]
            self.context.setJobDescription(f"featureline {stage}" if stage else None)  # type: ignore[arg-type]
            # In the driver's log too, where the plans the RAPIDS Accelerator logs follow it.
            log4j = self.context._jvm.org.apache.logging.log4j  # type: ignore[union-attr]
            log4j.LogManager.getLogger(stages.STAGE_LOGGER).info(stage or "")

    @contextmanager
    def __call__(self, stage: str) -> Iterator[Stage]:
        self.progress(f"{stage} ...")
        start = time.perf_counter()
        self._tag(stage)
        done = threading.Event()
        if self.context is not None:
            threading.Thread(target=self._watch, args=(stage, start, done), daemon=True,
                             name=f"progress-{stage}").start()
        outcome = Stage()
        try:
            yield outcome
        finally:
            done.set()
            self._tag(None)
        self.seconds[stage] = round(time.perf_counter() - start, 3)
        summary = f": {outcome.summary}" if outcome.summary else ""
        self.progress(f"{stage} done in {self.seconds[stage]:.1f}s{summary}")


def label_column(rule: LabelRule, config: EtlConfig) -> Column:
    """1 where the event matches the rule, else 0 (a missing value never matches)."""
    return label_join.matches(rule, frozenset(categorical_columns(config))).cast("long")


def _valid_from(events: DataFrame, valid_days: int) -> datetime:
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


def table_schema(frame: DataFrame, columns: list[str]) -> list[dict[str, str]]:
    types = dict(frame.dtypes)
    return [{"name": c, "dtype": types[c]} for c in columns]


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


def _ingest(spark: SparkSession, config: EtlConfig, staging: Path,
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


def _ingest_incremental(spark: SparkSession, config: EtlConfig, staging: Path,
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


def _split(events: DataFrame, config: EtlConfig) -> tuple[DataFrame, dict[str, Any]]:
    """Tag the last ``valid_days`` days as the validation split."""
    valid_from = _valid_from(events, config.split.valid_days)
    events = events.withColumn(SPLIT, split_column(valid_from))
    split_rows = {TRAIN: 0, VALID: 0} | {
        row[SPLIT]: row["count"] for row in events.groupBy(SPLIT).count().collect()}
    return events, _split_entry(valid_from, split_rows, config)


def _split_incremental(events: DataFrame, state: State, newest: DataFrame, new: DataFrame,
                       rows: dict[str, Any], config: EtlConfig
                       ) -> tuple[DataFrame, dict[str, Any]]:
    """``_split`` of an incremental run without reading every event: the latest is among the
    ``newest`` (the state's last day and the new events), the validation split's rows are
    the stored ones from its start (only those days are read) and the new ones, and the
    training split holds the others of the ``rows["accepted"]`` events the state will hold."""
    valid_from = _valid_from(newest, config.split.valid_days)
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


def _features(pipeline: FeaturePipeline, events: DataFrame, split: dict[str, Any],
              config: EtlConfig) -> tuple[DataFrame, DataFrame]:
    """A full run's features: every op over every event. The featured rows come back, and
    the rows of the state the next incremental run reads."""
    featured = pipeline.fit_transform(events, datetime.fromisoformat(split["valid_from"]))
    return featured, pipeline.featured().select(*state_columns(pipeline, config))


def state_columns(pipeline: FeaturePipeline, config: EtlConfig) -> list[str]:
    """The state's columns: each event's, its label, its kept features."""
    return [*ingest.event_columns(config), LABEL, *pipeline.kept_features()]


def _features_incremental(pipeline: FeaturePipeline, events: DataFrame, state: State,
                          stored: DataFrame, new: DataFrame, split: dict[str, Any],
                          config: EtlConfig, staging: Path,
                          previous: PreviousVocabularies | None
                          ) -> tuple[DataFrame, DataFrame, date | None]:
    """``_features`` of an incremental run: the ops are fitted over every event (or keep the
    output's fit), the kept features computed for the new events and the stored events from
    each user's start on (``starts``, ``window_rows``), the others' read from the state; the
    state's days from the earliest start on are written (the earlier days' files linked),
    then the fitted ops and the model-ready step run over every state row — over the rows
    from the earliest start's day on where the fit is kept, that day coming back third (None:
    every day's rows moved) (docs/ARCHITECTURE.md, "Incremental runs").
    The new events, the starts, their users' stored events, the cuts, the kept rows, the
    window's stored rows and its rows are written under ``staging`` while the stage runs and
    read back: plans on them start from files."""
    valid_from = datetime.fromisoformat(split["valid_from"])
    columns = [*ingest.event_columns(config), LABEL]
    counted_until = _count_from_output(pipeline, previous, state, new.select(*columns),
                                       valid_from)
    pipeline.fit(events, valid_from)
    work = staging / WORK_DIR
    new = reread(with_time_key(new.select(*columns)), work / "new", files=None)
    stored = with_time_key(stored)
    # The stored events that can hold a value the vocabularies number this run.
    numbered_anew = stored if counted_until is None else with_time_key(
        stored_events(stored.sparkSession, state, columns, since=counted_until))
    begins = reread(starts(pipeline, numbered_anew, new), work / "starts")
    # The stored days before the earliest start keep their files (all of them without one).
    first = begins.agg(F.min(START)).collect()[0][0]
    since = _midnight(first if first is not None
                      else micros_of(state.latest + timedelta(days=1)))
    join = config.label_join
    earliest = new.agg(F.min(TS_MICROS)).collect()[0][0] if join is not None else None
    if join is not None and earliest is not None:  # no new event closes or labels any
        since = min(since, label_join.rewritten_from(state.latest, earliest, join))
    # The rows computed again are read whole from the start's days.
    kept = state_columns(pipeline, config)
    recent = with_time_key(stored_events(stored.sparkSession, state, kept, since=since))
    kept_events = reread(kept_rows(recent.select(*columns, TS_MICROS), new, begins),
                         work / "kept", files=None)
    rows = _window_rows(pipeline, stored, state, begins, kept_events, work)
    computed = pipeline.transform_kept(rows).where(F.col(KEEP)).select(*kept)
    state_rows = extend_state_events(
        state, unchanged(recent, begins).select(*kept).unionByName(computed), since.date(),
        staging)
    shutil.rmtree(work)
    split_rows = with_time_key(state_rows).withColumn(SPLIT, split_column(valid_from))
    featured, written_since = _fitted(pipeline, split_rows, numbered_anew, since, state)
    return featured, state_rows, written_since


def _window_rows(pipeline: FeaturePipeline, stored: DataFrame, state: State,
                 begins: DataFrame, kept_events: DataFrame, work: Path) -> DataFrame:
    """The rows the kept features of ``kept_events`` read (``incremental.window_rows``).
    The stored events the users with a start read come from the history once (the cuts
    and the window's rows each read them several times): each user's recent days
    (``reach``, from the state's user rows) and its kept pairs' earlier events; of them only
    what the ops read of earlier events and the window's tallies count: the user, the time
    key, the item and the label."""
    broadcast = kept_events.count() <= BROADCAST_KEPT
    lookback = pipeline.lookback()
    narrow = ["user_id", TS_MICROS, *sorted(lookback.columns | {"item_id", LABEL})]
    user_rows = read_as_written(stored.sparkSession, entity_rows_folder(state.folder.parent,
                                                                         "user"))
    bounds = reread(reach(user_rows, begins, lookback), work / "reach")
    pairs = kept_events.select("user_id", "item_id").distinct()
    theirs = reread(users_events(stored.select(*narrow), bounds, pairs, broadcast=broadcast),
                    work / "theirs", files=None)
    cut = reread(cuts(theirs, bounds, lookback), work / "cuts")
    context = reread(window_context(theirs, kept_events, cut, lookback, broadcast=broadcast),
                     work / "context", files=None)
    return reread(window_rows(context, kept_events, cut, lookback), work / "rows", files=None)


def _fitted(pipeline: FeaturePipeline, split_rows: DataFrame, numbered_anew: DataFrame,
            since: datetime, state: State) -> tuple[DataFrame, date | None]:
    """The fitted ops and the model-ready step over the state's rows, and the first day
    whose files the run writes (None: every day). A new fit moves every row's fitted
    features. A kept fit: the rows before ``since`` keep their kept features, and every
    fitted one but the ids of values the vocabularies number this run (``_renumbered``): the
    days before both keep their files. The aggregations read the earlier events: their
    values from ``since`` on are computed, their snapshots after the earlier of it and the
    output's last, from the day partials the output keeps of the days before."""
    if pipeline.frozen is None:
        return pipeline.transform_fitted(split_rows), None
    renumbered = _renumbered(pipeline, numbered_anew)
    if renumbered is not None:
        since = min(since, _midnight(renumbered))
    aggregations = pipeline.op(Aggregations)
    if not isinstance(aggregations, Aggregations):
        return pipeline.transform_fitted(split_rows.where(from_day(since))), since.date()
    aggregations.since = _snapshots_change_after(since, state.latest)
    aggregations.days_before = _days_before(split_rows.sparkSession, state.folder.parent,
                                            aggregations.groups, aggregations.since)
    moved = F.col("ts") >= F.lit(since)
    return pipeline.transform_fitted(split_rows).where(moved), since.date()


# A stored day partial's day (its start, a timestamp: the files are a day's each).
PARTIALS_DAY = "day"


def _days_before(spark: SparkSession, output: Path, groups: Sequence[GroupSpec], before: int
                 ) -> dict[str, DataFrame]:
    """Per group whose day partials ``output`` keeps, those of the days before ``before``
    (µs, a midnight)."""
    found = {}
    for group in groups:
        folder = day_partials_folder(output, group.name)
        if folder.is_dir():
            found[group.name] = day_partials_read(spark, folder).where(
                F.col(TS_MICROS) < before)
    return found


def day_partials_read(spark: SparkSession, folder: Path) -> DataFrame:
    """The day partials a state keeps in ``folder``, each day's start as ``TS_MICROS``."""
    stored = read_as_written(spark, folder)
    return stored.select(epoch_micros(F.col(PARTIALS_DAY)).alias(TS_MICROS),
                         *(c for c in stored.columns if c != PARTIALS_DAY))


def _write_day_partials(aggregations: Aggregations, staging: Path, previous: Path
                        ) -> dict[str, DataFrame]:
    """Each group's day partials into the state, a file per day: those the last transform
    computed, and where it computed them from ``aggregations.since`` on, the earlier days'
    files of ``previous`` (the output the run extends). Per group, every day's, read back."""
    written = {}
    for group in aggregations.groups:
        frame = aggregations.day_partials.get(group.name)
        if frame is None:
            continue
        folder = day_partials_folder(staging, group.name)
        if aggregations.since is not None:
            link_table_days(day_partials_folder(previous, group.name), folder,
                            (_midnight(aggregations.since) - timedelta(days=1)).date())
        written[group.name] = write_partial_days(frame, folder, group.keys)
    return written


def write_partial_days(frame: DataFrame, folder: Path, keys: Sequence[str]) -> DataFrame:
    """A group's day partials (each day's start as ``TS_MICROS``) written into ``folder``, a
    file per day; every day's there, read back."""
    write_parquet_days(frame.select(
        F.timestamp_micros(TS_MICROS).alias(PARTIALS_DAY),
        *(c for c in frame.columns if c != TS_MICROS)), folder, PARTIALS_DAY, *keys)
    return day_partials_read(frame.sparkSession, folder)


def _count_from_output(pipeline: FeaturePipeline, previous: PreviousVocabularies | None,
                       state: State, new: DataFrame, valid_from: datetime) -> datetime | None:
    """Where the vocabularies extended are the output's own, categorify counts the rows it
    numbers values from (a new fit's training rows, every row with a kept fit:
    ``FeaturePipeline.fit``) as those vocabularies' counts plus the rows they left out: the
    stored events from where the output's counting ended, and the new ones
    (``Categorify.count_from``): not every stored event again. An output that kept its fit
    counted every event it holds; one that fitted anew, its training split. Where that
    counting ended comes back: the stored events before it hold only values those
    vocabularies number (None: any stored event may hold a value numbered anew)."""
    categorify = pipeline.op(Categorify)
    output = state.folder.parent
    if (not isinstance(categorify, Categorify) or previous is None
            or previous.output != output.resolve()):
        return None
    metadata = read_metadata(output)
    if metadata.fit is not None and metadata.fit.source is not None:
        if pipeline.frozen is None and valid_from <= state.latest:
            return None  # its counts hold rows this new fit's training split leaves out
        counted_until = _midnight(micros_of(state.latest)) + timedelta(days=1)
    else:
        counted_until = datetime.fromisoformat(
            present(metadata.split, metadata, "split").valid_from)
    rows = stored_events(new.sparkSession, state, new.columns,
                         since=counted_until).unionByName(new)
    if pipeline.frozen is None:
        rows = rows.where(F.col("ts") < F.lit(valid_from))
    if not categorify.count_from(previous.counts, rows):
        return None
    return counted_until


def _midnight(micros: int) -> datetime:
    """The UTC midnight starting the day of a time key (µs since the epoch)."""
    return datetime.fromtimestamp(micros // MICROS, timezone.utc).replace(
        hour=0, minute=0, second=0, microsecond=0)


def _renumbered(pipeline: FeaturePipeline, stored: DataFrame) -> int | None:
    """The time key of the earliest stored event holding a value this run's vocabularies
    number for the first time (it was encoded OOV: a value first seen in the validation
    split, or rarer than ``freq_threshold`` until now); None: no such event."""
    categorify = pipeline.op(Categorify)
    if not isinstance(categorify, Categorify):
        return None
    # One read of the events for every column: each column's added values marked by a
    # broadcast join (a semi-join per column read them once each).
    marked, marks = stored, []
    for n, column in enumerate(categorify.columns):
        mark = f"_added_{n}"
        added = F.broadcast(categorify.added_lists(column, stored).select(
            F.col("value").alias(mark)))
        marked = marked.join(added, F.col(column).cast("string") == added[mark], "left")
        marks.append(F.col(mark).isNotNull())
    first = marked.where(functools.reduce(Column.__or__, marks)).agg(F.min(TS_MICROS))
    value: int | None = first.collect()[0][0]
    return value


def starts(pipeline: FeaturePipeline, stored: DataFrame, new: DataFrame) -> DataFrame:
    """Per user, the earliest event whose kept features this run computes (``START``, its
    time key): the user's first new event (before stored ones where late), or an earlier
    stored event of an item this run's vocabulary numbers for the first time (its id was
    the OOV id in the history and previous item of the user's later events)."""
    first = new.select("user_id", TS_MICROS)
    categorify = pipeline.op(Categorify)
    if isinstance(categorify, Categorify) and "item_id" in categorify.columns:
        added = categorify.added("item_id").select(F.col("value").alias("item_id"))
        first = first.unionByName(stored.join(F.broadcast(added), "item_id", "left_semi")
                                  .select("user_id", TS_MICROS))
    return first.groupBy("user_id").agg(F.min(TS_MICROS).alias(START))


def write_examples(featured: DataFrame, specs: list[FeatureSpec], config: EtlConfig,
                    path: Path, labels: DataFrame | None = None) -> None:
    """The examples a folder per split and UTC day (``split=<s>/day=<d>``): a day's files
    hold its rows only, so a run that adds a day leaves the earlier days' files as they are
    (docs/ARCHITECTURE.md, "Examples by day"). ``labels``: a label join's examples (keys and
    label): only those rows are examples, with that label."""
    join = config.label_join
    if labels is not None and join is not None:
        impressions = featured.where(label_join.matches(
            join.of, frozenset(categorical_columns(config))))
        featured = impressions.drop(LABEL).join(
            labels.withColumnRenamed(label_join.TARGET, LABEL), list(KEYS))
    columns: list[Column | str] = [*KEYS, *(F.col(s.name).cast(SPARK_TYPES[s.kind])
                                            for s in specs), F.col(LABEL).cast("long"), SPLIT,
                                   F.to_date("ts").alias(EXAMPLE_DAY)]
    # Hash-partitioned and sorted by the keys: the same rows land in the same files, in the
    # same order, each run. The split and the day lead the sort: a write partitioned by them
    # sorts each task's rows by them unless they already are, and that sort replaced the
    # keys' one.
    examples = (featured.select(*columns)
                .repartition(config.output.examples_files, *KEYS)
                .sortWithinPartitions(SPLIT, EXAMPLE_DAY, *KEYS))
    write_parquet(examples, path, files=None, partition_by=[SPLIT, EXAMPLE_DAY])


def _example_counts(spark: SparkSession, staging: Path) -> dict[str, int]:
    """The examples written (and linked) per split."""
    counted = read_as_written(spark, staging / "examples").groupBy(SPLIT).count().collect()
    return {TRAIN: 0, VALID: 0} | {row[SPLIT]: int(row["count"]) for row in counted}


def label_spec() -> dict[str, Any]:
    """The label column as metadata.json and the TFRecord layout describe it."""
    return {"name": LABEL, "short_name": LABEL_SHORT_NAME, "dtype": "int64"}


def write_tfrecords(spark: SparkSession, specs: list[FeatureSpec], config: EtlConfig,
                     staging: Path, split: dict[str, Any], since: date | None = None,
                     previous: Path | None = None) -> dict[str, Any]:
    """Encode the examples just written into prebatched TFRecords, one file per Parquet
    file (and each day's carried leftovers); from the day ``since`` on where given, the
    earlier days' files linked from the ``previous`` output's."""
    options = config.tfrecord
    compression = "GZIP" if options.compression == "gzip" else ""
    groups = build_layout([s.to_json() for s in specs], label_spec(),
                          group_types=options.group_types, short_names=options.short_names)
    files = []
    if since is not None and previous is not None:
        metadata = read_metadata(previous)
        section = present(metadata.tfrecord, metadata, "tfrecord")
        files += link_tfrecord_days([f.model_dump() for f in section.files], previous,
                                    staging, since, datetime.fromisoformat(split["valid_from"]))
    for name in (TRAIN, VALID):
        sources = split_sources(staging / "examples" / f"{SPLIT}={name}")
        if since is not None:
            sources = [s for s in sources if date.fromisoformat(s.day) >= since]
        files += [{**f, "path": f"tfrecord/{f['path']}"} for f in write_split(
            spark, sources, str(staging / "tfrecord"), name, groups, options.prebatch_size,
            compression)]
    files.sort(key=lambda f: (f["split"] != TRAIN, f["day"], f["path"]))
    return {"prebatch_size": options.prebatch_size, "compression": compression,
            "groups": {g.name: g.to_json() for g in groups}, "files": files}


def _write_tiles(events: DataFrame, config: EtlConfig, inputs: ModelInputs, staging: Path,
                 cut: int, lifetimes: dict[str, Lifetime], table_rows: dict[str, DataFrame],
                 spec_rows: DataFrame | None = None,
                 spec_days: dict[str, DataFrame] | None = None) -> dict[str, Any]:
    """The tiles as of ``cut`` (µs, after the last event) of the aggregations' groups, the
    model inputs' groups and the entity tables' groups under ``tiles/<group>/<feature>``,
    where the online store's values start (docs/ARCHITECTURE.md, "Features as
    definitions"). The aggregations' come from ``spec_rows`` (the rows their op cached)
    where given, and the outputs on days' from the groups' day partials (``spec_days``: of
    every day); an entity table's from its ``lifetimes`` and the rows it was computed from
    (``table_rows``: its ``entity_rows``), those from their end on."""
    events = with_time_key(events)
    numeric = config.event_contract().numeric
    spec_days = spec_days or {}
    tiles = [tile for group in config.aggregations
             for tile in output_tiles(events if spec_rows is None else spec_rows, group,
                                      numeric, cut, days=spec_days.get(group.name))]
    tiles += [tile for group in inputs.groups
              for part, rows in _with_catalog(events, group, config, cut)
              for tile in output_tiles(rows, part, numeric, cut)]
    groups = [*config.aggregations, *inputs.groups]
    for entity, prior in lifetimes.items():
        group = entity_group(entity, config.entities.recent_days)
        rows = table_rows[entity].where(F.col(TS_MICROS) >= prior.before)
        tiles += output_tiles(rows, group, (), cut, prior)
    tables = {feature.qualified: f"{TILES_DIR}/{feature.group}/{feature.output}"
              for feature, _ in tiles}
    # Each a small table: written several at once.
    write_each([(frame, staging / tables[feature.qualified]) for feature, frame in tiles])
    return {"cut_us": cut, "tables": tables,
            "groups": [group.model_dump(mode="json") for group in groups]}


def _with_catalog(events: DataFrame, group: GroupSpec, config: EtlConfig, cut: int
                  ) -> list[tuple[GroupSpec, DataFrame]]:
    """A model inputs' group with the rows its tiles come from: the events, and for the
    latest values of the attribute files' columns (``attribute_name``) the files' rows
    too, so a user or an item without events is served its attributes."""
    role = group.keys[0] if list(group.keys) in (["user_id"], ["item_id"]) else None
    filed = {attribute_name(column) for table in config.attributes
             if table.key_role == role for column in table.columns}
    ours = [feature for feature in group.features if feature.name in filed]
    catalog = None if not ours or role is None else ingest.catalog_events(
        events.sparkSession, config, role, datetime.fromtimestamp(cut / 1e6, timezone.utc))
    if catalog is None:
        return [(group, events)]
    rest = [feature for feature in group.features if feature.name not in filed]
    filed_group = group.model_copy(update={"features": ours})
    rows = events.unionByName(with_time_key(catalog), allowMissingColumns=True)
    return [(filed_group, rows),
            *([(group.model_copy(update={"features": rest}), events)] if rest else [])]


def _write_group_snapshots(aggregations: Aggregations, staging: Path, previous: Path
                           ) -> dict[str, Any]:
    """Each group's daily snapshots (``aggregations/<group>``, a file per day) up to the day
    after the last event, computed by the examples' backfill: what Feast's offline store
    joins (docs/ARCHITECTURE.md, "Features as definitions"). Where the backfill computed
    them after ``aggregations.since`` only, the earlier days' files are ``previous``'s (the
    output the run extends)."""
    tables = {}
    for group in aggregations.groups:
        frame = aggregations.snapshots(group)
        relative = f"{AGGREGATIONS_DIR}/{group.name}"
        if aggregations.since is not None:
            link_table_days(previous / relative, staging / relative,
                            _midnight(aggregations.since).date())
        write_parquet_days(frame, staging / relative, EVENT_TIMESTAMP, *group.keys)
        tables[group.name] = {"path": relative, "keys": table_schema(frame, list(group.keys)),
                              "timestamp_field": EVENT_TIMESTAMP,
                              "features": table_schema(frame, [f.output for f in group.outputs()])}
    return tables


@dataclass(frozen=True)
class Resumed:
    """What an incremental run keeping its fit takes the entity tables up from: the output
    it extends, each table's ``Resume`` (those it has), the events from a time on, and the
    day from which the state's events changed (the earlier days' are the output's)."""

    previous: Path
    resumes: dict[str, Resume]
    events_from: Callable[[int], DataFrame]
    since: date


def _snapshots_change_after(since: datetime, latest: datetime) -> int:
    """The snapshot day (µs) after which a day's run writes the snapshots again: the earlier
    of the first day whose rows change (``since``) and the extended output's last snapshot
    day (``latest``: its latest event) — the days between have no snapshot yet."""
    return min(micros_of(since), last_snapshot(micros_of(latest) + 1))


def _resumed(spark: SparkSession, state: State, output: Path, since: date, cut: int,
             config: EtlConfig, new: DataFrame) -> Resumed:
    """The entity tables an incremental run keeping its fit takes up after the earlier of
    ``since`` (where its examples start changing) and the previous output's last snapshot
    day: those whose lifetime partials end before the events they need (a late event or a
    value numbered anew can reach back further: the table is then computed whole)."""
    columns = [*ingest.event_columns(config), LABEL]

    def events_from(before: int) -> DataFrame:
        moment = datetime.fromtimestamp(before // MICROS, timezone.utc)
        return stored_events(spark, state, columns, since=moment).unionByName(
            new.select(*columns))

    after = _snapshots_change_after(datetime.combine(since, datetime.min.time(), timezone.utc),
                                    state.latest)
    resumes = {}
    for entity in ENTITIES:
        lifetime = state.lifetime(spark, entity)
        group = entity_group(entity, config.entities.recent_days)
        if lifetime is not None and lifetime.before <= resume_from(group, after, cut):
            resumes[entity] = Resume(after, lifetime)
    return Resumed(output, resumes, events_from, since)


def _write_entities(events: DataFrame, pipeline: FeaturePipeline, config: EtlConfig,
                    staging: Path, cut: int, resumed: Resumed | None
                    ) -> tuple[dict[str, Any], dict[str, Lifetime], dict[str, DataFrame]]:
    """The entity tables, a file per day (``entities/<entity>``); those ``resumed`` takes up
    link the earlier days' files of the output extended. Their lifetime partials, written
    into the state, come back second; third, the rows each was computed from (of its
    ``_entity_rows``: every part of the table and its tiles reads them)."""
    categorify = pipeline.op(Categorify)
    entities, lifetimes, read = {}, {}, {}
    for entity, key in ENTITIES.items():
        vocabulary = (categorify.vocabularies.get(key)
                      if isinstance(categorify, Categorify) else None)
        resume = resumed.resumes.get(entity) if resumed is not None else None
        path = staging / "entities" / entity
        rows = _entity_rows(events, entity, config, staging, resumed)
        if resume is not None:
            before = resume.lifetime.before
            rows = rows.where((F.col(DAY) >= F.lit(_midnight(before).date()))
                              & (F.col(TS_MICROS) >= F.lit(before)))
        rows = read[entity] = rows.drop(DAY)
        table = entity_snapshots(rows, entity, config.entities.recent_days, vocabulary, cut,
                                 resume)
        if resume is not None and resumed is not None:
            link_table_days(resumed.previous / "entities" / entity, path,
                            _midnight(resume.after).date())
        write_parquet_days(table.frame, path, EVENT_TIMESTAMP, key)
        carried = table.lifetime
        lifetimes[entity] = Lifetime(reread(carried.frame, lifetime_folder(staging, entity),
                                            files=None), carried.before)
        entities[entity] = {
            "path": f"entities/{entity}", "join_key": key, "timestamp_field": EVENT_TIMESTAMP,
            "join_key_dtype": dict(table.frame.dtypes)[key],
            "features": table_schema(table.frame, table.feature_columns),
            "group": table.group.model_dump(mode="json"),
        }
    return entities, lifetimes, read


def _entity_rows(events: DataFrame, entity: str, config: EtlConfig, staging: Path,
                 resumed: Resumed | None) -> DataFrame:
    """The entity table's ``entity_rows`` of every event, written into the state being
    written a folder per UTC day (``DAY``) and read back from there; where ``resumed``, the
    state's days before the one its events changed from are the output's (their files
    linked) and only the events from that day on are read (docs/ARCHITECTURE.md,
    "Incremental runs")."""
    folder = entity_rows_folder(staging, entity)
    source = events
    if resumed is not None:
        link_days(entity_rows_folder(resumed.previous, entity), folder, resumed.since)
        source = resumed.events_from(micros_of(datetime.combine(
            resumed.since, datetime.min.time(), timezone.utc)))
    rows = entity_rows(source, entity, config.entities.recent_days)
    write_parquet(with_row_day(rows).repartition(DAY), folder, files=None,
                  partition_by=DAY, mode="append")
    return read_as_written(events.sparkSession, folder)


@dataclass(frozen=True)
class Checked:
    """The validation gate's outcome for a run."""

    measurements: list[Measurement]
    reference: str | None
    enabled: bool

    @property
    def breaches(self) -> list[Measurement]:
        return [m for m in self.measurements if m.breached]

    def summary(self) -> str:
        if not self.enabled:
            return "profile written; checks disabled"
        if self.reference is None:
            return "profile written; no reference to check against"
        if not self.breaches:
            return f"no breach against {self.reference}"
        return f"{len(self.breaches)} breach(es) against {self.reference}"

    def verdict(self) -> dict[str, Any]:
        return verdict([m.breach() for m in self.breaches], self.reference)


def newest_profiles(spark: SparkSession, events: DataFrame, specs: list[FeatureSpec],
                    rows: dict[str, Any], config: EtlConfig, staging: Path,
                    every_day: dict[str, int], days: int = 1) -> list[dict[str, Any]]:
    """The profiles of the ``days`` newest days of ``every_day`` (their events among
    ``events``, their examples the ones written under ``staging``), oldest first; the newest
    written as the run's profile."""
    profiled = sorted(every_day)[-days:]
    examples = read_as_written(spark, staging / "examples").where(
        F.col(EXAMPLE_DAY) >= F.lit(profiled[0]).cast("date"))
    found = profiles(events, examples, len(profiled), rows=rows, day_counts=every_day,
                     **profile_columns(config, [s.to_json() for s in specs]))
    write_json(found[-1], staging / PROFILE_FILE)
    return found


def profile_and_check(spark: SparkSession, events: DataFrame, specs: list[FeatureSpec],
                       rows: dict[str, Any], config: EtlConfig, staging: Path,
                       output: Path, counts: dict[str, int] | None = None) -> Checked:
    """The run's profile, written beside metadata.json, checked against its reference window
    (``core/drift_window.py``: the days before it that the output it replaces kept, or
    ``checks.reference``'s), pooled; the window is kept beside it, and its pooled profile too,
    so that ``featureline validate`` can check again later; the report and the checks'
    metrics beside them. ``counts``: every day's count of events, where ``events`` holds the
    newest days only (``data_profile.profiles``' ``day_counts``)."""
    this_run = rows.get("this_run", rows)
    checks = config.checks
    pinned = local_path(checks.reference) if checks.reference else None
    carried, name = (pinned_days(pinned), str(pinned)) if pinned else replaced_days(output)
    totals = day_totals(events) if counts is None else {}
    every_day = counts if counts is not None else {d: n for d, (n, _) in totals.items()}
    # A run with nothing to carry seeds the next run's window: the day before its own
    # profiled with it, the days before that by their totals (core/drift_window.py). Its own
    # day is not checked: nothing is served yet, and its newest day may be a partial one.
    seeding = not carried and checks.enabled and len(totals) > 1
    *earlier, run_profile = newest_profiles(spark, events, specs, this_run, config, staging,
                                            every_day, 2 if seeding else 1)
    if seeding:
        carried = [*seeded_totals(totals, earlier[0]["day"], this_run), *earlier]
    # The replaced output's days up to this run's; a pinned baseline's as they are.
    days = window(carried, checks.reference_days, None if pinned else run_profile["day"])
    write_window(days, staging)
    reference = pooled(days) if days and not seeding else None
    if reference is not None:
        write_json(reference, staging / REFERENCE_PROFILE_FILE)
    against = name if reference is not None else None
    measurements = measure(run_profile, reference, checks) if checks.enabled else []
    (staging / REPORT_FILE).write_text(render(
        run_profile, reference, measurements, checks, output=str(output),
        reference_name=against))
    (staging / METRICS_FILE).write_text(prometheus(
        measurements, run_profile, compared=reference is not None and checks.enabled,
        run_at=time.time()))
    return Checked(measurements, against, checks.enabled)


def _write_artifacts(pipeline: FeaturePipeline, path: Path) -> dict[str, Any]:
    stats: dict[str, Any] = {}
    for op in pipeline.ops:
        artifacts = op.artifacts()
        for name, table in artifacts.tables.items():
            write_parquet(table, path / name)
        if artifacts.stats:
            stats[op.name] = artifacts.stats
    # What serving applies to a raw value to match the examples (core/transforms.py).
    stats["model_ready"] = pipeline.model_ready.artifacts()
    write_json(stats, path / "stats.json")
    return stats


@dataclass
class _Run:
    """What every stage of one run shares: its settings, session, output, stage timer, the
    feature pipeline, the fit it may keep, the vocabularies it extends, the frames it cached
    (unpersisted at the end) and where it stages its output."""

    config: EtlConfig
    spark: SparkSession
    output: Path
    timer: StageTimer
    pipeline: FeaturePipeline
    scheduled: Fit | None
    previous: PreviousVocabularies | None
    staging: Path = Path()
    cached: list[DataFrame] = field(default_factory=list)


class _EveryDay:
    """The days a full run writes: all of them, its state's events among the writes, each
    day's events counted from the run's own, every entity snapshot computed."""

    since: date | None = None
    state_written = False

    def day_counts(self) -> dict[str, int] | None:
        return None

    def resumed(self, job: _Run, cut: int) -> Resumed | None:
        return None


@dataclass(frozen=True)
class _NewDays(_EveryDay):
    """The days an incremental run writes: from ``since`` on (None: all of them, after a new
    fit), the earlier ones linked; its state's events written by the features stage; every
    day's events counted from the state's files; the entity snapshots resumed from the
    state's lifetime partials."""

    state: State
    new: DataFrame
    since: date | None
    state_written = True

    def day_counts(self) -> dict[str, int] | None:
        return day_counts(self.state, self.new)

    def resumed(self, job: _Run, cut: int) -> Resumed | None:
        if self.since is None:
            return None
        return _resumed(job.spark, self.state, job.output, self.since, cut, job.config,
                        self.new)


@dataclass
class _Transformed:
    """What the first stages (ingest, split, features) hand the writes. ``events``: every
    accepted event; ``newest``: the events the profile and the entity tables' cut read (all
    of them in a full run; the state's last day and the new events in an incremental one);
    ``state_rows``: the state's events; ``days``: which days the run writes."""

    events: DataFrame
    newest: DataFrame
    rows: dict[str, Any]
    split: dict[str, Any]
    featured: DataFrame
    state_rows: DataFrame
    days: _EveryDay = field(default_factory=_EveryDay)
    joined: _Joined | None = None


@dataclass(frozen=True)
class _Joined:
    """A label join's examples (keys and label), its counts of the events it labelled
    (``label_join.counts``), and the output's accounting where the run extends one."""

    examples: DataFrame
    counts: dict[str, int]
    previous: dict[str, Any] | None = None


def _joined_from(state: State, since: date | None, config: EtlConfig) -> datetime | None:
    """The first day of the stored events an incremental run's label join reads: the first
    it writes, or the first an impression held open may be on (None: every day)."""
    join = config.label_join
    if since is None or join is None:
        return None
    held = label_join.rewritten_from(state.latest, micros_of(state.latest), join)
    return min(held, datetime.combine(since, datetime.min.time(), timezone.utc))


def _joined(job: _Run, events: DataFrame, previous: dict[str, Any] | None = None
            ) -> _Joined | None:
    """The label join over ``events`` (every event of each pair from a time on), its flags
    cached; None without a join."""
    join = job.config.label_join
    if join is None:
        return None
    latest = with_time_key(events).agg(F.max(TS_MICROS)).collect()[0][0]
    flags = label_join.flagged(events, join, frozenset(categorical_columns(job.config)),
                               latest).persist(StorageLevel.MEMORY_AND_DISK)
    job.cached.append(flags)
    return _Joined(label_join.examples(flags), label_join.counts(flags), previous)


def run(config: EtlConfig, spark: SparkSession,
        progress: Callable[[str], None] = logger.info) -> JobResult:
    """Run the whole job; the output folder is replaced only if every stage succeeds."""
    output = local_path(config.output.path)
    started = time.perf_counter()
    scheduled = scheduled_fit(spark, config, output)
    pipeline = FeaturePipeline(config, load_fit(spark, config))
    state = None
    if config.mode == "incremental":
        state = read_state(output)
        check_compatible(state, config, output)
    job = _Run(config, spark, output, StageTimer(progress, spark), pipeline, scheduled,
               _extend_vocabularies(spark, config, pipeline, output))
    try:
        with staged_directory(output) as job.staging:
            transformed = _full(job) if state is None else _incremental(job, state)
            metadata = _written(job, transformed, started)
    finally:
        pipeline.release()
        for frame in job.cached:
            frame.unpersist()
    progress(f"wrote {output}")
    return JobResult(output, metadata)


def _full(job: _Run) -> _Transformed:
    """A full run's first stages: every raw file read, split and featured."""
    config = job.config
    with job.timer(stages.INGEST) as stage:
        events, rows = _ingest(job.spark, config, job.staging, job.cached)
        stage.summary = _ingest_summary(rows)
    with job.timer(stages.SPLIT) as stage:
        events, split = _split(events, config)
        stage.summary = _split_summary(job, split)
    with job.timer(stages.FEATURES) as stage:
        featured, state_rows = _features(job.pipeline, events, split, config)
        stage.summary = f"{len(job.pipeline.features())} features"
        joined = _joined(job, events)
    return _Transformed(events, events, rows, split, featured, state_rows, joined=joined)


def _incremental(job: _Run, state: State) -> _Transformed:
    """An incremental run's first stages: the new files read and checked against the state,
    split with the state's days, and featured from where each user's events change (the
    days before that linked by the writes where the fit is kept)."""
    config, pipeline = job.config, job.pipeline
    with job.timer(stages.INGEST) as stage:
        new, rows = _ingest_incremental(job.spark, config, job.staging, job.cached, state,
                                        job.output)
        columns = [*ingest.event_columns(config), LABEL]
        stored = stored_events(job.spark, state, [*columns, *pipeline.kept_features()])
        events = stored.select(*columns).unionByName(new.select(*columns))
        # The state's last day and the new events: the latest event is among them.
        newest = stored_events(job.spark, state, columns,
                               since=_midnight(micros_of(state.latest))
                               ).unionByName(new.select(*columns))
        stage.summary = _ingest_summary(rows)
    with job.timer(stages.SPLIT) as stage:
        events, split = _split_incremental(events, state, newest, new, rows, config)
        stage.summary = _split_summary(job, split)
        if pipeline.frozen is None:
            # A new fit: every op's fit reads every event, cached as a full run's.
            events = events.persist(StorageLevel.MEMORY_AND_DISK)
            job.cached.append(events)
    with job.timer(stages.FEATURES) as stage:
        featured, state_rows, since = _features_incremental(
            pipeline, events, state, stored, new, split, config, job.staging, job.previous)
        stage.summary = f"{len(pipeline.features())} features"
        # The join's events: the stored ones from the first day written, and the new ones
        # (only theirs counted: the output counted the others).
        recent = stored_events(job.spark, state, columns, since=_joined_from(state, since,
                                                                           config))
        joined = _joined(job, recent.withColumn(label_join.COUNTED, F.lit(False)).unionByName(
            new.select(*columns).withColumn(label_join.COUNTED, F.lit(True))),
            state.rows.get("label_join"))
    return _Transformed(events, newest, rows, split, featured, state_rows,
                        _NewDays(state, new, since), joined)


def _ingest_summary(rows: dict[str, Any]) -> str:
    return (f"{rows['read']:,} rows read, {rows['accepted']:,} events accepted, "
            f"{sum(rows['quarantined'].values()):,} quarantined, "
            f"{rows['duplicates']:,} duplicates removed")


def _split_summary(job: _Run, split: dict[str, Any]) -> str:
    """The split's rows, and whether the run keeps the fit it may keep (decided here)."""
    summary = ", ".join(f"{name} {count:,}" for name, count in split["rows"].items())
    if job.scheduled is not None:
        summary += _keep_or_refit(job.pipeline, job.scheduled, job.config, split["valid_from"])
    return summary


def _cut(aggregations: object, events: DataFrame) -> int:
    """The cut of the run's events (µs, after the latest): the aggregations' where the run
    computed them."""
    if isinstance(aggregations, Aggregations):
        return aggregations.cut
    return events_cut(with_time_key(events))


def _examples_written(job: _Run, t: _Transformed, specs: list[FeatureSpec]) -> str:
    """The examples, the days before ``t.days.since`` linked from the output the run
    extends; with a label join, its accounting in ``t.rows``. The stage's line."""
    since = t.days.since
    write_examples(t.featured, specs, job.config, job.staging / "examples",
                    t.joined.examples if t.joined is not None else None)
    summary = f"{t.rows['accepted']:,} examples"
    if since is not None:
        kept = link_example_days(job.output, job.staging, since,
                                 datetime.fromisoformat(t.split["valid_from"]))
        summary += (f" ({len(kept)} earlier days' files kept, the days from "
                    f"{since:%Y-%m-%d} written)")
    if t.joined is None:
        return summary
    t.split["rows"] = _example_counts(job.spark, job.staging)
    t.rows["label_join"] = joined = label_join.accounting(
        t.rows["accepted"], sum(t.split["rows"].values()), t.joined.counts, t.joined.previous)
    return (f"{joined['examples']:,} examples of {t.rows['accepted']:,} events "
            f"({joined['positives']:,} positives, {joined['held_open']:,} impressions held "
            "open)")


def _written(job: _Run, transformed: _Transformed, started: float) -> dict[str, Any]:
    """The writes every run shares — examples, TFRecords, entity tables, snapshots and
    tiles, artifacts, the profile and its check, the state — and the metadata; the days
    before ``transformed.since`` linked from the output the run extends."""
    config, pipeline, staging, t = job.config, job.pipeline, job.staging, transformed
    specs, since = pipeline.features(), t.days.since
    with job.timer(stages.WRITE_EXAMPLES) as stage:
        stage.summary = _examples_written(job, t, specs)
    tfrecord = None
    if config.tfrecord.enabled:
        with job.timer(stages.WRITE_TFRECORD) as stage:
            tfrecord = write_tfrecords(job.spark, specs, config, staging, t.split, since,
                                        job.output)
            stage.summary = (f"{sum(f['rows'] for f in tfrecord['files']):,} rows in "
                             f"{len(tfrecord['files'])} files")
    with job.timer(stages.ENTITIES) as stage:
        aggregations = pipeline.op(Aggregations)
        cut = _cut(aggregations, t.newest)
        entities, lifetimes, rows_read = _write_entities(t.events, pipeline, config, staging,
                                                         cut, t.days.resumed(job, cut))
        snapshots, spec_rows, spec_days = {}, None, None
        if isinstance(aggregations, Aggregations):
            snapshots = _write_group_snapshots(aggregations, staging, job.output)
            spec_rows = aggregations.rows
            spec_days = _write_day_partials(aggregations, staging, job.output)
        inputs = pipeline.inputs()
        tiles = _write_tiles(t.events, config, inputs, staging, cut, lifetimes, rows_read,
                             spec_rows, spec_days)
        stage.summary = ", ".join([*entities, *snapshots]) + (
            f"; tiles of {len(tiles['tables'])} outputs")
    with job.timer(stages.ARTIFACTS):
        stats = _write_artifacts(pipeline, staging / "artifacts")
    with job.timer(stages.PROFILE) as stage:
        checked = profile_and_check(job.spark, t.newest, specs, t.rows, config, staging,
                                     job.output, t.days.day_counts())
        stage.summary = checked.summary()
    with job.timer(stages.STATE) as stage:
        state_rows = (t.state_rows if t.days.state_written
                      else write_state_events(t.state_rows, staging))
        write_state(state_rows, t.rows, config, staging,
                    {entity: lifetime.before for entity, lifetime in lifetimes.items()})
        stage.summary = f"{t.rows['accepted']:,} events"
    metadata = _metadata(config, t.rows, t.split, specs, entities, stats, tfrecord,
                         job.timer.seconds, time.perf_counter() - started)
    metadata.update(_versions(config, pipeline, job.previous))
    frozen, valid_from = pipeline.frozen, t.split["valid_from"]
    metadata["fit"] = (frozen.record(values_hash(config), valid_from) if frozen else
                       new_fit(metadata["dataset"]["version"], metadata["created_at"],
                               values_hash(config), valid_from))
    metadata["tiles"] = tiles
    metadata["inputs"] = inputs.model_dump(mode="json")
    metadata["outputs"][TILES_DIR] = TILES_DIR
    if snapshots:
        metadata["aggregations"] = snapshots
        metadata["outputs"][AGGREGATIONS_DIR] = AGGREGATIONS_DIR
    metadata["checks"] = checked.verdict()
    Metadata.parse(metadata)  # the contract holds before anything is published
    write_json(metadata, staging / METADATA_FILE)
    return metadata


def _keep_or_refit(pipeline: FeaturePipeline, scheduled: Fit, config: EtlConfig,
                   valid_from: str) -> str:
    """Transform with the replaced output's fit while ``etl.fit.refit_every`` keeps it; what
    the split stage's line adds about it."""
    age = scheduled.age_days(valid_from)
    if keeps(age, config):
        pipeline.frozen = scheduled
        return f"; the fit of {scheduled.fitted_at} kept ({age} days old)"
    return f"; refitted (the fit kept since {scheduled.fitted_at} is {age} days old)"


def _extend_vocabularies(spark: SparkSession, config: EtlConfig, pipeline: FeaturePipeline,
                         output: Path) -> PreviousVocabularies | None:
    """Point categorify at the vocabularies this run extends (none for a new lineage)."""
    categorify = pipeline.op(Categorify)
    source = (Path(config.fit.from_output) if config.fit.from_output is not None
              else previous_output(config.vocabulary, output))
    if not isinstance(categorify, Categorify) or source is None:
        return None
    previous = load_previous(spark, source, categorify.columns)
    categorify.extend(previous.tables)
    return previous


def _versions(config: EtlConfig, pipeline: FeaturePipeline,
              previous: PreviousVocabularies | None) -> dict[str, Any]:
    """metadata.json's ``vocabularies`` (version, parent, lineage per column) and ``dataset``
    (this run's version stamp: run id, config hash, vocabulary versions)."""
    categorify = pipeline.op(Categorify)
    vocabularies = {}
    if isinstance(categorify, Categorify):
        lineages = previous.lineages if previous is not None else {}
        for column, version in categorify.versions.items():
            vocabularies[column] = lineage_entry(version, lineages.get(column),
                                                 f"{VOCABULARY_DIR}/{column}")
    return {
        "vocabularies": vocabularies,
        "dataset": {"version": run_id(), "config_hash": config.hash(),
                    "vocabularies": {c: v["version"] for c, v in vocabularies.items()},
                    "extends": str(previous.output) if previous is not None else None},
    }


def run_id() -> str:
    """A run's own dataset version: when it started (UTC) and a random suffix."""
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"


def _join_entry(config: EtlConfig) -> dict[str, Any]:
    """metadata.json's label ``join`` where the examples are impressions."""
    join = config.label_join
    if join is None:
        return {}
    return {"join": {"of": str(join.of), "positive": str(join.positive),
                     "within": join.within}}


def _metadata(config: EtlConfig, rows: dict[str, Any], split: dict[str, Any],
              specs: list[FeatureSpec], entities: dict[str, Any], stats: dict[str, Any],
              tfrecord: dict[str, Any] | None, timings: dict[str, float], total: float
              ) -> dict[str, Any]:
    outputs = ["examples", "quarantine", "duplicates", "artifacts", "entities", STATE_DIR]
    outputs += ["tfrecord"] if tfrecord is not None else []
    return {
        "format_version": FORMAT_VERSION,
        "featureline_version": __version__,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config_hash": config.hash(),
        "source": {"path": config.source.path, "format": config.source.format},
        "mode": config.mode,
        "rows": rows,
        "split": split,
        "keys": list(KEYS),
        "label": {**label_spec(), "rule": str(config.label), **_join_entry(config)},
        "events": config.event_contract().model_dump(mode="json"),
        "features": [s.to_json() for s in specs],
        "embedding_plan": embedding_plan(specs, config.embeddings),
        "entities": entities,
        "outputs": {name: name for name in outputs},
        "artifacts": stats,
        "timings_s": {**timings, "total": round(total, 3)},
        **({"tfrecord": tfrecord} if tfrecord is not None else {}),
    }
