"""``featureline publish``, ``featureline training-set`` and ``featureline redis …``.

Feast is imported inside each command, so the rest of the CLI starts without it.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import click

from etl.config import FeaturelineConfig, load_config
from feature_store.redis_server import REDIS_URL_ENV

DEFAULT_CONFIG = "featureline.yaml"


def _config(path: str | None) -> FeaturelineConfig:
    if path is None and Path(DEFAULT_CONFIG).is_file():
        path = DEFAULT_CONFIG
    return load_config(path)


def _progress(message: str) -> None:
    click.echo(f"[{time.strftime('%H:%M:%S')}] {message}", err=True)


config_option = click.option("--config", "config_path", type=click.Path(dir_okay=False),
                             help=f"YAML configuration (default: ./{DEFAULT_CONFIG} if present)")
data_option = click.option("--data", type=click.Path(file_okay=False),
                           help="ETL output folder with metadata.json (default: etl.output.path)")


@click.command()
@config_option
@data_option
@click.option("--full", is_flag=True, help="Materialize every snapshot again, not only new ones.")
@click.option("--end", type=click.DateTime(),
              help="Materialize up to this UTC time (default: now).")
def publish(config_path: str | None, data: str | None, full: bool, end: datetime | None) -> None:
    """Register the feature views with Feast and materialize them into Redis."""
    from feature_store.publish import publish as run_publish
    from feature_store.repo import open_repo

    repo = open_repo(_config(config_path), output=data)
    _progress(f"online store {repo.redis_url}")
    summary = run_publish(repo, full=full, progress=_progress,
                          end=end.replace(tzinfo=timezone.utc) if end else None)
    click.echo(json.dumps(summary.to_json()))


@click.command("training-set")
@config_option
@data_option
@click.option("--entities", "entity_rows", required=True, type=click.Path(),
              help="Parquet of join keys (user_id, item_id), event_timestamp and any labels")
@click.option("--service", default="training", show_default=True, help="Feast feature service")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Parquet to write")
def training_set(config_path: str | None, data: str | None, entity_rows: str, service: str,
                 out: str) -> None:
    """Join point-in-time correct features onto entity rows (every row comes back)."""
    from feature_store.repo import open_repo
    from feature_store.training_set import training_set as run_training_set

    started = time.perf_counter()
    repo = open_repo(_config(config_path), output=data)
    summary = run_training_set(repo, entity_rows, service, out)
    click.echo(json.dumps({**summary.to_json(),
                           "seconds": round(time.perf_counter() - started, 2)}))


@click.group()
def redis() -> None:
    """The embedded Redis server (used when REDIS_URL is unset)."""


def _redis_dir(config_path: str | None) -> str:
    return _config(config_path).feature_store.redis_dir


@redis.command("start")
@config_option
def redis_start(config_path: str | None) -> None:
    """Start the embedded server (or find it running) and print its URL."""
    from feature_store.redis_server import start_server

    click.echo(start_server(_redis_dir(config_path)))


@redis.command("stop")
@config_option
def redis_stop(config_path: str | None) -> None:
    """Stop the embedded server, saving its data."""
    from feature_store.redis_server import stop_server

    click.echo("stopped" if stop_server(_redis_dir(config_path)) else "not running")


@redis.command("status")
@config_option
def redis_status(config_path: str | None) -> None:
    """Where the online store is: REDIS_URL, or the embedded server's state."""
    from feature_store.redis_server import server_status

    if os.environ.get(REDIS_URL_ENV):
        click.echo(json.dumps({"url": os.environ[REDIS_URL_ENV], "source": REDIS_URL_ENV}))
        return
    status = server_status(_redis_dir(config_path))
    click.echo(json.dumps({**status, "source": "embedded"} if status else {"running": False}))
    if status is None:
        raise SystemExit(1)


@redis.command("env")
@config_option
def redis_env(config_path: str | None) -> None:
    """Shell exports for Feast's CLI: eval "$(featureline redis env)"."""
    from feature_store.redis_server import redis_url
    from feature_store.repo import CONNECTION_ENV, feast_connection_string

    config = _config(config_path)
    url = redis_url(config.feature_store.redis_dir)
    connection = feast_connection_string(url, config.feature_store.redis_type)
    click.echo(f"export {REDIS_URL_ENV}='{url}'\nexport {CONNECTION_ENV}='{connection}'")


COMMANDS = (publish, training_set, redis)
