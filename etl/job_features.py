"""The job's features stage: the pipeline's fit and transform over the events, and what an
incremental run reads of the stored output to compute only its new days
(docs/ARCHITECTURE.md, "The flow")."""

from __future__ import annotations

import functools
import logging
import shutil
from collections.abc import Sequence
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from featureline.core.aggregations import GroupSpec
from featureline.core.events import micros_of
from featureline.core.metadata import (
    present,
    read_metadata,
)
from featureline.etl import ingest, label_join
from featureline.etl.aggregations import last_snapshot
from featureline.etl.config import EtlConfig
from featureline.etl.features.aggregate import Aggregations
from featureline.etl.features.base import (
    LABEL,
    MICROS,
    SPLIT,
    TS_MICROS,
    epoch_micros,
    with_time_key,
)
from featureline.etl.features.categorify import Categorify
from featureline.etl.features.pipeline import FeaturePipeline
from featureline.etl.incremental import (
    KEEP,
    START,
    WORK_DIR,
    State,
    cuts,
    day_partials_folder,
    entity_rows_folder,
    extend_state_events,
    from_day,
    kept_rows,
    link_table_days,
    reach,
    stored_events,
    unchanged,
    users_events,
    window_context,
    window_rows,
)
from featureline.etl.job_inputs import split_column
from featureline.etl.outputs import (
    read_as_written,
    reread,
    write_parquet_days,
)
from featureline.etl.vocabulary import (
    PreviousVocabularies,
)

logger = logging.getLogger("featureline.etl")

logger = logging.getLogger("featureline.etl")

# Up to this many events an incremental run computes kept features for, their (user, item)
# pairs are broadcast to find the pairs' latest stored events.
BROADCAST_KEPT = 1_000_000




def features_full(pipeline: FeaturePipeline, events: DataFrame, split: dict[str, Any],
              config: EtlConfig) -> tuple[DataFrame, DataFrame]:
    """A full run's features: every op over every event. The featured rows come back, and
    the rows of the state the next incremental run reads."""
    featured = pipeline.fit_transform(events, datetime.fromisoformat(split["valid_from"]))
    return featured, pipeline.featured().select(*state_columns(pipeline, config))


def state_columns(pipeline: FeaturePipeline, config: EtlConfig) -> list[str]:
    """The state's columns: each event's, its label, its kept features."""
    return [*ingest.event_columns(config), LABEL, *pipeline.kept_features()]


def features_incremental(pipeline: FeaturePipeline, events: DataFrame, state: State,
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
    since = midnight(first if first is not None
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
        since = min(since, midnight(renumbered))
    aggregations = pipeline.op(Aggregations)
    if not isinstance(aggregations, Aggregations):
        return pipeline.transform_fitted(split_rows.where(from_day(since))), since.date()
    aggregations.since = snapshots_change_after(since, state.latest)
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


def write_day_partials(aggregations: Aggregations, staging: Path, previous: Path
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
                            (midnight(aggregations.since) - timedelta(days=1)).date())
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
        counted_until = midnight(micros_of(state.latest)) + timedelta(days=1)
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


def midnight(micros: int) -> datetime:
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

def snapshots_change_after(since: datetime, latest: datetime) -> int:
    """The snapshot day (µs) after which a day's run writes the snapshots again: the earlier
    of the first day whose rows change (``since``) and the extended output's last snapshot
    day (``latest``: its latest event) — the days between have no snapshot yet."""
    return min(micros_of(since), last_snapshot(micros_of(latest) + 1))
