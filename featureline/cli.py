"""The ``featureline`` command: datagen, the ETL job, publish and training sets, the embedded
Redis, the API, and the end-to-end demo.

Each stage's work is imported inside its command, so the CLI starts quickly and ``serve``
never loads the ETL's Spark code.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from featureline.core.errors import ConfigError, FeaturelineError
from featureline.core.metadata import present
from featureline.core.redis import REDIS_URL_ENV, redact
from featureline.etl.stages import INPUT_FORMATS
from featureline.etl_runs import exit_if_refused, progress, run_job, summary
from featureline.options import (
    config_option,
    data_option,
    job_options,
    output_option,
    profile_option,
)
from featureline.serving import CONFIG_ENV, DEFAULT_CONFIG, config_path

if TYPE_CHECKING:
    from featureline.config import FeaturelineConfig
    from featureline.feature_store.repo import FeatureRepo


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="featureline")
def main() -> None:
    """Featureline: interaction logs → model-ready features, served."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


@main.command()
@click.option("--events", type=click.IntRange(min=1), default=100_000, show_default=True)
@click.option("--users", type=click.IntRange(min=1), default=10_000, show_default=True)
@click.option("--items", type=click.IntRange(min=1), default=5_000, show_default=True)
@click.option("--days", type=click.IntRange(min=1), default=14, show_default=True)
@click.option("--out", "out", type=click.Path(dir_okay=False), required=True,
              help="File to write, e.g. data/raw/events.jsonl")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--bad-fraction", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Share of rows made bad, in every way the validator rejects.")
@click.option("--format", "fmt", type=click.Choice(INPUT_FORMATS),
              default="jsonl", show_default=True)
@click.option("--start", "first_day", metavar="DAY",
              help="The log's first UTC day: YYYY-MM-DD, or today-<N>d (default: 2026-01-05)")
@click.option("--shape", type=click.Choice(["retailrocket"]),
              help="Write the log in a public dataset's names (retailrocket: timestamp in "
                   "ms, visitorid, event, itemid, categoryid, price, device); no bad rows")
@click.option("--split-last-day", is_flag=True,
              help="With --shape: write the last UTC day apart, to <out>-<day> (the next "
                   "day of the same log)")
@click.option("--item-only", is_flag=True,
              help="Clicks depend on the item alone (users differ only in how much they do); "
                   "by default users also differ in what they like")
def datagen(events: int, users: int, items: int, days: int, out: str, seed: int,
            bad_fraction: float, fmt: str, first_day: str | None, shape: str | None,
            split_last_day: bool, item_only: bool) -> None:
    """Write a synthetic interaction log (Zipf popularity, sessions, a purchase funnel, users'
    taste)."""
    from featureline.etl.datagen import DEFAULT_START, TASTE, write_log

    if shape is not None and bad_fraction:
        raise click.BadParameter("a shaped log has no bad rows", param_hint="--bad-fraction")
    if split_last_day and shape is None:
        raise click.BadParameter("needs --shape", param_hint="--split-last-day")
    start = time.perf_counter()
    log = write_log(out, events=events, users=users, items=items, days=days, seed=seed,
                    bad_fraction=bad_fraction, fmt=fmt,  # type: ignore[arg-type]
                    start=DEFAULT_START if first_day is None else _day(first_day), shape=shape,
                    split_last_day=split_last_day, taste=None if item_only else TASTE)
    written: dict[str, object] = {"path": str(log.path), "rows": log.rows,
                                  "bad_rows": log.bad_rows}
    if log.last_day is not None:
        written.update(last_day=str(log.last_day), last_day_rows=log.last_day_rows)
    click.echo(json.dumps({**written, "seconds": round(time.perf_counter() - start, 2)}))


def _day(text: str) -> datetime:
    """``YYYY-MM-DD`` or ``today-<N>d``: that UTC day's midnight."""
    from datetime import timedelta

    today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    if text == "today":
        return today
    if text.startswith("today-") and text.endswith("d") and text[6:-1].isdigit():
        return today - timedelta(days=int(text[6:-1]))
    try:
        return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=timezone.utc)
    except ValueError:
        raise click.BadParameter(f"{text!r}: a day is YYYY-MM-DD or today-<N>d",
                                 param_hint="--start") from None


@main.group()
def etl() -> None:
    """The Spark ETL job."""


@etl.command("run")
@job_options
def etl_run(**options: str | None) -> None:
    """Run the ETL job (Spark local[*] by default); exit 1 when the run's newest day fails
    the validation gate (its output is written, and publish refuses it)."""
    run = run_job(**options, submitted=False)  # type: ignore[arg-type]
    click.echo(summary(run))
    exit_if_refused(run)


@etl.command("backfill")
@config_option
@output_option
@profile_option
def etl_backfill(path: str | None, output: str | None, profile: str | None) -> None:
    """Bring an output to the configuration's aggregations and derived features without new
    events: the new and changed ones computed over its stored events, the removed dropped,
    every other file kept. An incremental run does this first by itself."""
    from featureline.etl_runs import backfill

    run = backfill(path, output, profile)
    if run is None:
        click.echo("nothing to backfill: the output's aggregations and derived features are "
                   "the configuration's")
        return
    click.echo(summary(run))


@etl.command("check")
@job_options
def etl_check(**options: str | None) -> None:
    """Check the configuration and the input files against it, without Spark: every key, the
    files' columns (a wrong separator, a misspelt column); exit 2 naming the key or the file."""
    from featureline.etl_runs import check_before_spark, loaded_config

    config = loaded_config(**options)  # type: ignore[arg-type]
    check_before_spark(config)
    source = config.source
    click.echo(f"ok: {source.path} ({source.format}): user_id={source.columns.user_id!r}, "
               f"item_id={source.columns.item_id!r}, ts={source.columns.ts!r}, "
               f"event_type={source.columns.event_type!r}, value={source.columns.value!r}; "
               f"categorical {source.categorical}, continuous {source.continuous}; "
               f"label: {config.label}")


@etl.command("qualify")
@job_options
@click.option("--event-log", type=click.Path(exists=True),
              help="Qualify this event log (file or folder, e.g. from a cluster run) instead "
                   "of running the job")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON")
def etl_qualify(event_log: str | None, as_json: bool, **options: str | None) -> None:
    """Will the job run on the GPU? NVIDIA's Qualification tool on an event log of it.

    Without --event-log, runs the job (the same flags as `etl run`; its output goes to a
    temporary folder unless --output is given) with Spark event logging on."""
    import tempfile

    from featureline.etl.qualification import qualify, render
    from featureline.tools import qualification_classpath

    with tempfile.TemporaryDirectory(prefix="featureline-events-") as work:
        if event_log is None:
            events = Path(work) / "events"
            events.mkdir()
            if not options.get("output"):
                options["output"] = str(Path(work) / "output")
            run_job(**options, properties={  # type: ignore[arg-type]
                "spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri()})
            from pyspark.sql import SparkSession

            active = SparkSession.getActiveSession()
            if active is not None:
                active.stop()  # the event log is complete once the application ends
            event_log = str(events)
        report = qualify(qualification_classpath(), Path(event_log))
    click.echo(json.dumps(report, indent=2) if as_json else render(report))


@etl.command("checks-history")
@config_option
@data_option
@click.option("--days", type=click.IntRange(1), default=30, show_default=True,
              help="The output's last days to check, each against the days before it")
@click.option("--json", "as_json", is_flag=True, help="Print the days as JSON")
def etl_checks_history(path: str | None, data: str | None, days: int, as_json: bool) -> None:
    """Replay the validation gate over an output's last days: what the thresholds (checks:
    in featureline.yaml) would have said of each day against its window of days before."""
    from featureline.etl.checks_history import replay
    from featureline.etl.session import build_session, spark_properties

    config = _config(path).etl
    spark_properties(config.spark)
    checked = replay(build_session(config.spark), data or config.output.path, config,
                     config.checks, days)
    if as_json:
        click.echo(json.dumps([day.to_json() for day in checked], indent=2))
        return
    for day in checked:
        click.echo(f"{day.day}  {day.events:>9,} events  "
                   + ("PASSED" if not day.breaches else f"{len(day.breaches)} breach(es)"))
        click.echo("".join(f"    BREACH {b}\n" for b in day.breaches), nl=False)
    refused = sum(bool(day.breaches) for day in checked)
    click.echo(f"{refused} of {len(checked)} days would have been refused")


@etl.command("gpu-check")
@job_options
@click.option("--jar", type=click.Path(exists=True, dir_okay=False),
              help="The plugin jar (default: the pinned release, fetched with Maven into "
                   "~/.cache/featureline on first use)")
@click.option("--plan-log", type=click.Path(dir_okay=False),
              help="Keep the plugin's plan log (every query, node by node) in this file")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON")
def etl_gpu_check(jar: str | None, plan_log: str | None, as_json: bool,
                  **options: str | None) -> None:
    """Will every stage run on the GPU? The RAPIDS Accelerator plans the job (gpu profile)
    in explain-only mode, on this machine's CPU; exits 1 if anything is off the GPU.

    The same flags as `etl run`; the output goes to a temporary folder unless --output is
    given."""
    import tempfile

    from featureline.etl import gpu_plan
    from featureline.tools import plugin_jar

    if options.get("profile") not in (None, "gpu"):
        raise click.UsageError("gpu-check plans the local gpu profile; drop --profile")
    os.environ["RAPIDS_JAR"] = jar or str(plugin_jar())
    with tempfile.TemporaryDirectory(prefix="featureline-gpu-plan-") as work:
        log = Path(plan_log) if plan_log else Path(work) / "plan.log"
        options["output"] = options.get("output") or str(Path(work) / "output")
        metadata = run_job(**{**options, "profile": "gpu"},  # type: ignore[arg-type]
                           properties=gpu_plan.explain_properties(log, Path(work))).metadata
        report = gpu_plan.report(log, present(metadata.source, metadata, "source").format)
    click.echo(json.dumps(report, indent=2) if as_json else gpu_plan.render(report))
    if report["off_gpu"]:
        sys.exit(1)


@main.command()
@click.option("--out", default="data/demo", show_default=True, type=click.Path(file_okay=False))
@click.option("--events", type=click.IntRange(min=1000), default=200_000, show_default=True)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option("--config", "path", type=click.Path(dir_okay=False),
              help=f"YAML configuration of the publish and serve steps (default: "
                   f"./{DEFAULT_CONFIG})")
@click.option("--serve/--no-serve", default=True, show_default=True,
              help="End by starting the API in the background and calling each endpoint.")
def demo(out: str, events: int, seed: int, path: str | None, serve: bool) -> None:
    """Generate a sample log and run the whole pipeline on embedded defaults."""
    from datetime import timedelta

    from featureline.config import load_config
    from featureline.etl.datagen import TASTE, write_log

    started = time.perf_counter()
    from featureline.demo import demo_repo, stop_server

    # A previous demo's API and stream processor stop first: the processor would write the
    # events it streamed over this run's publication.
    stop_server(Path(out) / "api.pid")
    config = demo_repo(load_config(config_path(path)), Path(out), click.echo)
    raw = Path(out) / "raw" / "events.jsonl"
    output = Path(out) / "output"
    steps = 6 if serve else 3
    # The last 14 days, so that the online store's values are within their ttl today.
    today = _day("today")
    progress(f"[1/{steps}] datagen: {events:,} events (1% bad rows) → {raw}")
    write_log(raw, events=events, users=max(100, events // 40), items=max(50, events // 100),
              days=14, seed=seed, bad_fraction=0.01, start=today - timedelta(days=14),
              taste=TASTE)
    next_day = None
    if serve:  # the last day is the next day's run's (step 6)
        from featureline.next_day import hold_out

        next_day = hold_out(raw)
        click.echo(f"the last day, {next_day.day}, held back for the next day's run: "
                   f"{next_day.path}")
    progress(f"[2/{steps}] etl: local Spark job")
    from featureline.demo import demo_features

    run = run_job(input_path=str(raw), input_format="jsonl", output=str(output),
                  **demo_features(config))
    click.echo(summary(run))
    click.echo(f"output: {output}  (metadata.json describes every table)")
    progress(f"[3/{steps}] publish: Feast apply, then the latest snapshots into Redis")
    from featureline.demo import publish_demo, serve_demo, show_lift, train_tables

    redis_url = publish_demo(config, output, click.echo, progress)
    if serve:
        progress(f"[4/{steps}] train: the reference model on the TFRecords → embedding tables")
        hps = train_tables(output, Path(out) / "hps", click.echo, progress)
        show_lift(output, click.echo, progress)
        progress(f"[5/{steps}] serve: the trained tables → HPS, the API")
        base = serve_demo(config, output, Path(out), redis_url, click.echo, hps, next_day)
        assert next_day is not None
        # The day's run extends a copy: the API keeps serving the output its model knows.
        extended = Path(out) / "next-day"
        shutil.rmtree(extended, ignore_errors=True)
        shutil.copytree(output, extended)
        progress(f"[6/{steps}] the next day: a copy of {output} extended by etl run "
                 f"--incremental --input {next_day.path} --output {extended}")
        from featureline.next_day import show_rows

        run = run_job(input_path=str(next_day.path), output=str(extended), incremental=True,
                      **demo_features(config))
        click.echo(summary(run))
        show_rows(next_day, extended, click.echo)
        click.echo(f"the API is running at {base} with authentication OFF (local use only; "
                   f"{Path(out) / 'featureline.yaml'}: api.auth.enabled: false); "
                   f"stop it with: kill $(cat {Path(out) / 'api.pid'})")
    click.echo(f"demo finished in {time.perf_counter() - started:.1f}s")


def _config(path: str | None) -> FeaturelineConfig:
    from featureline.config import load_config  # the ETL's settings, which import Spark code

    return load_config(config_path(path))


def _repo(path: str | None, data: str | None) -> FeatureRepo:
    """The Feast repository over ``--data`` (default: the configuration's ETL output)."""
    from featureline.feature_store.repo import open_repo

    config = _config(path)
    return open_repo(config.feature_store, data or config.etl.output.path)


@main.command()
@config_option
@data_option
@click.argument("group")
@click.argument("key", nargs=-1, required=True)
@click.option("--at", help="The time, ISO 8601 (UTC without an offset) or epoch seconds; "
                           "default: now. Not before the output's last event")
@click.option("--json", "as_json", is_flag=True, help="Print the values as JSON")
def aggregations(path: str | None, data: str | None, group: str, key: tuple[str, ...],
                 at: str | None, as_json: bool) -> None:
    """A key's aggregation values at a time (GROUP, then a value per key column), merged
    from an ETL output's tiles: the rule of time's values after the output's last event."""
    from featureline.core.aggregations import MICROS
    from featureline.core.events import micros_of, parse_timestamp
    from featureline.core.metadata import read_metadata
    from featureline.feature_store.tiles import read_tiles

    config = _config(path)
    spec = next((g for g in config.aggregations if g.name == group), None)
    if spec is None:
        raise ConfigError("GROUP", f"{group!r} is not a group of the aggregations spec "
                                   f"(it has {[g.name for g in config.aggregations]})")
    if len(key) != len(spec.keys):
        raise ConfigError("KEY", f"{group} is keyed by {spec.keys}: give {len(spec.keys)} "
                                 f"value(s), got {len(key)}")
    # Read as the ETL reads an event's ts: ISO 8601 (UTC without an offset) or epoch.
    moment = parse_timestamp(at, "auto") if at else datetime.now(timezone.utc)
    if moment is None:
        raise ConfigError("--at", f"{at!r} is not an ISO 8601 time or epoch seconds")
    t = micros_of(moment)
    tiles = read_tiles(read_metadata(data or config.etl.output.path), [spec], key=key)
    if t < tiles.cut_us:
        cut = datetime.fromtimestamp(tiles.cut_us / MICROS, timezone.utc)
        raise ConfigError("--at", f"{moment.isoformat()} is before the output's last event "
                                  f"({cut.isoformat()}): the tiles hold every event up to it")
    values = tiles.values_at(group, key, t)
    if as_json:
        click.echo(json.dumps({"group": group, "key": list(key), "at": moment.isoformat(),
                               "values": values}, indent=2))
        return
    click.echo(f"{group} {list(key)} at {moment.isoformat()}")
    for name, value in values.items():
        click.echo(f"  {group}:{name}  {value}")


@main.command()
@config_option
@click.argument("output", type=click.Path(file_okay=False))
@click.option("--reference", type=click.Path(file_okay=False),
              help="The output to check against (default: the reference the run was checked "
                   "against, kept in OUTPUT)")
@click.option("--json", "as_json", is_flag=True, help="Print the breaches as JSON")
@click.option("--report", type=click.Path(dir_okay=False),
              help="Also write the HTML report of this check here")
@click.option("--metrics-file", type=click.Path(dir_okay=False),
              help="Also write the checks' metrics in Prometheus' text format here")
def validate(path: str | None, output: str, reference: str | None, as_json: bool,
             report: str | None, metrics_file: str | None) -> None:
    """Check an ETL output's profile against a reference's; exit 1 on any breach. The verdict
    is recorded in OUTPUT: publish enforces the latest."""
    import time

    from featureline.core.drift import (
        PROFILE_FILE,
        REFERENCE_PROFILE_FILE,
        REPORT_FILE,
        measure,
        prometheus,
        read_profile,
        record_verdict,
        verdict,
    )
    from featureline.core.drift_report import render
    from featureline.core.drift_window import pinned_days, pooled, window
    from featureline.core.files import write_whole
    from featureline.core.metadata import read_metadata

    config = _config(path).checks
    profile = read_profile(output)
    if profile is None:
        raise ConfigError("OUTPUT", f"{Path(output) / PROFILE_FILE}: no profile (not an ETL "
                                    "output, or one written before the validation gate)")
    against: dict[str, Any] | None
    if reference is not None:
        days = window(pinned_days(reference), config.reference_days)
        if not days:
            raise ConfigError("--reference", f"{Path(reference) / PROFILE_FILE}: no profile")
        against = pooled(days)
    else:
        against = read_profile(output, REFERENCE_PROFILE_FILE)
    measurements = measure(profile, against, config)
    breaches = [m.breach() for m in measurements if m.breached]
    source = reference or (f"the reference kept in {output}" if against else None)
    # The verdict stands on OUTPUT, over its run's: publish enforces the latest.
    record_verdict(output, verdict(breaches, source), read_metadata(output).dataset_version)
    if report:
        page = render(profile, against, measurements, config, output=output,
                      reference_name=source)
        write_whole(Path(report), lambda file: file.write_text(page))
    if metrics_file:
        text = prometheus(measurements, profile, compared=against is not None,
                          run_at=time.time())
        write_whole(Path(metrics_file), lambda file: file.write_text(text))
    if as_json:
        click.echo(json.dumps({"passed": not breaches, "day": profile["day"],
                               "breaches": [b.to_json() for b in breaches]}, indent=2))
    else:
        click.echo(f"{output}: day {profile['day']}, {profile['day_events']:,} events; "
                   + (f"checked against {source}" if source else
                      "no reference (declared ranges only)"))
        click.echo("\n".join(f"  BREACH {b}" for b in breaches) or "  PASSED: no breach")
        click.echo(f"  report: {Path(report or Path(output) / REPORT_FILE).resolve()}")
    if breaches:
        sys.exit(1)


@main.command()
@config_option
@data_option
@click.option("--full", is_flag=True, help="Materialize every snapshot again, not only new ones.")
@click.option("--end", type=click.DateTime(),
              help="Materialize up to this UTC time (default: now).")
@click.option("--spark", "with_spark", is_flag=True,
              help="Write from Spark tasks, each its partitions' entities (etl.spark "
                   "settings; for entity tables beyond one process)")
@click.option("--repair", is_flag=True,
              help="Only if the online store lost its data (no publication stamp: its Redis "
                   "restarted empty): publish the served dataset (api.data, else the ETL "
                   "output) whole again; else change nothing")
@click.option("--accept-drift", "accept_drift", metavar="REASON",
              help="Publish an output that failed the validation gate, for this reason "
                   "(recorded in the output's accepted_drift.jsonl)")
def publish(path: str | None, data: str | None, full: bool, end: datetime | None,
            with_spark: bool, repair: bool, accept_drift: str | None) -> None:
    """Register the feature views with Feast and write them into Redis."""
    from featureline.feature_store.online_store import open_online_store
    from featureline.feature_store.publish import publish as run_publish

    # The repair republishes what the API serves (api.data, else the ETL output).
    repo = _repo(path, data or (_config(path).api.data if repair else None))
    progress(f"online store {redact(repo.redis_url)}")
    if repair:
        store = open_online_store(repo.settings.redis_type, repo.redis_url)
        try:
            publication = store.publication(repo.store.project)
        finally:
            store.close()
        if publication is not None:
            click.echo(json.dumps({"repaired": False,
                                   "dataset_version": publication.dataset_version}))
            return
        progress("the online store holds no published dataset: publishing it whole again")
        full = True
    spark = None
    if with_spark:
        from featureline.etl.session import build_session

        spark = build_session(_config(path).etl.spark)
    summary = run_publish(repo, full=full, progress=progress, spark=spark,
                          end=end.replace(tzinfo=timezone.utc) if end else None,
                          accept_drift=accept_drift)
    click.echo(json.dumps({**summary.to_json(), **({"repaired": True} if repair else {})}))


@main.command()
@config_option
@data_option
@click.option("--out", type=click.Path(file_okay=False), default="data/hps", show_default=True,
              help="Where the embedding tables, hps.yaml, model.keras and training.json go")
@click.option("--epochs", type=click.IntRange(min=1), default=10, show_default=True,
              help="At most this many passes over the training split")
@click.option("--patience", type=click.IntRange(min=0), default=2, show_default=True,
              help="Stop once the validation AUC has not improved for this many epochs; the "
                   "best epoch's weights are kept either way")
@click.option("--batch-size", type=click.IntRange(min=1), default=2048, show_default=True)
@click.option("--learning-rate", type=click.FloatRange(min=0, min_open=True), default=1e-3,
              show_default=True)
@click.option("--model-name", default="ranker", show_default=True,
              help="The model name in hps.yaml (what the API's ranking call reads)")
@click.option("--hps-template", type=click.Path(exists=True, dir_okay=False),
              help="A deployment's hps.yaml (or ps.json) whose settings the written hps.yaml "
                   "keeps, with this model's tables replaced by the exported ones")
def train(path: str | None, data: str | None, out: str, epochs: int, patience: int,
          batch_size: int, learning_rate: float, model_name: str,
          hps_template: str | None) -> None:
    """Train the reference ranking model on the ETL's TFRecords and export its embedding
    tables for the parameter server (needs TensorFlow: the [tf] extra)."""
    try:
        from featureline.trainer.train import train as run_train
    except ImportError as exc:
        raise click.ClickException(f"featureline train needs TensorFlow ({exc.name} is not "
                                   "installed): pip install 'featureline[tf]'") from None
    result = run_train(data or _config(path).etl.output.path, out, epochs=epochs,
                       patience=patience, batch_size=batch_size, learning_rate=learning_rate,
                       model_name=model_name, hps_template=hps_template,
                       progress=progress)
    click.echo(result.summary())


@main.command()
@config_option
@data_option
@click.option("--without", "names", required=True, metavar="NAME[,NAME...]",
              help="The features to leave out: metadata.json's names "
                   "(user_prior_positive_rate) or an aggregation's group:output")
@click.option("--seeds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Train each side this many times, with seeds 0, 1, ...")
@click.option("--epochs", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--patience", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=2048, show_default=True)
@click.option("--no-gbdt", is_flag=True, help="The reference model only")
@click.option("--out", type=click.Path(dir_okay=False), help="Also write the report as JSON")
def lift(path: str | None, data: str | None, names: str, seeds: int, epochs: int,
         patience: int, batch_size: int, no_gbdt: bool, out: str | None) -> None:
    """Whether features help: the reference model and the trees trained with and without
    them on the same split, per seed; the validation AUC and log-loss differences."""
    try:
        from featureline.trainer.lift import lift as run_lift
    except ImportError as exc:
        raise click.ClickException(f"featureline lift needs TensorFlow ({exc.name} is not "
                                   "installed): pip install 'featureline[tf]'") from None
    result = run_lift(data or _config(path).etl.output.path,
                      [n.strip() for n in names.split(",") if n.strip()],
                      seeds=range(seeds), epochs=epochs, patience=patience,
                      batch_size=batch_size, gbdt=not no_gbdt, progress=progress)
    if out is not None:
        Path(out).write_text(json.dumps(result.to_json(), indent=2))
    click.echo(result.summary())


@main.command()
@config_option
@data_option
@click.option("--model", "model_dir", type=click.Path(exists=True, file_okay=False),
              default="data/hps", show_default=True,
              help="Where `featureline train` exported the model (hps.yaml, dense.json)")
@click.option("--split", type=click.Choice(["train", "valid"]), default="valid",
              show_default=True)
@click.option("--out", type=click.Path(dir_okay=False),
              help="The Parquet file to write (default: <model>/scores-<split>.parquet)")
@click.option("--model-name", help="Which exported model: its dense part by default, "
                                   "<name>-gbdt for the gradient-boosted trees")
def score(path: str | None, data: str | None, model_dir: str, split: str,
          out: str | None, model_name: str | None) -> None:
    """Score an ETL output's examples with an exported model, as /v1/rank scores a request:
    the examples' keys, labels and each one's score, as Parquet."""
    from featureline.trainer.score import write_scores

    target = out or str(Path(model_dir) / f"scores-{split}.parquet")
    rows = write_scores(data or _config(path).etl.output.path, model_dir, target, split,
                        model_name)
    click.echo(f"scored {rows:,} {split} examples → {target}")


@main.command()
@config_option
@data_option
@click.argument("candidate", type=click.Path(exists=True, file_okay=False))
@click.option("--served", type=click.Path(file_okay=False),
              help="The link to the served model's folder (default: the folder of api.hps)")
@click.option("--force", metavar="REASON",
              help="Promote whatever the gate finds; the reason is recorded in gate.json")
@click.option("--keep", type=click.IntRange(min=1),
              help="Then delete all but the newest KEEP model folders beside CANDIDATE "
                   "(never the served one)")
def promote(path: str | None, data: str | None, candidate: str, served: str | None,
            force: str | None, keep: int | None) -> None:
    """Serve a trained model only when it is not worse than the served one: each of its
    models (the dense part, the trees) and the served one of its name scored on the ETL
    output's validation day (the quality gate, trainer.gate). Exits 1 when one is refused;
    the served models are left as they were."""
    from featureline.trainer.quality import promote as run_promote

    config = _config(path)
    if served is None and not config.api.hps:
        raise ConfigError("api.hps", "no served model to compare with: set api.hps or --served")
    link = served or str(Path(str(config.api.hps)).parent)
    verdicts = run_promote(data or config.etl.output.path, candidate, link,
                           config.trainer.gate, force=force, keep=keep)
    for verdict in verdicts:
        click.echo(verdict.summary())
    if not all(verdict.promoted for verdict in verdicts):
        click.echo(f"{link} still serves {Path(link).resolve()}")
        sys.exit(1)
    click.echo(f"{link} serves {candidate}")


@main.command("training-set")
@config_option
@data_option
@click.option("--entities", "entity_rows", type=click.Path(),
              help="Parquet of join keys (user_id, item_id), event_timestamp and any labels")
@click.option("--from-log", "from_log", type=click.Path(),
              help="Instead: the API's feature log; the served values, labelled from the "
                   "output's examples")
@click.option("--label-window", type=click.FloatRange(min=0, min_open=True), default=86_400.0,
              show_default=True, help="With --from-log: seconds after a request in which its "
                                      "(user, item) example labels it")
@click.option("--service", default="training", show_default=True, help="Feast feature service")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Parquet to write")
def training_set(path: str | None, data: str | None, entity_rows: str | None,
                 from_log: str | None, label_window: float, service: str, out: str) -> None:
    """Join point-in-time correct features onto entity rows (every row comes back), or build
    a training set of the served values (--from-log)."""
    from featureline.feature_store.training_set import training_set as run_training_set
    from featureline.feature_store.training_set import training_set_from_log

    if (entity_rows is None) == (from_log is None):
        raise click.UsageError("give exactly one of --entities and --from-log")
    started = time.perf_counter()
    if from_log is not None:
        summary = training_set_from_log(from_log, data or _config(path).etl.output.path, out,
                                        label_window)
    else:
        assert entity_rows is not None
        summary = run_training_set(_repo(path, data), entity_rows, service, out)
    click.echo(json.dumps({**summary.to_json(),
                           "seconds": round(time.perf_counter() - started, 2)}))


@main.command()
@config_option
@data_option
@click.option("--log", "log", type=click.Path(),
              help="Feature log folder or file (default: api.feature_logging.path)")
@click.option("--max-mismatch", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Exit 1 when a feature's mismatch ratio is above this")
@click.option("--top", type=click.IntRange(0), default=5, show_default=True,
              help="Most differing entities listed per feature")
@click.option("--metrics-file", type=click.Path(dir_okay=False),
              help="Also write the report in Prometheus' text format here (textfile collector)")
@click.option("--archive", type=click.Path(file_okay=False),
              help="The stream processor's archive, to compare the rows it wrote (default: "
                   "stream.archive, where that folder exists)")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON")
def consistency(path: str | None, data: str | None, log: str | None, max_mismatch: float,
                top: int, metrics_file: str | None, archive: str | None,
                as_json: bool) -> None:
    """Compare what the API served (its feature log) with the ETL output, point in time."""
    from featureline.core.files import write_whole
    from featureline.core.metadata import read_metadata
    from featureline.served import check_served
    from featureline.stream.expected import ArchivedStream

    config = _config(path)
    log = log or config.api.feature_logging.path
    if log is None:
        raise click.UsageError("give --log (or set api.feature_logging.path)")
    output = data or config.etl.output.path
    if (archive is None and Path(config.stream.archive).is_dir()
            and read_metadata(output).events is not None):
        archive = config.stream.archive
    expected = ArchivedStream(archive, output) if archive else None
    report = check_served(log, output, config.feature_store, max_mismatch=max_mismatch,
                          top=top, expected=expected)
    if metrics_file:
        write_whole(Path(metrics_file), lambda file: file.write_text(report.prometheus()))
    click.echo(json.dumps(report.to_json(), default=str) if as_json else
               "\n".join(report.lines()))
    if not report.passed:
        sys.exit(1)


@main.group()
def redis() -> None:
    """The embedded Redis server (used when REDIS_URL is unset)."""


def _redis_dir(path: str | None) -> str:
    return _config(path).feature_store.redis_dir


@redis.command("start")
@config_option
@click.option("--port", type=click.IntRange(1, 65535),
              help="The port it listens on, on 127.0.0.1 (default: a free one)")
def redis_start(path: str | None, port: int | None) -> None:
    """Start the embedded server (or find it running) and print its URL."""
    from featureline.feature_store.redis_server import start_server

    click.echo(start_server(_redis_dir(path), port))


@redis.command("stop")
@config_option
def redis_stop(path: str | None) -> None:
    """Stop the embedded server, saving its data."""
    from featureline.feature_store.redis_server import stop_server

    click.echo("stopped" if stop_server(_redis_dir(path)) else "not running")


@redis.command("status")
@config_option
def redis_status(path: str | None) -> None:
    """Where the online store is: REDIS_URL, or the embedded server's state."""
    from featureline.feature_store.redis_server import server_status

    if os.environ.get(REDIS_URL_ENV):
        click.echo(json.dumps({"url": redact(os.environ[REDIS_URL_ENV]),
                               "source": REDIS_URL_ENV}))
        return
    status = server_status(_redis_dir(path))
    click.echo(json.dumps({**status, "source": "embedded"} if status else {"running": False}))
    if status is None:
        raise SystemExit(1)


@redis.command("env")
@config_option
def redis_env(path: str | None) -> None:
    """Shell exports for Feast's CLI: eval "$(featureline redis env)"."""
    from featureline.feature_store.redis_server import redis_url
    from featureline.feature_store.repo import CONNECTION_ENV, feast_connection_string

    config = _config(path)
    url = redis_url(config.feature_store.redis_dir)
    connection = feast_connection_string(url, config.feature_store.redis_type)
    click.echo(f"export {REDIS_URL_ENV}='{url}'\nexport {CONNECTION_ENV}='{connection}'")


@main.command()
@click.argument("names", nargs=-1)
@click.option("--into", type=click.Path(file_okay=False),
              help="Copy what NAMES fetched into this folder (a dataset's files)")
def fetch(names: tuple[str, ...], into: str | None) -> None:
    """Fetch the developer tools into ~/.cache/featureline at once (the RAPIDS plugin jar,
    Kafka, the Qualification tool, MovieLens 100K as our log and as RecBole's three files,
    promtool): what gpu-check, qualify, the benchmarks and the tests use; NAMES: only those.
    Exit 1 when one could not be fetched."""
    from featureline.tools import FETCHES, copy_fetched, fetch_all

    unknown = [name for name in names if name not in FETCHES]
    if unknown:
        raise click.BadParameter(f"{unknown[0]!r} (known: {', '.join(FETCHES)})",
                                 param_hint="NAMES")
    if into and not names:
        raise click.BadParameter("name what to copy", param_hint="--into")
    if not fetch_all(lambda line: click.echo(line, err=True), list(names) or None):
        raise SystemExit(1)
    if into:
        for name in names:
            for copied in copy_fetched(name, Path(into)):
                click.echo(copied)


@main.group()
def hps() -> None:
    """The parameter server's online update streams."""


@hps.command("trim-updates")
@config_option
@click.option("--hps", "hps_path", type=click.Path(dir_okay=False),
              help="The parameter server's hps.yaml or ps.json (default: api.hps)")
def hps_trim_updates(path: str | None, hps_path: str | None) -> None:
    """Remove from each model's update stream what its table sources already hold.

    Run it once every serving replica serves these sources (after a new export is rolled
    out): a replica on older sources replays from before them after a rebuild.
    """
    from featureline.hps.config import load_hps_config
    from featureline.hps.updates import trim

    hps_path = hps_path or _config(path).api.hps
    if hps_path is None:
        raise ConfigError("api.hps", "no parameter server is configured (or pass --hps)")
    click.echo(json.dumps({"removed": trim(load_hps_config(hps_path))}))


@main.command()
@config_option
@click.option("--host", help="Listen address (default: api.host)")
@click.option("--port", type=click.IntRange(1, 65535), help="Port (default: api.port)")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes (each opens its own Redis client and parameter server)")
@click.option("--stream/--no-stream", "with_stream", default=None,
              help="Also run the stream processor (default: when the event log is the "
                   "embedded Redis, i.e. REDIS_URL and stream.url unset)")
def serve(path: str | None, host: str | None, port: int | None, workers: int,
          with_stream: bool | None) -> None:
    """Serve the ranking API (online features, embeddings, ranking inputs, pushed events)."""
    import subprocess

    import uvicorn

    from featureline.api.settings import check_exposure
    from featureline.core.metadata import read_metadata
    from featureline.serving import load_serving_config

    file = config_path(path)
    config = load_serving_config(file)  # errors surface here, before any worker starts
    try:
        check_exposure(host or config.api.host, config.api.auth)
    except ValueError as exc:
        raise ConfigError("--host", str(exc)) from None
    read_metadata(config.data)  # the ETL output the API encodes ids with
    if config.api.hps is not None and not Path(config.api.hps).is_file():
        raise ConfigError("api.hps", f"{config.api.hps}: no such file (the parameter "
                                     "server's hps.yaml or ps.json)")
    if file is not None:
        os.environ[CONFIG_ENV] = str(file.resolve())
    if not config.api.auth.enabled:
        click.echo("warning: API authentication is off (api.auth.enabled: false); "
                   "for local use only", err=True)
    if with_stream is None:
        with_stream = not os.environ.get(REDIS_URL_ENV) and config.stream.url is None
    processor = None
    if with_stream:
        processor = subprocess.Popen([sys.executable, "-m", "featureline.cli", "stream",
                                      "--exit-with-parent",
                                      *(["--config", str(file)] if file else [])])
    try:
        uvicorn.run("featureline.serving:app_from_env", factory=True,
                    host=host or config.api.host, port=port or config.api.port,
                    workers=workers, log_level="warning")
    finally:
        if processor is not None:
            processor.terminate()
            processor.wait(timeout=30)


@main.command()
@config_option
@click.option("--consumer", help="This processor's name in the consumer group (default: "
                                 "host:pid; a restarted processor under its old name first "
                                 "re-reads what it had not committed)")
@click.option("--once", is_flag=True, help="Process what the log holds now, then exit")
@click.option("--exit-with-parent", is_flag=True, hidden=True,
              help="Stop when the process that started it is gone (serve's processor)")
def stream(path: str | None, consumer: str | None, once: bool, exit_with_parent: bool) -> None:
    """Turn pushed events into online features (docs/ARCHITECTURE.md, "Fresh features")."""
    import signal

    from featureline.stream.processor import open_processor

    config = _config(path)
    processor = open_processor(config.stream, config.feature_store,
                               config.api.data or config.etl.output.path, consumer=consumer)
    processor.refresh_base()
    # What startup loaded (the spec, the vocabularies' ids) stays: keep the collector from
    # walking it on every full collection, a fifth of the processor's CPU in a burst
    # (benchmarks/README.md, "The stream's bursts").
    gc.freeze()
    if once:
        while processor.process(processor.log.read(processor.consumer,
                                                   processor.read_batch, 0.1)):
            pass
        click.echo(json.dumps({"processed": processor.processed}))
        return
    signal.signal(signal.SIGTERM, lambda *_: processor.stop())
    if config.stream.metrics_port is not None:
        processor.metrics.serve(config.stream.metrics_port)
    click.echo(f"stream processor {processor.consumer}: {config.stream.log} "
               f"{redact(processor.log.url)} → online store", err=True)
    parent = os.getppid()
    with contextlib.suppress(KeyboardInterrupt):
        processor.run(orphaned=(lambda: os.getppid() != parent) if exit_with_parent else None)


def run_command(command: click.Command) -> None:
    """Run a click command; a typed Featureline error becomes one line and a hint, exit code 2
    for a usage or configuration error, 1 for a failure while running."""
    try:
        command(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except FeaturelineError as exc:
        click.echo(f"error: {exc}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        sys.exit(exc.exit_code)


def run() -> None:
    """The ``featureline`` console script."""
    run_command(main)


if __name__ == "__main__":
    run()
