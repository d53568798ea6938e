"""The ETL job as the command line runs it (``etl run``, ``etl qualify``, ``etl gpu-check``,
spark-submit's ``etl/main.py``, the demo): the configuration with the flags applied, checks
that need no Spark, the session, the job; and the account of a finished run.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from featureline.core.aggregations import GroupSpec
from featureline.core.derive import DeriveSpec
from featureline.core.drift import REPORT_FILE, Breach
from featureline.core.metadata import Metadata, present
from featureline.serving import config_path

if TYPE_CHECKING:
    from featureline.etl.config import EtlConfig


def progress(message: str) -> None:
    """A timestamped progress line on stderr."""
    click.echo(f"[{time.strftime('%H:%M:%S')}] {message}", err=True)


def _split_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


@dataclass(frozen=True)
class FinishedRun:
    """A finished ETL run: where its output is, and its metadata."""

    output: Path
    metadata: Metadata


def loaded_config(path: str | None = None, input_path: str | None = None,
                  input_format: str | None = None, output: str | None = None,
                  profile: str | None = None, label: str | None = None,
                  categorical: str | None = None, continuous: str | None = None,
                  vocabulary_from: str | None = None, refit_vocabularies: bool = False,
                  fit_from: str | None = None, refit: bool = False,
                  valid_days: int | None = None, incremental: bool = False) -> EtlConfig:
    """The ETL's configuration with the flags applied, every key checked."""
    from featureline.config import load_config
    from featureline.etl.incremental import dated

    return load_config(config_path(path), etl_flags=dict(
        input_path=dated(input_path) if input_path else None, input_format=input_format,
        output=output, profile=profile, label=label, categorical=_split_list(categorical),
        continuous=_split_list(continuous), vocabulary_from=vocabulary_from,
        refit_vocabularies=refit_vocabularies, fit_from=fit_from, refit=refit,
        valid_days=valid_days, incremental=incremental)).etl


def check_before_spark(config: EtlConfig, *, submitted: bool = False) -> None:
    """What a run checks before Spark starts (``featureline etl check`` too): the Spark
    settings (the profile, the RAPIDS jar), then the input files against the configuration
    (they exist; they hold the columns it maps)."""
    from featureline.etl.session import spark_properties
    from featureline.etl.source_files import check_config_files

    spark_properties(config.spark, from_profile=not submitted)
    check_config_files(config)


def run_job(path: str | None = None, input_path: str | None = None,
            input_format: str | None = None, output: str | None = None,
            profile: str | None = None, label: str | None = None,
            categorical: str | None = None, continuous: str | None = None,
            vocabulary_from: str | None = None, refit_vocabularies: bool = False,
            fit_from: str | None = None, refit: bool = False, valid_days: int | None = None,
            incremental: bool = False, *,
            submitted: bool = False, properties: dict[str, str] | None = None,
            aggregations: list[GroupSpec] | None = None,
            derive: list[DeriveSpec] | None = None) -> FinishedRun:
    """Load the configuration, apply the flags, start Spark and run the job; its output and
    metadata.

    ``submitted``: running under spark-submit, which has applied the properties file;
    ``aggregations``, ``derive``: a spec in place of the configuration's.
    """
    config = loaded_config(path, input_path, input_format, output, profile, label, categorical,
                           continuous, vocabulary_from, refit_vocabularies, fit_from, refit,
                           valid_days, incremental)
    if aggregations is not None or derive is not None:
        from featureline.etl.config import check_aggregations, check_derive

        config = config.model_copy(update={
            "aggregations": config.aggregations if aggregations is None else aggregations,
            "derive": config.derive if derive is None else derive})
        check_aggregations(config)
        check_derive(config)
    if properties:
        settings = config.spark.model_copy(
            update={"properties": {**config.spark.properties, **properties}})
        config = config.model_copy(update={"spark": settings})
    from featureline.etl import job
    from featureline.etl.session import build_session

    check_before_spark(config, submitted=submitted)

    spark = build_session(config.spark, from_profile=not submitted)
    if config.mode == "incremental":
        from featureline.etl.spec_change import run_incremental

        result = run_incremental(config, spark, progress)
    else:
        result = job.run(config, spark, progress=progress)
    return FinishedRun(Path(result.output),
                       Metadata.parse(result.metadata, str(result.output)))


def backfill(path: str | None = None, output: str | None = None, profile: str | None = None
             ) -> FinishedRun | None:
    """Bring an output to the configuration's ``aggregations:`` and ``derive:`` without new
    events: the new and changed outputs computed over its stored events, the removed ones
    dropped (None: its spec is the configuration's already)."""
    from featureline.etl.incremental import check_compatible, read_state
    from featureline.etl.outputs import local_path
    from featureline.etl.session import build_session, spark_properties
    from featureline.etl.spec_change import backfill as backfill_spec
    from featureline.etl.spec_change import spec_change

    config = loaded_config(path, output=output, profile=profile)
    folder = local_path(config.output.path)
    state = read_state(folder)
    change = spec_change(state, config)
    if change is None:  # decided from state.json, before Spark starts
        check_compatible(state, config, folder)  # names what else differs
        return None
    spark_properties(config.spark, from_profile=True)
    result = backfill_spec(config, build_session(config.spark, from_profile=True), state,
                           change, progress)
    return FinishedRun(Path(result.output), Metadata.parse(result.metadata, str(result.output)))


def summary(run: FinishedRun) -> str:
    """A human-readable account of a finished run."""
    metadata = run.metadata
    rows = present(metadata.rows, metadata, "rows")
    quarantined = {k: v for k, v in rows.quarantined.items() if v}
    lines = [
        f"rows: read {rows.read:,} = accepted {rows.accepted:,} + duplicates "
        f"{rows.duplicates:,} + quarantined {sum(quarantined.values()):,}",
    ]
    lines += [f"  quarantined {reason}: {count:,}" for reason, count in quarantined.items()]
    if rows.label_join is not None:
        joined = rows.label_join
        lines.append(f"events: accepted {rows.accepted:,} = examples {joined['examples']:,} + "
                     f"positives {joined['positives']:,} + held open {joined['held_open']:,} "
                     f"+ other {joined['other']:,}")
    split = present(metadata.split, metadata, "split")
    lines.append(f"split: train {split.rows['train']:,}, valid {split.rows['valid']:,} "
                 f"(valid from {split.valid_from})")
    dataset = metadata.dataset
    if dataset is not None:
        start = (f"extend those of {dataset.extends}" if dataset.extends
                 else "start a new lineage")
        lines.append(f"dataset {dataset.version}: vocabularies {start}")
    lines.append("categorical features (cardinality, embedding width):")
    lines += [f"  {name}: {entry.cardinality:,} x {entry.width}"
              + (f" (shares {entry.shares})" if entry.shares else "")
              for name, entry in present(metadata.embedding_plan, metadata,
                                         "embedding_plan").features.items()]
    tables = ", ".join(f"{name}/" for name in metadata.outputs)
    lines.append(f"features: {len(metadata.features)}; tables: {tables}, metadata.json")
    if metadata.tfrecord is not None:
        section = metadata.tfrecord
        lines.append(f"tfrecord: {len(section.files)} files, prebatch "
                     f"{section.prebatch_size}, groups {', '.join(section.groups)}")
    checks = metadata.checks
    if checks is not None:
        if checks.reference is None:
            lines.append("checks: profile.json written; no reference to check against")
        elif checks.passed:
            lines.append(f"checks: PASSED against {checks.reference}")
        else:
            lines.append(f"checks: FAILED against {checks.reference} — publish refuses this "
                         "output (featureline validate OUTPUT; --accept-drift REASON):")
            lines += [f"  BREACH {Breach(**breach)}" for breach in checks.breaches]
        lines.append(f"  report: {(run.output / REPORT_FILE).resolve()}")
    timings = ", ".join(f"{k} {v:.1f}s" for k, v in metadata.timings_s.items())
    lines.append(f"time: {timings}")
    return "\n".join(lines)


def exit_if_refused(run: FinishedRun) -> None:
    """Exit 1 when the run's newest day failed the validation gate: its output is written
    (for `featureline validate` to show), and a daily chain stops before train and publish."""
    checks = run.metadata.checks
    if checks is not None and not checks.passed:
        sys.exit(1)
