"""The Feast repository in ``feature_store/feast_repo/``: its ``feature_store.yaml`` with the
online store pointed at ``REDIS_URL`` (or the embedded server), and the definitions of one ETL
output.

Feast's CLI reads the same repository: its ``featureline_repo.py`` builds the definitions
with :func:`featureline.feature_store.definitions.build`, and ``feature_store.yaml`` takes the Redis
connection from ``FEAST_REDIS_CONNECTION`` (``featureline redis env`` prints it, derived from
``REDIS_URL``).
"""

from __future__ import annotations

import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import yaml
from feast import FeatureStore
from feast.repo_config import RepoConfig

from featureline.core.errors import ConfigError
from featureline.core.redis import REDIS_URL_ENV, SENTINEL_SCHEME, redact, sentinel_url
from featureline.feature_store.definitions import Definitions, build
from featureline.feature_store.redis_server import redis_url
from featureline.feature_store.settings import FeatureStoreConfig

FEAST_YAML = {"duckdb": "feature_store.yaml", "spark": "feature_store.spark.yaml"}
# The repository the package ships: the checkout's feast_repo/, or its copy in an installed
# wheel, where it is a template (Feast keeps its registry under the repository).
PACKAGED_REPO = Path(__file__).resolve().parent / "feast_repo"
REPO_FILES = (*FEAST_YAML.values(), "featureline_repo.py")
CONNECTION_ENV = "FEAST_REDIS_CONNECTION"
# A server that is down or unreachable is an error within seconds, not a hang.
TIMEOUTS = ("socket_connect_timeout=2", "socket_timeout=10")
# ibis, under Feast's DuckDB offline store, calls a method DuckDB deprecates; not ours to fix.
warnings.filterwarnings("ignore", message="fetch_arrow_table", category=DeprecationWarning)


def feast_connection_string(url: str, redis_type: str = "redis") -> str:
    """``redis://[user:password@]host:port/db`` → Feast's ``host:port,db=…,password=…``;
    ``redis+sentinel://…`` (with ``redis_type: redis_sentinel``) → the sentinels'
    ``host:port,host:port,db=…`` (the primary's name goes to ``sentinel_master``)."""
    sentinel = sentinel_url(url)
    if (sentinel is not None) != (redis_type == "redis_sentinel"):
        raise ConfigError("feature_store.redis_type", f"{redis_type} with {redact(url)!r}: "
                          f"a {SENTINEL_SCHEME}:// URL goes with redis_sentinel, and only it")
    if sentinel is not None:
        fields = [f"{host}:{port}" for host, port in sentinel.sentinels]
        fields.append(f"db={sentinel.db}")
        if sentinel.username:
            fields.append(f"username={sentinel.username}")
        if sentinel.password:
            fields.append(f"password={sentinel.password}")
        return ",".join([*fields, *TIMEOUTS])
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
        raise ConfigError("feature_store.repo", f"{path} not found (a Feast repository like "
                          f"{PACKAGED_REPO}: copy that folder and point this setting at it)")
    raw = yaml.safe_load(os.path.expandvars(path.read_text()))
    raw["online_store"] = {**raw["online_store"], "redis_type": settings.redis_type,
                           "connection_string": feast_connection_string(url,
                                                                        settings.redis_type)}
    sentinel = sentinel_url(url)
    if sentinel is not None:
        raw["online_store"]["sentinel_master"] = sentinel.primary
    config = RepoConfig(**raw)
    config.repo_path = repo
    return config


def copy_packaged_repo(target: Path) -> Path:
    """A Feast repository at ``target`` made of the package's files; ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for name in REPO_FILES:
        shutil.copy(PACKAGED_REPO / name, target / name)
    return target


@dataclass
class FeatureRepo:
    """The Feast repository, the ETL output it publishes and the online store it writes to."""

    path: Path
    settings: FeatureStoreConfig
    redis_url: str
    definitions: Definitions
    store: FeatureStore


def open_repo(settings: FeatureStoreConfig, output: str | Path,
              url: str | None = None) -> FeatureRepo:
    """The repository of ``settings`` over the ETL output folder ``output``.

    Without ``url``: ``REDIS_URL``, or the embedded server (started if need be).
    """
    repo = Path(settings.repo).resolve()
    definitions = build(output, settings)
    url = url or redis_url(settings.redis_dir)
    store = FeatureStore(repo_path=str(repo), config=repo_config(repo, settings, url))
    return FeatureRepo(repo, settings, url, definitions, store)
