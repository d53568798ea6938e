"""A spec change's backfill (``featureline etl backfill``; an incremental run starts with it
where the spec changed): the aggregation outputs and derived features that are new or whose
definition changed are computed over the output's stored events with its fit, the removed
ones dropped, and every other file of the output kept (docs/ARCHITECTURE.md, "A spec
change").

What changed is read from the fingerprints the state keeps per output
(``etl.config.output_fingerprints``). The examples are read once, the changed columns joined
on by the example's keys, and written again with the TFRecords (their layout is the
features'); a changed group's snapshots and day partials are written again, a changed
output's tiles written, and the other files linked.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField

from featureline.core import __version__
from featureline.core.aggregations import AggregateFeature, GroupSpec
from featureline.core.derive import references
from featureline.core.drift import (
    PROFILE_FILE,
)
from featureline.core.files import staged_directory
from featureline.core.metadata import (
    AGGREGATIONS_DIR,
    EVENT_TIMESTAMP,
    EXAMPLE_DAY,
    METADATA_FILE,
    TILES_DIR,
    Metadata,
)
from featureline.etl import ingest
from featureline.etl.aggregations import decay_days, on_days, output_tiles
from featureline.etl.config import (
    EtlConfig,
    changed_outputs,
    derive_inputs,
    encoded_columns,
    other_settings_hash,
    output_fingerprints,
)
from featureline.etl.embedding_plan import embedding_plan
from featureline.etl.errors import IncompatibleStateError
from featureline.etl.features.aggregate import Aggregations
from featureline.etl.features.base import LABEL, SPLIT, TS_MICROS, FeatureSpec, with_time_key
from featureline.etl.features.categorify import Categorify
from featureline.etl.features.derived import Derived
from featureline.etl.features.pipeline import FeaturePipeline
from featureline.etl.fit import ARTIFACTS_DIR, Fit
from featureline.etl.incremental import (
    DAY_PARTIALS_DIR,
    STATE_DIR,
    STATE_FILE,
    STATE_VERSION,
    WORK_DIR,
    State,
    check_lineage,
    day_counts,
    day_partials_folder,
    link_or_copy,
    read_state,
    stored_events,
    values_hash,
)
from featureline.etl.job import JobResult, StageTimer, run, run_id
from featureline.etl.job_features import day_partials_read, state_columns, write_partial_days
from featureline.etl.job_inputs import split_column
from featureline.etl.job_writes import (
    KEYS,
    SPARK_TYPES,
    newest_profiles,
    table_schema,
    write_examples,
    write_tfrecords,
)
from featureline.etl.outputs import (
    local_path,
    read_as_written,
    required,
    reread,
    write_each,
    write_json,
    write_parquet_days,
)
from featureline.etl.vocabulary import load_previous

# The backfill's stages, in the order it runs them (metadata.json's timings).
COMPUTE, EXAMPLES, TFRECORDS, AGGREGATION_FILES, PROFILE, STATE = (
    "backfill", "write_examples", "write_tfrecord", "aggregations", "profile", "state")
# The lowest and highest values of one example's keys (the same where they agree).
_LOW, _HIGH = "_backfill_low", "_backfill_high"


@dataclass(frozen=True)
class SpecChange:
    """The outputs (``group:output``, a derived feature's name) a spec change adds or
    changes, in the spec's order, and those it removes."""

    changed: tuple[str, ...]
    removed: tuple[str, ...]
    reason: str

    def aggregations(self) -> set[str]:
        return {name for name in self.changed if ":" in name}


def spec_change(state: State, config: EtlConfig) -> SpecChange | None:
    """What differs between the output's spec and ``config``'s where nothing else does
    (None: the same settings, other settings, or a state written before fingerprints)."""
    if (state.version != STATE_VERSION or state.outputs is None
            or state.others != other_settings_hash(config)
            or state.values_hash == values_hash(config)):
        return None
    now = output_fingerprints(config)
    changed = tuple(name for name, digest in now.items() if state.outputs.get(name) != digest)
    removed = tuple(name for name in state.outputs if name not in now)
    reason = changed_outputs(state.outputs, now) or "the outputs are in another order"
    return SpecChange(changed, removed, reason)


def run_incremental(config: EtlConfig, spark: SparkSession,
                    progress: Callable[[str], None]) -> JobResult:
    """An incremental run (``job.run``) after the backfill of a changed spec, where only the
    spec changed: each replaces the output whole, so a failed day leaves the output at the
    new spec."""
    backfill_if_changed(config, spark, progress)
    return run(config, spark, progress)


def backfill_if_changed(config: EtlConfig, spark: SparkSession,
                        progress: Callable[[str], None]) -> JobResult | None:
    """The backfill of the output ``config`` names where its spec is all that changed
    (None: nothing to backfill)."""
    output = local_path(config.output.path)
    if not (output / STATE_DIR / STATE_FILE).is_file():
        return None
    state = read_state(output)
    change = spec_change(state, config)
    if change is None:
        return None
    return backfill(config, spark, state, change, progress)


def backfill(config: EtlConfig, spark: SparkSession, state: State, change: SpecChange,
             progress: Callable[[str], None]) -> JobResult:
    """Bring the output of ``state`` to ``config``'s spec: the outputs ``change`` names
    computed over its stored events with its fit (their model-ready statistics fitted on
    that fit's training split), the removed ones dropped; the output is replaced only if
    every step succeeds."""
    output = state.folder.parent
    check_lineage(config, output)
    started = time.perf_counter()
    before = json.loads((output / METADATA_FILE).read_text())
    fit = _own_fit(spark, output, before)
    pipeline = FeaturePipeline(config, fit)
    timer = StageTimer(progress, spark)
    progress(f"spec change: {change.reason}")
    steps = _Backfill(config, spark, output, before, state, change, pipeline)
    try:
        with staged_directory(output) as staging:
            steps.staging = staging
            with timer(COMPUTE) as stage:
                stage.summary = steps.compute()
            with timer(EXAMPLES) as stage:
                stage.summary = steps.examples()
            tfrecord = None
            if config.tfrecord.enabled:
                with timer(TFRECORDS) as stage:
                    tfrecord = write_tfrecords(spark, steps.specs, config, staging,
                                               before["split"])
                    stage.summary = (f"{sum(f['rows'] for f in tfrecord['files']):,} rows in "
                                     f"{len(tfrecord['files'])} files")
            with timer(AGGREGATION_FILES) as stage:
                stage.summary = steps.aggregation_files()
            with timer(PROFILE) as stage:
                stage.summary = steps.profile()
            with timer(STATE) as stage:
                steps.link_the_rest()
                metadata = steps.metadata(tfrecord, timer.seconds,
                                        time.perf_counter() - started)
                stage.summary = f"{len(change.changed)} computed, {len(change.removed)} dropped"
    finally:
        steps.release()
    progress(f"wrote {output}")
    return JobResult(output, metadata)


def _own_fit(spark: SparkSession, output: Path, metadata: dict[str, Any]) -> Fit:
    """The fit ``output`` records: the one its examples were transformed with."""
    fit = metadata.get("fit")
    if fit is None:
        raise IncompatibleStateError(f"{output}: the output records no fit (written before "
                                     "fits were): run `featureline etl run` once to fit")
    return Fit(output.resolve(), fit["version"], fit["fitted_at"], fit["trained_until"],
               dict(metadata["artifacts"]), spark)


class _Backfill:
    """One backfill's steps, in order: ``compute``, ``examples``, ``aggregation_files``,
    ``profile``, ``link_the_rest``, ``metadata``."""

    def __init__(self, config: EtlConfig, spark: SparkSession, output: Path,
                 before: dict[str, Any], state: State, change: SpecChange,
                 pipeline: FeaturePipeline) -> None:
        self.config, self.spark, self.output = config, spark, output
        self.before, self.state, self.change, self.pipeline = before, state, change, pipeline
        self.staging = Path()
        # Written by this run: the output's paths (relative) not to link from the old one.
        self.written: set[str] = {METADATA_FILE, "examples", "tfrecord", PROFILE_FILE,
                                  f"{ARTIFACTS_DIR}/stats.json", f"{STATE_DIR}/{STATE_FILE}"}
        self.old_groups = _old_groups(before, state)
        # Groups whose snapshot days move (their longest window changed): computed whole.
        self.whole = {group.name for group in config.aggregations
                      if group.name in self.old_groups
                      and decay_days(group) != decay_days(self.old_groups[group.name])}
        self.aggregations: Aggregations | None = None
        self.values: DataFrame | None = None
        self.required: list[StructField] = []
        self.specs: list[FeatureSpec] = []
        self.new_columns: list[str] = []
        # metadata.json's ``aggregations``: each group's snapshot table.
        self.tables: dict[str, Any] = {}

    def release(self) -> None:
        """Free what the ops cached."""
        self.pipeline.release()
        if self.aggregations is not None:
            self.aggregations.release()

    # --- compute -----------------------------------------------------------------------

    def compute(self) -> str:
        """The changed outputs' values at every stored event, transformed as the examples
        hold them, written under the staging folder and read back (``self.values``: the
        example's keys and those columns)."""
        config, pipeline, change = self.config, self.pipeline, self.change
        events = self._events()
        self._restore(events)
        derived = _needed_derived(config, change)
        # Derived features read raw values: the outputs they read are computed too.
        computed = change.aggregations() | {
            name for spec in config.derive if spec.name in derived
            for name in references(spec.tree) if ":" in name}
        computed |= {f.qualified for group in config.aggregations if group.name in self.whole
                     for f in group.outputs()}
        rows = events
        if _reads_op_features(pipeline, config, derived):
            for op in pipeline.ops:
                if op.fitted and not isinstance(op, (Aggregations, Derived)):
                    rows = op.transform(rows)
        if computed:
            self.aggregations = Aggregations(config.aggregations,
                                             config.event_contract().numeric,
                                             encoded_columns(config), computed)
            source = events
            categorify = pipeline.op(Categorify)
            if self.aggregations.reads_ids and isinstance(categorify, Categorify):
                source = categorify.transform(events)
            rows = self.aggregations.transform(rows, source)
        if derived:
            rows = Derived([s for s in config.derive if s.name in derived],
                           derive_inputs(config)).transform(rows)
        changed = self._changed_columns()
        self._fit_model_ready(rows, changed)
        self.specs = pipeline.features()
        written = [s for s in self.specs
                   if s.name in changed or (s.transform or {}).get("of") in changed]
        self.new_columns = [s.name for s in written]
        if written:
            ready = pipeline.model_ready.transform(rows, changed).select(
                *KEYS, *(F.col(s.name).cast(SPARK_TYPES[s.kind]) for s in written))
            self.required = [f for f in ready.schema if not f.nullable and f.name not in KEYS]
            self.values = self._per_example(ready)
        return (f"{len(written)} example column(s) of {len(change.changed)} output(s) over "
                f"{self.state.rows['accepted']:,} stored events")

    def _events(self) -> DataFrame:
        """The stored events with their kept features, the time key and the split."""
        valid_from = datetime.fromisoformat(self.before["split"]["valid_from"])
        stored = stored_events(self.spark, self.state,
                               state_columns(self.pipeline, self.config))
        return with_time_key(stored).withColumn(SPLIT, split_column(valid_from))

    def _restore(self, events: DataFrame) -> None:
        """Every op as the output's fit left it: its vocabularies, without counting a row."""
        categorify = self.pipeline.op(Categorify)
        if isinstance(categorify, Categorify):
            categorify.extend(load_previous(self.spark, self.output,
                                            categorify.columns).tables)
        self.pipeline.fit(events.limit(0))

    def _changed_columns(self) -> set[str]:
        """The example columns of the changed outputs (an aggregation's ``g__o``)."""
        qualified = {f.qualified: f.column_name for group in self.config.aggregations
                     for f in group.outputs()}
        return {qualified.get(name, name) for name in self.change.changed}

    def _fit_model_ready(self, rows: DataFrame, changed: set[str]) -> None:
        """The fit's statistics of the features kept; the changed ones' fitted over its
        training split (the rows before where it ended)."""
        model_ready = self.pipeline.model_ready
        assert self.pipeline.frozen is not None
        model_ready.restore(self.pipeline.frozen.op_stats("model_ready"))
        for name in changed:
            model_ready.stats.pop(name, None)
        until = self.pipeline.frozen.trained_until or self.before["split"]["valid_from"]
        if changed & (set(model_ready.transforms) | set(model_ready.missing)):
            model_ready.fit(rows.where(F.col("ts") < F.lit(datetime.fromisoformat(until))),
                            changed)

    def _per_example(self, values: DataFrame) -> DataFrame:
        """``values`` once per example's keys (an example is one event, or one impression),
        written and read back; refused where two events with the same keys hold other
        values (the examples could not tell them apart)."""
        columns = [c for c in values.columns if c not in KEYS]
        both = F.struct(*columns)
        per_key = reread(values.groupBy(*KEYS).agg(F.min(both).alias(_LOW),
                                                  F.max(both).alias(_HIGH)),
                         self.staging / WORK_DIR / "values", files=None)
        clash = per_key.where(~F.col(_LOW).eqNullSafe(F.col(_HIGH))).select(*KEYS).first()
        if clash is not None:
            raise IncompatibleStateError(
                f"{self.output}: events with the same {', '.join(KEYS)} ({clash[0]}, "
                f"{clash[1]}, {clash[2]}) hold different values of {', '.join(columns)}; "
                "their examples cannot be told apart: run `featureline etl run` without "
                "--incremental (a full run)")
        return per_key.select(*KEYS, *(F.col(f"{_LOW}.{c}").alias(c) for c in columns))

    # --- examples ----------------------------------------------------------------------

    def examples(self) -> str:
        """The output's examples with the changed columns joined on, the removed dropped,
        every column in the spec's order. Where none is joined on, each file is copied less
        the removed columns, its rows and row groups as they are (no Spark job)."""
        if self.values is None:
            columns = [*KEYS, *(s.name for s in self.specs), LABEL]
            files = sorted((self.output / "examples").rglob("*.parquet"))
            with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                list(pool.map(lambda file: _with_columns(
                    file, self.staging / file.relative_to(self.output), columns), files))
            return f"{len(files)} files copied with {len(columns)} columns"
        examples = read_as_written(self.spark, self.output / "examples").drop(EXAMPLE_DAY)
        stale = set(self.new_columns) | {name for name in examples.columns
                                         if name not in {s.name for s in self.specs}
                                         and name not in (*KEYS, LABEL, SPLIT)}
        # As a full run's: a value never missing is declared so (the join would not).
        examples = examples.drop(*stale).join(self.values, list(KEYS), "left").withColumns(
            {f.name: required(F.col(f.name), f.dataType) for f in self.required})
        write_examples(examples, self.specs, self.config, self.staging / "examples")
        shutil.rmtree(self.staging / WORK_DIR, ignore_errors=True)
        return (f"{len(self.new_columns)} column(s) written, {len(stale - set(self.new_columns))}"
                " dropped")

    # --- aggregations' files -----------------------------------------------------------

    def aggregation_files(self) -> str:
        """Each changed group's snapshots and day partials written again (those of a group
        whose snapshot days moved: written whole), the changed outputs' tiles written; a
        removed group's dropped."""
        outputs = [name.partition(":") for name in (*self.change.changed,
                                                    *self.change.removed) if ":" in name]
        touched = {group for group, _, _ in outputs}
        # The other groups' files, and the touched groups' other tiles, are linked.
        self.written |= {f"{AGGREGATIONS_DIR}/{g}" for g in touched}
        self.written |= {f"{STATE_DIR}/{DAY_PARTIALS_DIR}/{g}" for g in touched}
        self.written |= {f"{TILES_DIR}/{g}/{output}" for g, _, output in outputs}
        for group in self.config.aggregations:
            if group.name in touched:
                self._group_files(group)
            else:
                self.tables[group.name] = self.before["aggregations"][group.name]
        kept = {group.name for group in self.config.aggregations}
        return (f"{len(touched & kept)} group(s) written again, "
                f"{len(set(self.old_groups) - kept)} dropped")

    def _group_files(self, group: GroupSpec) -> None:
        """A changed group's snapshots, day partials and tiles."""
        changed = [f for f in group.outputs() if f.qualified in self.change.changed]
        days = self._day_partials(group, changed)
        aggregations = self.aggregations
        if changed:
            assert aggregations is not None
            assert aggregations.rows is not None
            tiles = output_tiles(aggregations.rows, group, self.config.event_contract().numeric,
                                 self.before["tiles"]["cut_us"], days=days, outputs=changed)
            write_each([(frame, self.staging / TILES_DIR / group.name / feature.output)
                        for feature, frame in tiles])
        relative = f"{AGGREGATIONS_DIR}/{group.name}"
        if group.name in self.whole or group.name not in self.old_groups:
            assert aggregations is not None
            frame = aggregations.snapshots(group)
        else:
            frame = self._snapshots_joined(group, changed)
        write_parquet_days(frame, self.staging / relative, EVENT_TIMESTAMP, *group.keys)
        frame = read_as_written(self.spark, self.staging / relative)
        self.tables[group.name] = {
            "path": relative, "keys": table_schema(frame, list(group.keys)),
            "timestamp_field": EVENT_TIMESTAMP,
            "features": table_schema(frame, [f.output for f in group.outputs()])}

    def _snapshots_joined(self, group: GroupSpec, changed: list[AggregateFeature]
                          ) -> DataFrame:
        """The output's snapshots of ``group`` less its removed and changed outputs, the
        changed ones' values joined on (the same keys and days: the group's longest window
        is the same)."""
        relative = f"{AGGREGATIONS_DIR}/{group.name}"
        keys = [*group.keys, EVENT_TIMESTAMP]
        kept = [f.output for f in group.outputs() if f not in changed]
        old = read_as_written(self.spark, self.output / relative).select(*keys, *kept)
        if changed:
            assert self.aggregations is not None
            new = self.aggregations.snapshots(group)
            renamed = new.select(*(F.col(k).alias(f"_new_{k}") for k in keys),
                                 *(f.output for f in changed))
            condition = [old[k].eqNullSafe(renamed[f"_new_{k}"]) for k in keys]
            old = old.join(renamed, condition, "left").drop(*(f"_new_{k}" for k in keys))
            old = old.withColumns({f.name: required(F.col(f.name), f.dataType)
                                   for f in new.schema if not f.nullable and f.name not in keys})
        return old.select(*keys, *(f.output for f in group.outputs()))

    def _day_partials(self, group: GroupSpec, changed: list[AggregateFeature]
                      ) -> DataFrame | None:
        """The group's day partials, every day's (None: no output of it on days): computed
        again where an output on days changed, else the output's less the removed
        outputs' columns."""
        on = [f for f in group.outputs() if on_days(f)]
        folder = day_partials_folder(self.staging, group.name)
        if not on:
            return None
        if any(f in changed for f in on) or not day_partials_folder(
                self.output, group.name).is_dir():
            assert self.aggregations is not None
            frame = self.aggregations.day_partials[group.name]
        else:
            old = day_partials_read(self.spark, day_partials_folder(self.output, group.name))
            prefixes = tuple(f"{f.column_name}__" for f in on)
            frame = old.select(TS_MICROS, *group.keys,
                               *(c for c in old.columns if c.startswith(prefixes)))
        return write_partial_days(frame, folder, group.keys)

    # --- the rest ----------------------------------------------------------------------

    def profile(self) -> str:
        """The newest day's profile, its features the spec's. The validation gate's window,
        reference, report and verdict stay the output's: a backfill adds no day to check."""
        midnight = self.state.latest.replace(hour=0, minute=0, second=0, microsecond=0)
        newest = stored_events(self.spark, self.state,
                               [*ingest.event_columns(self.config), LABEL], since=midnight)
        rows = self.before["rows"]
        (profile,) = newest_profiles(self.spark, newest, self.specs,
                                     rows.get("this_run", rows), self.config, self.staging,
                                     day_counts(self.state, newest.limit(0)))
        return f"{profile['day']} profiled; the checks' window kept"

    def link_the_rest(self) -> None:
        """Every file of the output this run did not write, linked."""
        for source in _files(self.output):
            relative = source.relative_to(self.output).as_posix()
            if any(relative == w or relative.startswith(f"{w}/") for w in self.written):
                continue
            target = self.staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            link_or_copy(source, target)

    def metadata(self, tfrecord: dict[str, Any] | None, timings: dict[str, float],
                 total: float) -> dict[str, Any]:
        """metadata.json: the output's, with the spec's features, model inputs, tiles,
        snapshots, statistics and this run's stamp; stats.json and state.json with them."""
        before, config, pipeline = self.before, self.config, self.pipeline
        stats = {**before["artifacts"], "model_ready": pipeline.model_ready.artifacts()}
        write_json(stats, self.staging / ARTIFACTS_DIR / "stats.json")
        inputs = pipeline.inputs()
        tiles = dict(before["tiles"])
        spec_groups = {group.name for group in config.aggregations} | set(self.old_groups)
        tables = {name: path for name, path in tiles["tables"].items()
                  if name.partition(":")[0] not in spec_groups}
        tables |= {f.qualified: f"{TILES_DIR}/{f.group}/{f.output}"
                   for group in config.aggregations for f in group.outputs()}
        tiles["tables"] = tables
        tiles["groups"] = [g.model_dump(mode="json") for g in [*config.aggregations,
                                                               *inputs.groups]]
        metadata = {
            **before,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "featureline_version": __version__, "config_hash": config.hash(),
            "mode": "backfill", "features": [s.to_json() for s in self.specs],
            "embedding_plan": embedding_plan(self.specs, config.embeddings),
            "artifacts": stats, "timings_s": {**timings, "total": round(total, 3)},
            "fit": {**before["fit"], "values_hash": values_hash(config)},
            "tiles": tiles, "inputs": inputs.model_dump(mode="json"),
            "dataset": {**before["dataset"], "config_hash": config.hash(),
                        "version": run_id(), "extends": str(self.output)},
        }
        if tfrecord is not None:
            metadata["tfrecord"] = tfrecord
        metadata["aggregations"] = self.tables
        if self.tables:
            metadata["outputs"] = {**before["outputs"], AGGREGATIONS_DIR: AGGREGATIONS_DIR}
        else:
            metadata.pop("aggregations")
            metadata["outputs"] = {k: v for k, v in before["outputs"].items()
                                   if k != AGGREGATIONS_DIR}
        Metadata.parse(metadata)
        write_json(metadata, self.staging / METADATA_FILE)
        state = json.loads((self.state.folder / STATE_FILE).read_text())
        write_json({**state, "values_hash": values_hash(config),
                    "outputs": output_fingerprints(config),
                    "others": other_settings_hash(config)},
                   self.staging / STATE_DIR / STATE_FILE)
        return metadata


def _old_groups(metadata: dict[str, Any], state: State) -> dict[str, GroupSpec]:
    """The output's aggregation groups (those its fingerprints name), by name."""
    names = {name.partition(":")[0] for name in state.outputs or {} if ":" in name}
    return {group.name: group for group in map(GroupSpec.model_validate,
                                               metadata["tiles"]["groups"])
            if group.name in names}


def _needed_derived(config: EtlConfig, change: SpecChange) -> set[str]:
    """The derived features to compute: the changed ones and those they read."""
    specs = {spec.name: spec for spec in config.derive}
    needed = {name for name in change.changed if name in specs}
    pending = list(needed)
    while pending:
        for name in references(specs[pending.pop()].tree):
            if name in specs and name not in needed:
                needed.add(name)
                pending.append(name)
    return needed


def _reads_op_features(pipeline: FeaturePipeline, config: EtlConfig,
                       derived: Collection[str]) -> bool:
    """Whether a derived feature to compute reads an output of a fitted op (a target
    encoding, a normalised number): those ops then run too."""
    fitted = {spec.name for op in pipeline.ops
              if op.fitted and not isinstance(op, (Aggregations, Derived))
              for spec in op.features()}
    return any(references(spec.tree) & fitted for spec in config.derive
               if spec.name in derived)


# Where Spark's Parquet writer keeps a file's schema (its types, which Parquet's do not all
# tell apart).
_SPARK_SCHEMA = b"org.apache.spark.sql.parquet.row.metadata"


def _with_columns(source: Path, target: Path, columns: list[str]) -> None:
    """A copy of the Parquet file ``source`` at ``target`` holding only ``columns``, in that
    order: each row group as it is, the schema Spark wrote kept for those columns."""
    read = pq.ParquetFile(source)
    schema = read.schema_arrow
    metadata = dict(schema.metadata or {})
    if _SPARK_SCHEMA in metadata:
        spark_schema = json.loads(metadata[_SPARK_SCHEMA])
        fields = {field["name"]: field for field in spark_schema["fields"]}
        spark_schema["fields"] = [fields[name] for name in columns]
        metadata[_SPARK_SCHEMA] = json.dumps(spark_schema).encode()
    kept = pa.schema([schema.field(name) for name in columns], metadata=metadata)
    target.parent.mkdir(parents=True, exist_ok=True)
    first = read.metadata.row_group(0) if read.metadata.num_row_groups else None
    chunks = [first.column(index) for index in range(first.num_columns)] if first else []
    # Spark's timestamps as it wrote them (INT96 by default), and its compression.
    with pq.ParquetWriter(
            target, kept, compression=chunks[0].compression.lower() if chunks else "snappy",
            use_deprecated_int96_timestamps=any(c.physical_type == "INT96" for c in chunks),
    ) as writer:
        for index in range(read.num_row_groups):
            writer.write_table(read.read_row_group(index, columns=columns).select(columns)
                               .cast(kept), row_group_size=read.metadata.row_group(
                                   index).num_rows or None)


def _files(folder: Path) -> Iterator[Path]:
    for root, _, names in os.walk(folder):
        for name in names:
            yield Path(root) / name
