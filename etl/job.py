"""The ETL job: ingest → validate → label and split → features → write, timed per stage. The
full and the incremental run are composed here from the stages' functions: ``job_inputs``
(ingest, split), ``job_features`` and ``job_writes``."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from featureline.core import __version__
from featureline.core.events import micros_of
from featureline.core.files import staged_directory
from featureline.core.metadata import (
    AGGREGATIONS_DIR,
    FORMAT_VERSION,
    METADATA_FILE,
    TILES_DIR,
    VOCABULARY_DIR,
    Metadata,
)
from featureline.etl import ingest, label_join, stages
from featureline.etl.aggregations import (
    events_cut,
)
from featureline.etl.config import EtlConfig, categorical_columns
from featureline.etl.embedding_plan import embedding_plan
from featureline.etl.features.aggregate import Aggregations
from featureline.etl.features.base import (
    LABEL,
    TS_MICROS,
    FeatureSpec,
    with_time_key,
)
from featureline.etl.features.categorify import Categorify
from featureline.etl.features.pipeline import FeaturePipeline
from featureline.etl.fit import Fit, keeps, load_fit, new_fit, scheduled_fit
from featureline.etl.incremental import (
    STATE_DIR,
    State,
    check_compatible,
    day_counts,
    link_example_days,
    read_state,
    stored_events,
    values_hash,
    write_state,
    write_state_events,
)
from featureline.etl.job_features import (
    features_full,
    features_incremental,
    midnight,
    write_day_partials,
)
from featureline.etl.job_inputs import (
    ingest_full,
    ingest_incremental,
    split_full,
    split_incremental,
)
from featureline.etl.job_writes import (
    KEYS,
    Resumed,
    example_counts,
    label_spec,
    profile_and_check,
    resumed,
    write_artifacts,
    write_entities,
    write_examples,
    write_group_snapshots,
    write_tfrecords,
    write_tiles,
)
from featureline.etl.outputs import (
    local_path,
    write_json,
)
from featureline.etl.vocabulary import (
    PreviousVocabularies,
    lineage_entry,
    load_previous,
    previous_output,
)

logger = logging.getLogger("featureline.etl")

# Seconds between progress lines while a stage runs.
PROGRESS_EVERY_S = 5.0


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
        return resumed(job.spark, self.state, job.output, self.since, cut, job.config,
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
        events, rows = ingest_full(job.spark, config, job.staging, job.cached)
        stage.summary = _ingest_summary(rows)
    with job.timer(stages.SPLIT) as stage:
        events, split = split_full(events, config)
        stage.summary = _split_summary(job, split)
    with job.timer(stages.FEATURES) as stage:
        featured, state_rows = features_full(job.pipeline, events, split, config)
        stage.summary = f"{len(job.pipeline.features())} features"
        joined = _joined(job, events)
    return _Transformed(events, events, rows, split, featured, state_rows, joined=joined)


def _incremental(job: _Run, state: State) -> _Transformed:
    """An incremental run's first stages: the new files read and checked against the state,
    split with the state's days, and featured from where each user's events change (the
    days before that linked by the writes where the fit is kept)."""
    config, pipeline = job.config, job.pipeline
    with job.timer(stages.INGEST) as stage:
        new, rows = ingest_incremental(job.spark, config, job.staging, job.cached, state,
                                        job.output)
        columns = [*ingest.event_columns(config), LABEL]
        stored = stored_events(job.spark, state, [*columns, *pipeline.kept_features()])
        events = stored.select(*columns).unionByName(new.select(*columns))
        # The state's last day and the new events: the latest event is among them.
        newest = stored_events(job.spark, state, columns,
                               since=midnight(micros_of(state.latest))
                               ).unionByName(new.select(*columns))
        stage.summary = _ingest_summary(rows)
    with job.timer(stages.SPLIT) as stage:
        events, split = split_incremental(events, state, newest, new, rows, config)
        stage.summary = _split_summary(job, split)
        if pipeline.frozen is None:
            # A new fit: every op's fit reads every event, cached as a full run's.
            events = events.persist(StorageLevel.MEMORY_AND_DISK)
            job.cached.append(events)
    with job.timer(stages.FEATURES) as stage:
        featured, state_rows, since = features_incremental(
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
    t.split["rows"] = example_counts(job.spark, job.staging)
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
        entities, lifetimes, rows_read = write_entities(t.events, pipeline, config, staging,
                                                         cut, t.days.resumed(job, cut))
        snapshots, spec_rows, spec_days = {}, None, None
        if isinstance(aggregations, Aggregations):
            snapshots = write_group_snapshots(aggregations, staging, job.output)
            spec_rows = aggregations.rows
            spec_days = write_day_partials(aggregations, staging, job.output)
        inputs = pipeline.inputs()
        tiles = write_tiles(t.events, config, inputs, staging, cut, lifetimes, rows_read,
                             spec_rows, spec_days)
        stage.summary = ", ".join([*entities, *snapshots]) + (
            f"; tiles of {len(tiles['tables'])} outputs")
    with job.timer(stages.ARTIFACTS):
        stats = write_artifacts(pipeline, staging / "artifacts")
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
