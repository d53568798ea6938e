"""The ``featureline`` command: datagen, the ETL job, and the end-to-end demo."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import click

from etl.errors import FeaturelineError

DEFAULT_CONFIG = "featureline.yaml"


def _split_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def _progress(message: str) -> None:
    click.echo(f"[{time.strftime('%H:%M:%S')}] {message}", err=True)


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
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "parquet"]),
              default="jsonl", show_default=True)
def datagen(events: int, users: int, items: int, days: int, out: str, seed: int,
            bad_fraction: float, fmt: str) -> None:
    """Write a synthetic interaction log (Zipf popularity, sessions, a purchase funnel)."""
    from etl.datagen import write_log

    start = time.perf_counter()
    log = write_log(out, events=events, users=users, items=items, days=days, seed=seed,
                    bad_fraction=bad_fraction, fmt=fmt)  # type: ignore[arg-type]
    click.echo(json.dumps({"path": str(log.path), "rows": log.rows, "bad_rows": log.bad_rows,
                           "seconds": round(time.perf_counter() - start, 2)}))


@main.group()
def etl() -> None:
    """The Spark ETL job."""


def run_job(config_path: str | None = None, input_path: str | None = None,
            input_format: str | None = None, output: str | None = None,
            profile: str | None = None, label: str | None = None,
            categorical: str | None = None, continuous: str | None = None, *,
            submitted: bool = False) -> dict:
    """Load the configuration, apply the flags, start Spark and run the job; its metadata.

    ``submitted``: running under spark-submit, which has applied the properties file.
    """
    from etl.config import load_config, with_overrides

    if config_path is None and Path(DEFAULT_CONFIG).is_file():
        config_path = DEFAULT_CONFIG
    config = with_overrides(
        load_config(config_path).etl, input_path=input_path, input_format=input_format,
        output=output, profile=profile, label=label, categorical=_split_list(categorical),
        continuous=_split_list(continuous))
    from etl import job
    from etl.session import build_session

    spark = build_session(config.spark, from_profile=not submitted)
    return job.run(config, spark, progress=_progress).metadata


def job_options(command: click.Command) -> click.Command:
    options = [
        click.option("--config", "config_path", type=click.Path(dir_okay=False),
                     help=f"YAML configuration (default: ./{DEFAULT_CONFIG} if present)"),
        click.option("--input", "input_path", help="Raw log path or glob (overrides source.path)"),
        click.option("--format", "input_format", type=click.Choice(["jsonl", "csv", "parquet"]),
                     help="Raw log format (default: from the file suffix)"),
        click.option("--output", help="Output folder (overrides output.path)"),
        click.option("--profile", type=click.Choice(["cpu", "gpu", "k8s-cpu", "k8s-gpu"]),
                     help="Spark profile: spark_conf/<profile>.conf"),
        click.option("--label", help="Label rule, e.g. 'value >= 4' or "
                                     "'event_type in (click, purchase)'"),
        click.option("--categorical", help="Categorical context columns, comma-separated"),
        click.option("--continuous", help="Continuous context columns, comma-separated"),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def summary(metadata: dict) -> str:
    """A human-readable account of a finished run."""
    rows = metadata["rows"]
    quarantined = {k: v for k, v in rows["quarantined"].items() if v}
    lines = [
        f"rows: read {rows['read']:,} = accepted {rows['accepted']:,} + duplicates "
        f"{rows['duplicates']:,} + quarantined {sum(quarantined.values()):,}",
    ]
    lines += [f"  quarantined {reason}: {count:,}" for reason, count in quarantined.items()]
    split = metadata["split"]
    lines.append(f"split: train {split['rows']['train']:,}, valid {split['rows']['valid']:,} "
                 f"(valid from {split['valid_from']})")
    plan = metadata["embedding_plan"]["features"]
    lines.append("categorical features (cardinality, embedding width):")
    lines += [f"  {name}: {entry['cardinality']:,} x {entry['width']}"
              + (f" (shares {entry['shares']})" if "shares" in entry else "")
              for name, entry in plan.items()]
    tables = ", ".join(f"{name}/" for name in metadata["outputs"])
    lines.append(f"features: {len(metadata['features'])}; tables: {tables}, metadata.json")
    if "tfrecord" in metadata:
        section = metadata["tfrecord"]
        lines.append(f"tfrecord: {len(section['files'])} files, prebatch "
                     f"{section['prebatch_size']}, groups {', '.join(section['groups'])}")
    timings = ", ".join(f"{k} {v:.1f}s" for k, v in metadata["timings_s"].items())
    lines.append(f"time: {timings}")
    return "\n".join(lines)


@etl.command("run")
@job_options
def etl_run(**options: str | None) -> None:
    """Run the ETL job (Spark local[*] by default)."""
    metadata = run_job(**options, submitted=False)  # type: ignore[arg-type]
    click.echo(summary(metadata))


@main.command()
@click.option("--out", default="data/demo", show_default=True, type=click.Path(file_okay=False))
@click.option("--events", type=click.IntRange(min=1000), default=200_000, show_default=True)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help=f"YAML configuration of the publish and serve steps (default: "
                   f"./{DEFAULT_CONFIG})")
@click.option("--serve/--no-serve", default=True, show_default=True,
              help="End by starting the API in the background and calling each endpoint.")
def demo(out: str, events: int, seed: int, config_path: str | None, serve: bool) -> None:
    """Generate a sample log and run the whole pipeline on embedded defaults."""
    from datetime import datetime, timedelta, timezone

    from etl.config import load_config
    from etl.datagen import write_log

    started = time.perf_counter()
    if config_path is None and Path(DEFAULT_CONFIG).is_file():
        config_path = DEFAULT_CONFIG
    config = load_config(config_path)
    raw = Path(out) / "raw" / "events.jsonl"
    output = Path(out) / "output"
    steps = 4 if serve else 3
    # The last 14 days, so that the online store's values are within their ttl today.
    today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    _progress(f"[1/{steps}] datagen: {events:,} events (1% bad rows) → {raw}")
    write_log(raw, events=events, users=max(100, events // 40), items=max(50, events // 100),
              days=14, seed=seed, bad_fraction=0.01, start=today - timedelta(days=14))
    _progress(f"[2/{steps}] etl: local Spark job")
    metadata = run_job(input_path=str(raw), input_format="jsonl", output=str(output))
    click.echo(summary(metadata))
    click.echo(f"output: {output}  (metadata.json describes every table)")
    _progress(f"[3/{steps}] publish: Feast apply + materialize into Redis")
    from etl.demo import publish_demo, serve_demo

    redis_url = publish_demo(config, output, click.echo, _progress)
    if serve:
        _progress(f"[4/{steps}] serve: embedding tables (matrix factorisation) → HPS, the API")
        base = serve_demo(config, output, Path(out), redis_url, click.echo)
        click.echo(f"the API is running at {base} with authentication OFF (local use only; "
                   f"{Path(out) / 'featureline.yaml'}: api.auth.enabled: false); "
                   f"stop it with: kill $(cat {Path(out) / 'api.pid'})")
    click.echo(f"demo finished in {time.perf_counter() - started:.1f}s")


def _register_commands() -> None:
    from api.cli import serve
    from feature_store.cli import COMMANDS

    for command in (*COMMANDS, serve):
        main.add_command(command)


_register_commands()


def run_command(command: click.Command) -> None:
    """Run a click command; typed Featureline errors become one clear line and exit code 2."""
    try:
        command(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except FeaturelineError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


def run() -> None:
    """The ``featureline`` console script."""
    run_command(main)


if __name__ == "__main__":
    run()
