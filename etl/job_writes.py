"""The job's writes: examples, TFRecords, tiles, snapshots, entity tables, artifacts, and the
profile with the validation gate's checks (docs/ARCHITECTURE.md, "The flow")."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

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
from featureline.core.events import micros_of
from featureline.core.metadata import (
    AGGREGATIONS_DIR,
    EVENT_TIMESTAMP,
    EXAMPLE_DAY,
    TILES_DIR,
    present,
    read_metadata,
)
from featureline.core.model_inputs import ModelInputs, attribute_name
from featureline.etl import ingest, label_join
from featureline.etl.aggregations import (
    Lifetime,
    output_tiles,
)
from featureline.etl.config import EtlConfig, categorical_columns
from featureline.etl.data_profile import day_totals, profile_columns, profiles, seeded_totals
from featureline.etl.entities import Resume, entity_rows, entity_snapshots, resume_from
from featureline.etl.features.aggregate import Aggregations
from featureline.etl.features.base import (
    LABEL,
    MICROS,
    SPLIT,
    TRAIN,
    TS_MICROS,
    VALID,
    FeatureSpec,
    with_time_key,
)
from featureline.etl.features.categorify import Categorify
from featureline.etl.features.pipeline import LABEL_SHORT_NAME, FeaturePipeline
from featureline.etl.incremental import (
    DAY,
    State,
    entity_rows_folder,
    lifetime_folder,
    link_days,
    link_table_days,
    link_tfrecord_days,
    stored_events,
    with_row_day,
)
from featureline.etl.job_features import midnight, snapshots_change_after
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

logger = logging.getLogger("featureline.etl")

logger = logging.getLogger("featureline.etl")

KEYS = ("user_id", "item_id", "ts")
SPARK_TYPES = {"categorical": "long", "continuous": "float", "multi_hot": "array<long>"}




def table_schema(frame: DataFrame, columns: list[str]) -> list[dict[str, str]]:
    types = dict(frame.dtypes)
    return [{"name": c, "dtype": types[c]} for c in columns]


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


def example_counts(spark: SparkSession, staging: Path) -> dict[str, int]:
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


def write_tiles(events: DataFrame, config: EtlConfig, inputs: ModelInputs, staging: Path,
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


def write_group_snapshots(aggregations: Aggregations, staging: Path, previous: Path
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
                            midnight(aggregations.since).date())
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




def resumed(spark: SparkSession, state: State, output: Path, since: date, cut: int,
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

    after = snapshots_change_after(datetime.combine(since, datetime.min.time(), timezone.utc),
                                    state.latest)
    resumes = {}
    for entity in ENTITIES:
        lifetime = state.lifetime(spark, entity)
        group = entity_group(entity, config.entities.recent_days)
        if lifetime is not None and lifetime.before <= resume_from(group, after, cut):
            resumes[entity] = Resume(after, lifetime)
    return Resumed(output, resumes, events_from, since)


def write_entities(events: DataFrame, pipeline: FeaturePipeline, config: EtlConfig,
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
            rows = rows.where((F.col(DAY) >= F.lit(midnight(before).date()))
                              & (F.col(TS_MICROS) >= F.lit(before)))
        rows = read[entity] = rows.drop(DAY)
        table = entity_snapshots(rows, entity, config.entities.recent_days, vocabulary, cut,
                                 resume)
        if resume is not None and resumed is not None:
            link_table_days(resumed.previous / "entities" / entity, path,
                            midnight(resume.after).date())
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


def write_artifacts(pipeline: FeaturePipeline, path: Path) -> dict[str, Any]:
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
