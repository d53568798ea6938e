"""``featureline serve``: the ranking API in uvicorn."""

from __future__ import annotations

import os
from pathlib import Path

import click

from etl.config import CONFIG_ENV

DEFAULT_CONFIG = "featureline.yaml"


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help=f"YAML configuration (default: ./{DEFAULT_CONFIG} if present)")
@click.option("--host", help="Listen address (default: api.host)")
@click.option("--port", type=click.IntRange(1, 65535), help="Port (default: api.port)")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes (each opens its own Redis client and parameter server)")
def serve(config_path: str | None, host: str | None, port: int | None, workers: int) -> None:
    """Serve the ranking API (online features, embeddings, ranking inputs)."""
    import uvicorn

    from etl.config import load_config

    if config_path is None and Path(DEFAULT_CONFIG).is_file():
        config_path = DEFAULT_CONFIG
    config = load_config(config_path)  # errors surface here, before any worker starts
    if config_path is not None:
        os.environ[CONFIG_ENV] = str(Path(config_path).resolve())
    if not config.api.auth.enabled:
        click.echo("warning: API authentication is off (api.auth.enabled: false); "
                   "for local use only", err=True)
    uvicorn.run("api.app:app_from_env", factory=True, host=host or config.api.host,
                port=port or config.api.port, workers=workers, log_level="warning")
