"""ETL throughput: events/s of the whole job at several log sizes on local[2].

Prints one JSON document. In the same run it measures a baseline, Spark reading and parsing
the same raw log (the floor any job on it pays), and reports the job's cost relative to it,
plus the cost per event at each size relative to the smallest size (1.0 = linear scaling).

    python benchmarks/bench_etl.py                        # 1M and 10M events
    python benchmarks/bench_etl.py --sizes 20000 --smoke  # the tiny size CI runs
    python benchmarks/bench_etl.py --sizes 1000000 --profile  # + the slowest Spark stages
    #   (with --incremental: the incremental run's)
    python benchmarks/bench_etl.py --incremental --sizes 1000000  # a new day on 30 days
    python benchmarks/bench_etl.py --incremental --keep-fit --sizes 1000000  # its fit kept
    python benchmarks/bench_etl.py --incremental --keep-fit --day-lines 30000  # same day, 1M/10M
    python benchmarks/bench_etl.py --aggregations --sizes 1000000  # the cost of a spec
    python benchmarks/bench_etl.py --spec-change --sizes 1000000  # an output added, removed

``--incremental``: a log of 31 days at each size (the history, then one new day); first (not
timed) the full job over each size's first 29 days and an incremental run of the 30th (the
new day follows a day's run, as in the daily chain), then, timed, the incremental run of the
new day's file (twice: A B, the full runs, B A over the sizes; its time the mean) against a full
recompute over every file extending the same vocabularies, the outputs compared by the
benchmark itself (examples, entity tables, vocabularies: equal row for row); the
incremental cost per new event at each size relative to the smallest size.
``--keep-fit`` with it: every run keeps the history's fit (``etl.fit.refit_every``), so the
incremental run writes only the days it changes, against a full run with ``--fit-from`` the
history's output. ``--day-lines N``: the new day holds the last day's first N lines at every
size, so ``incremental_s_vs_smallest`` is what the longer history costs the same day.

``--attributes``: the items' category and price in the log, from an attribute file
(``etl.attributes``), and from one with ``valid_from``, interleaved A B C C B A; the ratios of
the means are what reading attributes from a file costs.

``--aggregations [SPEC]``: the job without and with an ``aggregations:`` spec
(benchmarks/aggregations.yaml by default) on the same log, interleaved A B B A; the ratio of
the means is the spec's cost.

``--spec-change``: a full run with that spec, then on copies of its output the backfill of
one output added to its first group and of one removed from it (``featureline etl backfill``),
each timed against the full run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import shutil
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml
from pyspark.sql import DataFrame, SparkSession

from featureline.core.aggregations import GroupSpec
from featureline.etl import datagen, job, job_writes, spec_change
from featureline.etl.aggregations import on_days
from featureline.etl.config import EtlConfig, SparkSettings, with_overrides
from featureline.etl.datagen import log_day
from featureline.etl.incremental import EVENTS_DIR, STATE_DIR
from featureline.etl.qualification import stage_times
from featureline.etl.session import build_session
from featureline.etl.stages import STAGE_PROPERTY

BENCH_SPARK = SparkSettings(master="local[2]", properties={
    "spark.driver.memory": "12g", "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8"})
# Spark stages listed per size with --profile.
PROFILE_TOP = 10
AGGREGATIONS = Path(__file__).with_name("aggregations.yaml")


def write_log_apart(raw: Path, **options: Any) -> None:
    """``datagen.write_log`` in a process of its own: at 10M events it holds the whole log's
    text and frames in memory (some 14 GB), which beside the session's JVM outgrew this
    24 GB machine; the process's memory goes back when it ends."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as apart:
        apart.submit(datagen.write_log, raw, **options).result()


def _profiled(settings: SparkSettings, event_log: Path) -> SparkSettings:
    """``settings`` writing an uncompressed event log (read while the session runs)."""
    return settings.model_copy(update={"properties": {
        **settings.properties, "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": event_log.as_uri(), "spark.eventLog.compress": "false"}})


def _read_baseline(spark: SparkSession, path: Path) -> float:
    spark.sparkContext.setLocalProperty(STAGE_PROPERTY, "read_baseline")
    try:
        start = time.perf_counter()
        spark.read.json(str(path)).count()
        return time.perf_counter() - start
    finally:
        spark.sparkContext.setLocalProperty(STAGE_PROPERTY, None)  # type: ignore[arg-type]


def measure(spark: SparkSession, events: int, workdir: Path) -> dict[str, Any]:
    raw = workdir / f"events-{events}.jsonl"
    users, items = max(100, events // 40), max(50, events // 100)
    start = time.perf_counter()
    write_log_apart(raw, events=events, users=users, items=items, days=28, seed=1,
                    bad_fraction=0.001)
    datagen_s = time.perf_counter() - start
    read_s = _read_baseline(spark, raw)
    config = with_overrides(EtlConfig(), input_path=str(raw), output=str(workdir / "out"))
    start = time.perf_counter()
    result = job.run(config, spark, progress=lambda _: None)
    job_s = time.perf_counter() - start
    return {
        "events": events, "users": users, "items": items,
        "datagen_s": round(datagen_s, 2),
        "read_baseline_s": round(read_s, 2),
        "job_s": round(job_s, 2),
        "events_per_s": round(events / job_s),
        "job_vs_read_baseline": round(job_s / read_s, 2),
        "stages_s": result.metadata["timings_s"],
        "rows": result.metadata["rows"],
    }


ABBA = ("without", "with", "with", "without")


def measure_aggregations(spark: SparkSession, events: int, workdir: Path, spec: Path,
                         order: tuple[str, ...] = ABBA, event_log: Path | None = None
                         ) -> dict[str, Any]:
    """The job's time without (A) and with (B) the spec's groups on one log, in ``order``;
    with ``event_log`` (the session's), each run's stage times and slowest Spark stages."""
    groups = _spec_groups(spec)
    raw = workdir / f"events-{events}.jsonl"
    write_log_apart(raw, events=events, users=max(100, events // 40), items=max(50, events // 100),
                    days=28, seed=1, bad_fraction=0.001)
    base = with_overrides(EtlConfig(), input_path=str(raw), output=str(workdir / "out"))
    times: dict[str, list[float]] = {"without": [], "with": []}
    profiles: list[dict[str, Any]] = []
    seen: set[int] = set()
    for side in order:
        config = base.model_copy(update={"aggregations": groups if side == "with" else []})
        shutil.rmtree(workdir / "out", ignore_errors=True)
        start = time.perf_counter()
        result = job.run(config, spark, progress=lambda _: None)
        times[side].append(round(time.perf_counter() - start, 2))
        if event_log is not None:
            stages = [s for s in stage_times(event_log) if s["stage_id"] not in seen]
            seen.update(s["stage_id"] for s in stages)
            profiles.append({"side": side, "stages_s": result.metadata["timings_s"],
                             "spark_stages": stages[:PROFILE_TOP]})
    values = sum(len(g.outputs()) for g in groups)
    means = {side: sum(runs) / len(runs) for side, runs in times.items()}
    report = {"events": events, "spec": spec.name, "groups": len(groups), "values": values,
              "job_s": times, "with_vs_without": round(means["with"] / means["without"], 2)}
    return report | ({"profiles": profiles} if event_log is not None else {})


# --spec-change: the output added to the spec, and the one removed from it.
ADDED_OUTPUT = {"op": "count", "name": "clicks", "filter": "event_type in (click)",
                "windows": ["7d"]}
REMOVED_WINDOW = ("count", "1h")


def measure_spec_change(spark: SparkSession, events: int, workdir: Path, spec: Path
                        ) -> dict[str, Any]:
    """A full run with the spec's groups, then (each on a copy of its output) the backfill
    of one output added to the first group and the backfill of one output removed from it
    (``featureline etl backfill``); each backfill's time over the full run's."""
    groups = _spec_groups(spec)
    raw = workdir / f"events-{events}.jsonl"
    write_log_apart(raw, events=events, users=max(100, events // 40), items=max(50, events // 100),
                    days=28, seed=1, bad_fraction=0.001)
    full_output = workdir / f"full-{events}"
    base = with_overrides(EtlConfig(), input_path=str(raw), output=str(full_output))
    start = time.perf_counter()
    job.run(base.model_copy(update={"aggregations": groups}), spark, progress=lambda _: None)
    full_s = time.perf_counter() - start
    first = groups[0]
    added = first.model_copy(update={"features": [*first.features,
                                                  type(first.features[0]).model_validate(
                                                      ADDED_OUTPUT)]})
    op, window = REMOVED_WINDOW
    removed = first.model_copy(update={"features": [
        feature.model_copy(update={"windows": [w for w in feature.windows if w != window]})
        if feature.op == op and feature.name is None else feature
        for feature in first.features]})
    report: dict[str, Any] = {"events": events, "spec": spec.name, "full_s": round(full_s, 2)}
    for name, group in (("add", added), ("remove", removed)):
        output = workdir / f"{name}-{events}"
        shutil.copytree(full_output, output)
        config = base.model_copy(update={
            "aggregations": [group, *groups[1:]], "mode": "incremental",
            "output": base.output.model_copy(update={"path": str(output)})})
        lines: list[str] = []
        start = time.perf_counter()
        result = spec_change.backfill_if_changed(config, spark, lines.append)
        seconds = time.perf_counter() - start
        assert result is not None, f"{name}: nothing to backfill"
        report[name] = {"change": lines[0], "s": round(seconds, 2),
                        "vs_full": round(seconds / full_s, 3),
                        "stages_s": result.metadata["timings_s"]}
        shutil.rmtree(output)
    shutil.rmtree(full_output)
    return report


def run_spec_change(sizes: list[int], spec: Path) -> dict[str, Any]:
    spark = build_session(BENCH_SPARK)
    with tempfile.TemporaryDirectory(prefix="bench-etl-spec-change-") as tmp:
        runs = [measure_spec_change(spark, events, Path(tmp), spec) for events in sizes]
    return {"benchmark": "etl_spec_change",
            "machine": {"platform": platform.platform(), "python": platform.python_version(),
                        "spark_master": spark.sparkContext.master, "spark": spark.version},
            "runs": runs}


# The runs of --attributes, in order: the item attributes inline, from a file, from a file
# with valid_from.
ATTRIBUTE_SIDES = ("inline", "file", "valid_from", "valid_from", "file", "inline")


def _attribute_inputs(spark: SparkSession, raw: Path, workdir: Path) -> tuple[Path, Path, Path]:
    """The log without its item attributes, and the items' file of them (category, price),
    without and with a ``valid_from`` column: from the generated log, whose items keep one
    category and price."""
    from pyspark.sql import functions as F

    log = spark.read.json(str(raw))
    bare = workdir / "bare"
    log.drop("category", "price").write.mode("overwrite").json(str(bare))
    items = (log.where(F.col("item_id").isNotNull()).groupBy("item_id")
             .agg(F.first("category", ignorenulls=True).alias("category"),
                  F.first("price", ignorenulls=True).alias("price")))
    files = []
    for name, frame in (("items", items),
                        ("items-dated", items.withColumn("since", F.lit("2000-01-01")))):
        folder = workdir / name
        frame.coalesce(1).write.mode("overwrite").option("header", "true").csv(str(folder))
        files.append(folder)
    return bare, files[0], files[1]


def measure_attributes(spark: SparkSession, events: int, workdir: Path,
                       order: tuple[str, ...] = ATTRIBUTE_SIDES) -> dict[str, Any]:
    """The job's time with the items' category and price in the log (inline), and from an
    attribute file joined by item_id (file; valid_from: the file versioned), in ``order``."""
    raw = workdir / f"events-{events}.jsonl"
    write_log_apart(raw, events=events, users=max(100, events // 40),
                    items=max(50, events // 100), days=28, seed=1, bad_fraction=0.001)
    bare, items, dated = _attribute_inputs(spark, raw, workdir)
    inline = with_overrides(EtlConfig(), input_path=str(raw), output=str(workdir / "out"))
    data = inline.model_dump(mode="json")
    data["source"].update(path=str(bare), categorical=["device"], continuous=[],
                          roles={"device": "request"})
    table = {"name": "items", "format": "csv", "key": {"item_id": "item_id"},
             "categorical": ["category"], "continuous": ["price"]}
    configs = {"inline": inline,
               "file": EtlConfig.model_validate(
                   {**data, "attributes": [{**table, "path": str(items)}]}),
               "valid_from": EtlConfig.model_validate(
                   {**data, "attributes": [{**table, "path": str(dated),
                                            "valid_from": "since"}]})}
    times: dict[str, list[float]] = {side: [] for side in configs}
    rows: dict[str, int] = {}
    for side in order:
        shutil.rmtree(workdir / "out", ignore_errors=True)
        start = time.perf_counter()
        result = job.run(configs[side], spark, progress=lambda _: None)
        times[side].append(round(time.perf_counter() - start, 2))
        rows[side] = result.metadata["rows"]["accepted"]
    means = {side: sum(runs) / len(runs) for side, runs in times.items() if runs}
    return {"events": events, "job_s": times, "accepted": rows,
            "file_vs_inline": round(means["file"] / means["inline"], 3),
            "valid_from_vs_inline": round(means["valid_from"] / means["inline"], 3)}


# The per-event rule the label join is measured against: every event an example.
PER_EVENT_LABEL = "event_type in (click, purchase)"


def measure_label_join(spark: SparkSession, events: int, workdir: Path,
                       order: tuple[str, ...] = ABBA, warm_up: bool = True) -> dict[str, Any]:
    """The job's time with the per-event rule (A: "without") and with the default label join
    (B: "with") on one log, in ``order``, after a run that only warms the JVM up
    (``warm_up``); the examples and the join's accounting."""
    raw = workdir / f"events-{events}.jsonl"
    write_log_apart(raw, events=events, users=max(100, events // 40), items=max(50, events // 100),
                    days=28, seed=1, bad_fraction=0.001)
    configs = {"with": with_overrides(EtlConfig(), input_path=str(raw),
                                      output=str(workdir / "out")),
               "without": with_overrides(EtlConfig(), input_path=str(raw),
                                         output=str(workdir / "out"), label=PER_EVENT_LABEL)}
    times: dict[str, list[float]] = {"without": [], "with": []}
    rows: dict[str, Any] = {}
    for index, side in enumerate(("with", *order) if warm_up else order):
        shutil.rmtree(workdir / "out", ignore_errors=True)
        start = time.perf_counter()
        result = job.run(configs[side], spark, progress=lambda _: None)
        times[side].append(round(time.perf_counter() - start, 2))
        if warm_up and index == 0:  # the JVM's first run: its time left out
            times[side].pop()
            continue
        rows[side] = {"split": result.metadata["split"]["rows"],
                      "label_join": result.metadata["rows"].get("label_join"),
                      "stages_s": result.metadata["timings_s"]}
    means = {side: sum(runs) / len(runs) for side, runs in times.items()}
    return {"events": events, "job_s": times, "runs": rows,
            "with_vs_without": round(means["with"] / means["without"], 3)}


def _skip_profile(spark: SparkSession, events: DataFrame, specs: Any, rows: Any,
                  config: EtlConfig, staging: Path, output: Path, counts: Any = None
                  ) -> job_writes.Checked:
    """The profile stage left out: what the job costs without the validation gate."""
    return job_writes.Checked([], None, enabled=False)


def _measure_without(spark: SparkSession, events: int, workdir: Path, owner: Any, name: str,
                     without: Any, stage: str, order: tuple[str, ...] = ABBA,
                     warm_up: bool = True) -> dict[str, Any]:
    """The job's time without (A: ``owner.name`` replaced by ``without``) and with (B) a part
    of it on one log, in ``order``, after a run that only warms the JVM up (``warm_up``; its
    time is left out); ``stage``: the stage whose time the "with" runs report."""
    raw = workdir / f"events-{events}.jsonl"
    write_log_apart(raw, events=events, users=max(100, events // 40), items=max(50, events // 100),
                    days=28, seed=1, bad_fraction=0.001)
    config = with_overrides(EtlConfig(), input_path=str(raw), output=str(workdir / "out"))
    times: dict[str, list[float]] = {"without": [], "with": []}
    stages: dict[str, list[float]] = {"without": [], "with": []}
    own = getattr(owner, name)
    for index, side in enumerate(("with", *order) if warm_up else order):
        shutil.rmtree(workdir / "out", ignore_errors=True)
        setattr(owner, name, own if side == "with" else without)
        try:
            start = time.perf_counter()
            result = job.run(config, spark, progress=lambda _: None)
            times[side].append(round(time.perf_counter() - start, 2))
        finally:
            setattr(owner, name, own)
        if warm_up and index == 0:
            times[side].pop()
            continue
        stages[side].append(result.metadata["timings_s"].get(stage, 0.0))
    means = {side: sum(runs) / len(runs) for side, runs in times.items()}
    return {"events": events, "job_s": times, f"{stage}_stage_s": stages,
            "with_vs_without": round(means["with"] / means["without"], 3),
            "stage_vs_without": round(sum(stages["with"]) / len(stages["with"])
                                      / means["without"], 3)}


def measure_checks(spark: SparkSession, events: int, workdir: Path,
                   order: tuple[str, ...] = ABBA, warm_up: bool = True) -> dict[str, Any]:
    """The job's time without (A) and with (B) its profile stage on one log."""
    return _measure_without(spark, events, workdir, job, "profile_and_check", _skip_profile,
                            "profile", order, warm_up)


def measure_model_inputs(spark: SparkSession, events: int, workdir: Path,
                         order: tuple[str, ...] = ABBA, warm_up: bool = True
                         ) -> dict[str, Any]:
    """The job's time without (A) and with (B) the model inputs' groups (their tiles, written
    in the entities stage) on one log."""
    from featureline.core.model_inputs import ModelInputs
    from featureline.etl.features.pipeline import FeaturePipeline

    return _measure_without(spark, events, workdir, FeaturePipeline, "inputs",
                            lambda self: ModelInputs(), "entities", order, warm_up)


def run_checks(sizes: list[int], spark: SparkSession | None = None,
               order: tuple[str, ...] = ABBA, warm_up: bool = True) -> dict[str, Any]:
    spark = spark or build_session(BENCH_SPARK)
    with tempfile.TemporaryDirectory(prefix="bench-etl-checks-") as tmp:
        runs = [measure_checks(spark, events, Path(tmp), order, warm_up) for events in sizes]
    return {"benchmark": "etl_checks",
            "machine": {"platform": platform.platform(), "python": platform.python_version(),
                        "spark_master": spark.sparkContext.master, "spark": spark.version},
            "runs": runs}


def run_aggregations(sizes: list[int], spec: Path, spark: SparkSession | None = None,
                     order: tuple[str, ...] = ABBA, event_log: Path | None = None
                     ) -> dict[str, Any]:
    spark = spark or build_session(BENCH_SPARK)
    with tempfile.TemporaryDirectory(prefix="bench-etl-aggregations-") as tmp:
        runs = [measure_aggregations(spark, events, Path(tmp), spec, order, event_log)
                for events in sizes]
    return {"benchmark": "etl_aggregations",
            "machine": {"platform": platform.platform(), "python": platform.python_version(),
                        "spark_master": spark.sparkContext.master, "spark": spark.version},
            "runs": runs}


def _split_days(raw: Path, folder: Path, day_lines: int | None = None
                ) -> tuple[Path, Path, Path, int]:
    """The log as three files: every day but the last two (and lines without a date), the
    day before the last, and the last day (its first ``day_lines`` only where given: the
    others are left out); how many lines the new file has. Streamed: at 10M events the log is
    1.5 GB."""
    with raw.open() as lines:
        days = sorted(set(filter(None, map(log_day, lines))))
    last, before = days[-1], days[-2]
    folder.mkdir()
    paths = [folder / f"events-{name}.jsonl" for name in ("history", "before", "new")]
    new_lines = 0
    with raw.open() as lines, paths[0].open("w") as history, paths[1].open("w") as previous, \
            paths[2].open("w") as new:
        for line in lines:
            when = log_day(line)
            if when == last and day_lines is not None and new_lines >= day_lines:
                continue
            new_lines += when == last
            target = new if when == last else previous if when == before else history
            target.write(line if line.endswith("\n") else line + "\n")
    return paths[0], paths[1], paths[2], new_lines


def _column(path: Path, name: str) -> pa.ChunkedArray:
    column = pq.read_table(path, columns=[name])[name]
    return column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column


def _row_order(path: Path, schema: pa.Schema) -> pa.Array:
    """The table's rows in the order of its values, lists left out: floating columns last, so
    that a last-bit difference in one rarely decides the order."""
    names = sorted((f.name for f in schema if not pa.types.is_list(f.type)),
                   key=lambda name: pa.types.is_floating(schema.field(name).type))
    keys = pa.table({name: _column(path, name) for name in names})
    return pc.sort_indices(keys, [(name, "ascending") for name in names])


def _compare(ours: Path, theirs: Path) -> dict[str, Any]:
    """Where two Parquet tables differ, rows in the order of their values: nothing when they
    are equal (schemas included); else, per column, how many values differ and by how much
    at most (numeric columns). One column at a time: at 10M events a table is gigabytes."""
    schema, other = (pa.schema([f.remove_metadata() for f in pq.ParquetDataset(path).schema])
                     for path in (ours, theirs))
    rows = tuple(pq.read_table(path, columns=[schema.names[0]]).num_rows
                 for path in (ours, theirs))
    if schema != other or rows[0] != rows[1]:
        return {"schema_or_rows": [str(schema), str(other), *rows]}
    order = _row_order(ours, schema), _row_order(theirs, schema)
    columns: dict[str, Any] = {}
    for name in schema.names:
        left, right = (_column(path, name).take(at) for path, at in zip(
            (ours, theirs), order, strict=True))
        if left.equals(right):
            continue
        if pa.types.is_floating(left.type) or pa.types.is_integer(left.type):
            a, b = left.to_numpy(), right.to_numpy()
            differing = ~((a == b) | (np.isnan(a) & np.isnan(b)))
            columns[name] = {"values": int(differing.sum()), "max_abs_diff": float(
                np.abs(a[differing].astype(float) - b[differing]).max())}
        else:
            columns[name] = {"values": sum(x != y for x, y in zip(
                left.to_pylist(), right.to_pylist(), strict=True))}
    return columns


@dataclass(frozen=True)
class _History:
    """A size's history, run once (not timed): the config the runs derive from (its output,
    kept as the start of every timed run), the new day's file and its lines."""

    events: int
    base: EtlConfig
    new: Path
    new_lines: int

    @property
    def output(self) -> Path:
        return Path(self.base.output.path)


def _spec_groups(spec: Path) -> list[GroupSpec]:
    """The ``aggregations:`` groups of a spec file."""
    return [GroupSpec.model_validate(g) for g in yaml.safe_load(spec.read_text())["aggregations"]]


def _raw_days(events: int, workdir: Path, day_lines: int | None
              ) -> tuple[Path, Path, Path, int]:
    """A generated log of ``events`` as :func:`_split_days` leaves it."""
    raw = workdir / f"all-{events}.jsonl"
    users, items = max(100, events // 40), max(50, events // 100)
    write_log_apart(raw, events=events, users=users, items=items, days=31, seed=1,
                    bad_fraction=0.001)
    days = _split_days(raw, workdir / f"raw-{events}", day_lines)
    raw.unlink()
    return days


def _history(spark: SparkSession, events: int, raw: tuple[Path, Path, Path, int],
             workdir: Path, keep_fit: bool, day_before: bool = True,
             groups: Sequence[GroupSpec] = ()) -> _History:
    history, before, new, new_lines = raw
    base = with_overrides(EtlConfig(), input_path=str(history),
                          output=str(workdir / f"history-{events}"))
    base = base.model_copy(update={"incremental": base.incremental.model_copy(
        update={"allow_late": True}), "aggregations": list(groups)})
    if keep_fit:
        base = base.model_copy(update={"fit": base.fit.model_copy(
            update={"refit_every": "30d"})})
    # The days but the last two by a full run, the day before by an incremental one: the new
    # day follows a day's run, as in the daily chain (with a kept fit: every value of the
    # output numbered, the day before's validation split's too). Without ``day_before``, the
    # full run takes both: the new day follows a new fit.
    if day_before:
        job.run(base, spark, progress=lambda _: None)
        job.run(with_overrides(base, input_path=str(before), incremental=True), spark,
                progress=lambda _: None)
    else:
        both = history.parent / "events-{history,before}.jsonl"
        job.run(with_overrides(base, input_path=str(both)), spark, progress=lambda _: None)
    return _History(events, base, new, new_lines)


def _incremental(spark: SparkSession, history: _History, workdir: Path, run: int
                 ) -> tuple[float, job.JobResult, tuple[float, float]]:
    """The new day's incremental run on a copy of the history's output (the copy not
    timed): its seconds, its result, and when it ran (ms since the epoch)."""
    output = workdir / f"incremental-{history.events}-{run}"
    shutil.copytree(history.output, output)
    config = with_overrides(history.base, input_path=str(history.new), output=str(output),
                            incremental=True)
    start, submitted = time.perf_counter(), time.time() * 1e3
    result = job.run(config, spark, progress=lambda _: None)
    return time.perf_counter() - start, result, (submitted, time.time() * 1e3)


def _full(spark: SparkSession, history: _History, workdir: Path, keep_fit: bool
          ) -> tuple[float, job.JobResult]:
    """The full recompute over the history's file and the new day's, extending the
    history's vocabularies (with ``keep_fit``: transforming with its fit)."""
    config = with_overrides(
        history.base, input_path=str(history.new.parent),
        output=str(workdir / f"full-{history.events}"),
        **({"fit_from": str(history.output)} if keep_fit
           else {"vocabulary_from": str(history.output)}))
    start = time.perf_counter()
    result = job.run(config, spark, progress=lambda _: None)
    return time.perf_counter() - start, result


def run_incremental(sizes: list[int], spark: SparkSession | None = None,
                    keep_fit: bool = False, day_lines: int | None = None,
                    event_log: Path | None = None, passes: int = 2,
                    day_before: bool = True, spec: Path | None = None) -> dict[str, Any]:
    """Every size's history first (not timed); then, timed, each size's incremental run in
    the sizes' order, each size's full recompute, and (``passes`` 2) each size's incremental
    run again in the reverse order (A B, the full runs, B A): each ratio is of means over
    runs on either side of the others, so this machine's drift between them cancels (the
    same new day on 1M and 10M of history was 1.24x in one run and 1.82x in another when the
    sizes ran one after the other, benchmarks/README.md). ``event_log``: the session's, whose
    slowest Spark stages of each size's first incremental run are listed (``--profile``).
    ``day_before`` off: each history is one full run (the new day follows a new fit).
    ``spec``: an ``aggregations:`` spec every run computes."""
    if passes not in (1, 2):
        raise ValueError(f"passes: 1 or 2, not {passes}")
    groups = _spec_groups(spec) if spec is not None else []
    tables = ("examples", "entities/user", "entities/item", "artifacts/categorify/user_id",
              "artifacts/categorify/item_id", f"{STATE_DIR}/{EVENTS_DIR}",
              *(f"aggregations/{group.name}" for group in groups),
              *(f"{STATE_DIR}/day_partials/{group.name}" for group in groups
                if any(map(on_days, group.outputs()))))
    with tempfile.TemporaryDirectory(prefix="bench-etl-incremental-") as tmp:
        workdir = Path(tmp)
        # Every log before the session runs a job: at 10M, generating one beside a JVM
        # grown by a history's runs outgrew this 24 GB machine.
        raws = {events: _raw_days(events, workdir, day_lines) for events in sizes}
        spark = spark or build_session(BENCH_SPARK)
        histories = [_history(spark, events, raws[events], workdir, keep_fit, day_before,
                              groups) for events in sizes]
        timed = {h.events: [_incremental(spark, h, workdir, 1)] for h in histories}
        full = {h.events: _full(spark, h, workdir, keep_fit) for h in histories}
        for history in reversed(histories) if passes == 2 else ():
            timed[history.events].append(_incremental(spark, history, workdir, 2))
        runs: list[dict[str, Any]] = []
        for history in histories:
            done = timed[history.events]
            full_s, recomputed = full[history.events]
            compared = {table: [_compare(result.output / table, recomputed.output / table)
                                for _, result, _ in done] for table in tables}
            incremental_s = sum(seconds for seconds, _, _ in done) / len(done)
            profiled = {}
            if event_log is not None:
                window = done[0][2]
                profiled["spark_stages"] = [
                    s for s in stage_times(event_log)
                    if window[0] <= s["submitted_ms"] <= window[1]][:PROFILE_TOP]
            runs.append({
                "events": history.events, "new_day_rows": history.new_lines,
                "incremental_s": round(incremental_s, 2),
                "incremental_runs_s": [round(seconds, 2) for seconds, _, _ in done],
                "full_recompute_s": round(full_s, 2),
                "incremental_vs_full": round(incremental_s / full_s, 3),
                "incremental_s_per_new_event": incremental_s / history.new_lines,
                "outputs_equal": {table: not any(found) for table, found in compared.items()},
                "outputs_differences": {table: found for table, found in compared.items()
                                        if any(found)},
                "stages_s": [result.metadata["timings_s"] for _, result, _ in done],
                **profiled})
    smallest = runs[0]
    for entry in runs:
        entry["cost_per_new_event_vs_smallest"] = round(
            entry["incremental_s_per_new_event"] / smallest["incremental_s_per_new_event"], 2)
        # With --day-lines, the same new day on a longer history: what the history costs.
        entry["incremental_s_vs_smallest"] = round(
            entry["incremental_s"] / smallest["incremental_s"], 2)
    return {"benchmark": "etl --incremental" + (" --keep-fit" if keep_fit else "")
                         + (f" --day-lines {day_lines}" if day_lines else "")
                         + (f" --aggregations {spec.name}" if spec else ""),
            "machine": {"platform": platform.platform(), "python": platform.python_version(),
                        "spark_master": spark.sparkContext.master, "spark": spark.version},
            "order": "A B, full runs, B A" if passes == 2 else "A B, full runs",
            "runs": runs}


def run(sizes: list[int], spark: SparkSession | None = None,
        event_log: Path | None = None) -> dict[str, Any]:
    """``event_log``: the folder of the session's event log, whose slowest Spark stages are
    listed per size (``--profile``)."""
    spark = spark or build_session(BENCH_SPARK)
    runs = []
    seen: set[int] = set()
    with tempfile.TemporaryDirectory(prefix="bench-etl-") as tmp:
        for events in sizes:
            runs.append(measure(spark, events, Path(tmp)))
            if event_log is not None:
                stages = [s for s in stage_times(event_log) if s["stage_id"] not in seen]
                seen.update(s["stage_id"] for s in stages)
                runs[-1]["spark_stages"] = stages[:PROFILE_TOP]
    smallest = runs[0]
    for entry in runs:
        per_event = entry["job_s"] / entry["events"]
        entry["cost_per_event_vs_smallest"] = round(
            per_event / (smallest["job_s"] / smallest["events"]), 2)
    return {
        "benchmark": "etl",
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "spark_master": spark.sparkContext.master, "spark": spark.version},
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,10000000",
                        help="comma-separated event counts")
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    parser.add_argument("--incremental", action="store_true",
                        help="a new day's incremental run against a full recompute")
    parser.add_argument("--keep-fit", action="store_true",
                        help="with --incremental: the runs keep the history's fit "
                        "(etl.fit.refit_every), the full one transforms with it (--fit-from)")
    parser.add_argument("--day-lines", type=int, default=None,
                        help="with --incremental: the new day holds this many lines of the "
                             "last day at every size (the same day on a longer history)")
    parser.add_argument("--profile", action="store_true",
                        help=f"list each size's (with --aggregations: each run's) "
                             f"{PROFILE_TOP} slowest Spark stages, with the stage of the job "
                             "that ran each (from an event log)")
    parser.add_argument("--aggregations", nargs="?", const=str(AGGREGATIONS), default=None,
                        metavar="SPEC", help="the job without and with an aggregations spec "
                                             "(default benchmarks/aggregations.yaml); with "
                                             "--incremental: every run computes it")
    parser.add_argument("--spec-change", action="store_true",
                        help="a full run with the aggregations spec (--aggregations SPEC, "
                             "default benchmarks/aggregations.yaml), then the backfill of one "
                             "output added to it and of one removed")
    parser.add_argument("--checks", action="store_true",
                        help="the job without and with its profile stage (the validation "
                             "gate), interleaved: without, with, with, without")
    parser.add_argument("--order", default="ABBA", choices=["ABBA", "AB"],
                        help="with --label-join: the runs' order")
    parser.add_argument("--model-inputs", action="store_true",
                        help="the job without and with the model inputs' groups' tiles, "
                             "interleaved: without, with, with, without")
    parser.add_argument("--attributes", action="store_true",
                        help="the job with the items' attributes in the log, from a file, and "
                             "from a file with valid_from, interleaved: A B C C B A")
    parser.add_argument("--label-join", action="store_true",
                        help="the job with the per-event label rule and with the default "
                             "label join, interleaved: per-event, join, join, per-event")
    args = parser.parse_args(argv)
    sizes = [20_000, 40_000] if args.smoke else [int(s) for s in args.sizes.split(",")]
    if args.label_join:
        spark = build_session(BENCH_SPARK)
        with tempfile.TemporaryDirectory(prefix="bench-etl-label-join-") as tmp:
            print(json.dumps({"benchmark": "etl_label_join", "machine": {
                "platform": platform.platform(), "spark": spark.version},
                "runs": [measure_label_join(spark, events, Path(tmp),
                                            ABBA if args.order == "ABBA" else ABBA[:2])
                         for events in sizes]},
                indent=2))
        return
    if args.checks:
        print(json.dumps(run_checks(sizes), indent=2))
        return
    if args.spec_change:
        print(json.dumps(run_spec_change(sizes, Path(args.aggregations or AGGREGATIONS)),
                         indent=2))
        return
    if args.attributes:
        spark = build_session(BENCH_SPARK)
        with tempfile.TemporaryDirectory(prefix="bench-etl-attributes-") as tmp:
            print(json.dumps({"benchmark": "etl_attributes", "machine": {
                "platform": platform.platform(), "spark": spark.version},
                "runs": [measure_attributes(spark, events, Path(tmp)) for events in sizes]},
                indent=2))
        return
    if args.model_inputs:
        spark = build_session(BENCH_SPARK)
        with tempfile.TemporaryDirectory(prefix="bench-etl-model-inputs-") as tmp:
            print(json.dumps({"benchmark": "etl_model_inputs", "machine": {
                "platform": platform.platform(), "spark": spark.version},
                "runs": [measure_model_inputs(spark, events, Path(tmp)) for events in sizes]},
                indent=2))
        return
    spec = Path(args.aggregations) if args.aggregations else None
    if args.aggregations and not args.profile and not args.incremental:
        print(json.dumps(run_aggregations(sizes, Path(args.aggregations)), indent=2))
        return
    if not args.profile:
        print(json.dumps(run_incremental(sizes, keep_fit=args.keep_fit,
                                         day_lines=args.day_lines, spec=spec)
                         if args.incremental else run(sizes), indent=2))
        return
    with tempfile.TemporaryDirectory(prefix="bench-etl-events-") as event_log:
        spark = build_session(_profiled(BENCH_SPARK, Path(event_log)))
        try:
            if args.incremental:
                report = run_incremental(sizes, spark, args.keep_fit, args.day_lines,
                                         Path(event_log), spec=spec)
            elif args.aggregations:
                report = run_aggregations(sizes, Path(args.aggregations), spark,
                                          event_log=Path(event_log))
            else:
                report = run(sizes, spark, Path(event_log))
            print(json.dumps(report, indent=2))
        finally:
            spark.stop()  # closes the log before its folder goes


if __name__ == "__main__":
    main()
