"""The ``api`` section of featureline.yaml, what a serving process is configured with, and
the API keys from the environment or a file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from featureline.core.errors import ConfigError
from featureline.core.metadata import DEFAULT_OUTPUT
from featureline.core.settings import Settings
from featureline.feature_store.settings import FeatureStoreConfig
from featureline.stream.settings import StreamConfig

API_KEYS_ENV = "FEATURELINE_API_KEYS"
# admin includes write, write includes read.
Scope = Literal["read", "write", "admin"]
SCOPES: tuple[Scope, ...] = ("read", "write", "admin")


class AuthConfig(Settings):
    """API keys: `Authorization: Bearer <key>` with the read, write or admin scope."""

    # Off only for local use: every request then has the admin scope.
    enabled: bool = True
    # Serve without authentication on an address other than loopback: refused unless set.
    allow_unauthenticated_remote: bool = False
    # A file of "<key> <scope>" lines (a mounted Secret); FEATURELINE_API_KEYS adds
    # "key:scope,key:scope" pairs.
    keys_file: str | None = None


class LimitsConfig(Settings):
    """Request sizes: beyond them a 413 names the field and the limit."""

    # Entity rows per /v1/features request; candidate items per /v1/ranking-inputs.
    max_entities: int = Field(default=1000, ge=1)
    # Keys per /v1/embeddings/lookup.
    max_keys: int = Field(default=100_000, ge=1)
    # Values per /v1/embeddings/lookup answer (keys × dim): bounds the response's size.
    max_response_values: int = Field(default=4_000_000, ge=1)
    # Bytes of a request body.
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # Events per /v1/push.
    max_events: int = Field(default=1000, ge=1)


class RankingConfig(Settings):
    """What /v1/ranking-inputs looks up in the parameter server."""

    # The HPS model whose tables hold the embeddings of the encoded ids.
    model: str = "ranker"
    # Encoded-id feature → table of that model, e.g. user_id_cat → user.
    tables: dict[str, str] = Field(
        default_factory=lambda: {"user_id_cat": "user", "item_id_cat": "item"})


class FeatureCacheConfig(Settings):
    """Each process's memory of the entities it read lately."""

    # Seconds an entity's online values are answered from this process's memory; a publish
    # empties the cache at once (the store's stamp is read with every request). 0: off.
    ttl_s: float = Field(default=5.0, ge=0)
    # Entities held per process (emptied when full).
    max_entities: int = Field(default=50_000, ge=1)


class FeatureLoggingConfig(Settings):
    """What the API served, logged for ``featureline consistency`` (api/feature_log.py)."""

    # The folder log files go to (a subfolder per UTC day, date=YYYY-MM-DD); None: off.
    path: str | None = None
    # Share of entities whose requests are logged (by a hash of the user id).
    sample: float = Field(default=1.0, ge=0.0, le=1.0)
    # Seconds between two files of one worker (a killed worker loses at most this much).
    roll_s: float = Field(default=60.0, gt=0)
    # Requests waiting to be written; beyond it a request is dropped (and counted).
    queue_requests: int = Field(default=10_000, ge=1)


class ApiConfig(Settings):
    """The ranking API: `featureline serve`."""

    # The address to listen on; --host overrides it.
    host: str = "127.0.0.1"
    # The port to listen on; --port overrides it.
    port: int = Field(default=8000, ge=1, le=65535)
    # The ETL output whose vocabularies encode raw ids (default: etl.output.path).
    data: str | None = None
    # The parameter server's configuration (hps.yaml or HugeCTR's ps.json); None: no tables.
    hps: str | None = None
    # Seconds a client should wait after a 503 (Redis unreachable).
    retry_after_s: int = Field(default=2, ge=1)
    auth: AuthConfig = AuthConfig()
    limits: LimitsConfig = LimitsConfig()
    ranking: RankingConfig = RankingConfig()
    feature_cache: FeatureCacheConfig = FeatureCacheConfig()
    feature_logging: FeatureLoggingConfig = FeatureLoggingConfig()

    @model_validator(mode="after")
    def _not_open_to_the_network(self) -> ApiConfig:
        check_exposure(self.host, self.auth)
        return self


LOOPBACK = ("127.0.0.1", "::1", "localhost")
# The Kubernetes Secret's placeholder: refused, so an API deployed as it is serves nobody.
PLACEHOLDER_KEY_PREFIX = "replace-me"


def check_exposure(host: str, auth: AuthConfig) -> None:
    """Refuse serving without authentication on a non-loopback address unless allowed."""
    if not auth.enabled and host not in LOOPBACK and not auth.allow_unauthenticated_remote:
        raise ValueError(f"auth.enabled: false with host {host!r} serves every request with "
                         "the admin scope to the network; bind to 127.0.0.1, enable auth, or "
                         "set api.auth.allow_unauthenticated_remote: true")


class ServingConfig(Settings):
    """What an API process needs: its own section, the feature store's, the event log's, and
    the ETL output
    whose vocabularies and entity tables it serves (``api.data``, else ``etl.output.path``)."""

    api: ApiConfig = ApiConfig()
    feature_store: FeatureStoreConfig = FeatureStoreConfig()
    stream: StreamConfig = StreamConfig()
    data: str = DEFAULT_OUTPUT


def api_keys(auth: AuthConfig) -> dict[str, Scope]:
    """key → scope, from ``auth.keys_file`` and ``FEATURELINE_API_KEYS``."""
    pairs: list[tuple[str, str, str]] = []
    if auth.keys_file:
        path = Path(auth.keys_file)
        if not path.is_file():
            raise ConfigError("api.auth.keys_file", f"no such file: {path}")
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, scope = line.strip().partition(" ")
                pairs.append((key, scope.strip(), f"{path}:{number}"))
    for item in filter(None, os.environ.get(API_KEYS_ENV, "").split(",")):
        key, _, scope = item.strip().partition(":")
        pairs.append((key, scope, API_KEYS_ENV))
    keys: dict[str, Scope] = {}
    for key, scope, origin in pairs:
        if scope not in SCOPES or not key:
            raise ConfigError(origin, f"expected '<key> {'|'.join(SCOPES)}', got scope "
                              f"{scope!r}")
        if key.startswith(PLACEHOLDER_KEY_PREFIX):
            raise ConfigError(origin, "a placeholder key: put real keys in the Secret (see "
                              "k8s/base/api.yaml)")
        keys[key] = scope
    return keys
