"""The Feast repository in ``feature_store/``: its ``feature_store.yaml`` with the online store
pointed at ``REDIS_URL`` (or the embedded server), and the definitions of one ETL output.

Feast's CLI reads the same repository: ``featureline_repo.py`` builds its definitions with
:func:`repository_definitions`, and ``feature_store.yaml`` takes the Redis connection from
``FEAST_REDIS_CONNECTION`` (``featureline redis env`` prints it, derived from ``REDIS_URL``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import redis
import yaml
from feast import FeatureStore
from feast.repo_config import RepoConfig

from etl.config import CONFIG_ENV, FeaturelineConfig, FeatureStoreConfig, load_config
from etl.errors import ConfigError
from feature_store.definitions import Definitions, build
from feature_store.errors import OnlineStoreUnavailableError
from feature_store.redis_server import REDIS_URL_ENV, redis_url

FEAST_YAML = {"duckdb": "feature_store.yaml", "spark": "feature_store.spark.yaml"}
CONNECTION_ENV = "FEAST_REDIS_CONNECTION"
OUTPUT_ENV = "FEATURELINE_OUTPUT"
# A server that is down or unreachable is an error within seconds, not a hang.
TIMEOUTS = ("socket_connect_timeout=2", "socket_timeout=10")
REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError,
                redis.exceptions.RedisClusterException)
# ibis, under Feast's DuckDB offline store, calls a method DuckDB 2 deprecates; not ours to fix.
warnings.filterwarnings("ignore", message="fetch_arrow_table", category=DeprecationWarning)


def feast_connection_string(url: str, redis_type: str = "redis") -> str:
    """``redis://[user:password@]host:port/db`` → Feast's ``host:port,db=…,password=…``."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ConfigError(REDIS_URL_ENV, f"{url!r} is not a URL like redis://host:6379/0")
    fields = [f"{parts.hostname}:{parts.port or 6379}"]
    db = parts.path.strip("/")
    if db and redis_type == "redis":
        fields.append(f"db={db}")
    if parts.username:
        fields.append(f"username={unquote(parts.username)}")
    if parts.password:
        fields.append(f"password={unquote(parts.password)}")
    if parts.scheme == "rediss":
        fields.append("ssl=true")
    return ",".join([*fields, *TIMEOUTS])


def repo_config(repo: Path, settings: FeatureStoreConfig, url: str) -> RepoConfig:
    """``feature_store.yaml`` (or its Spark variant) with the online store at ``url``."""
    path = repo / FEAST_YAML[settings.offline_store]
    if not path.is_file():
        raise ConfigError("feature_store.repo", f"{path} not found")
    raw = yaml.safe_load(os.path.expandvars(path.read_text()))
    raw["online_store"] = {**raw["online_store"], "redis_type": settings.redis_type,
                           "connection_string": feast_connection_string(url,
                                                                        settings.redis_type)}
    config = RepoConfig(**raw)
    config.repo_path = repo
    return config


@dataclass
class FeatureRepo:
    """The Feast repository, the ETL output it publishes and the online store it writes to."""

    path: Path
    settings: FeatureStoreConfig
    redis_url: str
    definitions: Definitions
    store: FeatureStore


def open_repo(config: FeaturelineConfig, output: str | Path | None = None,
              url: str | None = None) -> FeatureRepo:
    """The repository of ``config.feature_store`` over ``output`` (default: the ETL's output).

    Without ``url``: ``REDIS_URL``, or the embedded server (started if need be).
    """
    settings = config.feature_store
    repo = Path(settings.repo).resolve()
    definitions = build(output or config.etl.output.path, settings)
    url = url or redis_url(settings.redis_dir)
    store = FeatureStore(repo_path=str(repo), config=repo_config(repo, settings, url))
    return FeatureRepo(repo, settings, url, definitions, store)


@contextmanager
def online_store_errors(url: str) -> Iterator[None]:
    """Redis failures inside Feast become :class:`OnlineStoreUnavailableError`."""
    try:
        yield
    except REDIS_ERRORS as exc:
        raise OnlineStoreUnavailableError(url, str(exc) or type(exc).__name__) from exc


def repository_definitions(repo: Path) -> Definitions:
    """The definitions ``feast apply`` finds in ``repo``: from ``FEATURELINE_CONFIG`` (default:
    the project's ``featureline.yaml`` next to the repository) and the ETL output in
    ``FEATURELINE_OUTPUT`` (default: that file's ``etl.output.path``)."""
    project = repo.resolve().parent
    config_path = os.environ.get(CONFIG_ENV) or project / "featureline.yaml"
    config = load_config(config_path if Path(config_path).is_file() else None)
    output = Path(os.environ.get(OUTPUT_ENV) or config.etl.output.path)
    return build(output if output.is_absolute() else project / output, config.feature_store)
