"""The one Redis client factory: every process reaches Redis (single server or cluster)
through :func:`client`, with timeouts that turn a dead server into an error within seconds.
``REDIS_URL`` names the server wherever a component talks to Redis.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis as redis_py
from redis.cluster import RedisCluster

REDIS_URL_ENV = "REDIS_URL"
# Everything that means "Redis cannot serve this now", on a single server or on a cluster:
# unreachable, timed out, or refusing the command (out of memory, loading, read-only).
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    redis_py.ConnectionError, redis_py.TimeoutError, redis_py.exceptions.ClusterError,
    redis_py.exceptions.RedisClusterException, redis_py.ResponseError)
CONNECT_TIMEOUT_S = 2.0
SOCKET_TIMEOUT_S = 5.0


def url_from_env(configured: str | None = None, variable: str = REDIS_URL_ENV) -> str | None:
    """The environment ``variable`` when set (it overrides a configured URL), else
    ``configured``."""
    return os.environ.get(variable) or configured


def redact(url: str) -> str:
    """``url`` fit to print or return: a password is replaced by ``***``."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    user = f"{parts.username}:***" if parts.username else ":***"
    host = parts.hostname or ""
    netloc = f"{user}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def client(url: str, *, cluster: bool = False, timeout_s: float = SOCKET_TIMEOUT_S,
           connect_timeout_s: float = CONNECT_TIMEOUT_S) -> Any:
    """A client of ``url`` (``redis://[user:password@]host:port/db``); ``cluster``: the URL
    names any one node of a Redis Cluster, the client discovers the rest."""
    client_class = RedisCluster if cluster else redis_py.Redis
    return client_class.from_url(url, socket_timeout=timeout_s,
                                 socket_connect_timeout=connect_timeout_s)
