"""What serving processes read — the API's workers and Feast's CLI — without the ETL's
settings, whose feature ops import Spark: the API process never imports pyspark.

``FEATURELINE_CONFIG`` names the configuration file for processes started without flags.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from featureline.api.settings import ServingConfig
from featureline.core.errors import ConfigError
from featureline.core.metadata import DEFAULT_OUTPUT
from featureline.core.settings import read_yaml, validate

CONFIG_ENV = "FEATURELINE_CONFIG"
DEFAULT_CONFIG = "featureline.yaml"
# The ETL output Feast's CLI publishes (default: the configuration's etl.output.path).
OUTPUT_ENV = "FEATURELINE_OUTPUT"


def config_path(path: str | Path | None) -> Path | None:
    """The file a command reads: ``path``, else ``./featureline.yaml`` when present."""
    if path is None and Path(DEFAULT_CONFIG).is_file():
        return Path(DEFAULT_CONFIG)
    return Path(path) if path is not None else None


def load_serving_config(path: str | Path | None = None) -> ServingConfig:
    """The sections an API process needs; the ETL's section only for its output path."""
    if path is None:
        return ServingConfig()
    data = read_yaml(path)
    output = ((data.get("etl") or {}).get("output") or {}).get("path", DEFAULT_OUTPUT)
    if not isinstance(output, str):
        raise ConfigError("etl.output.path", f"expected a path, got {output!r} (in {path})")
    sections = {name: data[name] for name in ("api", "feature_store", "stream") if name in data}
    config = validate(ServingConfig, sections, origin=str(path))
    return config.model_copy(update={"data": config.api.data or output})


def app_from_env() -> Any:
    """uvicorn's factory: the configuration in ``FEATURELINE_CONFIG`` (set by serve)."""
    from featureline.api.app import (
        create_app,  # Feast's CLI reads this module too, and needs no API
    )

    return create_app(load_serving_config(os.environ.get(CONFIG_ENV)))


def feast_definitions(repo: Path) -> Any:
    """The definitions ``feast apply`` finds in ``repo``: from ``FEATURELINE_CONFIG`` (default:
    the nearest ``featureline.yaml`` above the repository) and the ETL output in
    ``FEATURELINE_OUTPUT`` (default: that file's ``etl.output.path``, relative to its folder).
    """
    from featureline.feature_store.definitions import build

    repo = repo.resolve()
    configured = os.environ.get(CONFIG_ENV)
    found = Path(configured) if configured else next(
        (folder / DEFAULT_CONFIG for folder in repo.parents
         if (folder / DEFAULT_CONFIG).is_file()), None)
    config = load_serving_config(found)
    project = found.resolve().parent if found else Path.cwd()
    output = Path(os.environ.get(OUTPUT_ENV) or config.data)
    return build(output if output.is_absolute() else project / output, config.feature_store)
