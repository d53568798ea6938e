"""The one Redis client factory: every process reaches Redis (single server, cluster, or a
primary that Redis Sentinel watches) through :func:`client`, with timeouts that turn a dead
server into an error within seconds. ``REDIS_URL`` names the server wherever a component
talks to Redis: ``redis://[user:password@]host:port/db``, or
``redis+sentinel://[user:password@]host:port[,host:port…]/<primary name>[/db]`` (the
sentinels' addresses; the client asks them for the current primary on every new
connection, so a failover costs the commands in flight during the switch, not a restart).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import redis as redis_py
import redis.asyncio as redis_asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.cluster import ClusterPipeline, RedisCluster
from redis.sentinel import Sentinel

from featureline.core.errors import ConfigError

REDIS_URL_ENV = "REDIS_URL"
# Everything that means "Redis cannot serve this now", on a single server or on a cluster:
# unreachable, timed out, or refusing the command (out of memory, loading, read-only).
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    redis_py.ConnectionError, redis_py.TimeoutError, redis_py.exceptions.ClusterError,
    redis_py.exceptions.RedisClusterException, redis_py.ResponseError)
CONNECT_TIMEOUT_S = 2.0
SOCKET_TIMEOUT_S = 5.0
SENTINEL_SCHEME = "redis+sentinel"
SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelUrl:
    """A ``redis+sentinel://`` URL, parsed."""

    sentinels: list[tuple[str, int]]
    primary: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def sentinel_url(url: str) -> SentinelUrl | None:
    """``url`` parsed when it names sentinels (``redis+sentinel://``), else None."""
    prefix = f"{SENTINEL_SCHEME}://"
    if not url.startswith(prefix):
        return None
    netloc, _, path = url[len(prefix):].partition("/")
    auth, _, hosts = netloc.rpartition("@")
    user, _, password = auth.partition(":")
    sentinels = []
    for address in hosts.split(","):
        host, colon, port = address.rpartition(":")
        if not colon:
            host, port = address, str(SENTINEL_PORT)
        if not host or not port.isdigit():
            raise ConfigError(REDIS_URL_ENV, f"{redact(url)!r}: {address!r} is not host:port")
        sentinels.append((host, int(port)))
    names = [part for part in path.split("/") if part]
    if not names or len(names) > 2 or (len(names) == 2 and not names[1].isdigit()):
        raise ConfigError(REDIS_URL_ENV, f"{redact(url)!r} is not a URL like "
                          f"{SENTINEL_SCHEME}://host:26379,host:26379/<primary name>/0")
    return SentinelUrl(sentinels, unquote(names[0]), int(names[1]) if len(names) == 2 else 0,
                       unquote(user) or None, unquote(password) or None)


def url_from_env(configured: str | None = None, variable: str = REDIS_URL_ENV) -> str | None:
    """The environment ``variable`` when set (it overrides a configured URL), else
    ``configured``."""
    return os.environ.get(variable) or configured


def redact(url: str) -> str:
    """``url`` fit to print or return: a password is replaced by ``***``."""
    if url.startswith(f"{SENTINEL_SCHEME}://"):  # several hosts: not urlsplit's netloc
        scheme, _, rest = url.partition("://")
        auth, at, hosts = rest.partition("@")
        if not at or ":" not in auth.split("/")[0]:
            return url
        return f"{scheme}://{auth.split(':')[0]}:***@{hosts}"
    parts = urlsplit(url)
    if not parts.password:
        return url
    user = f"{parts.username}:***" if parts.username else ":***"
    host = parts.hostname or ""
    netloc = f"{user}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def client(url: str, *, cluster: bool = False, timeout_s: float = SOCKET_TIMEOUT_S,
           connect_timeout_s: float = CONNECT_TIMEOUT_S, asynchronous: bool = False) -> Any:
    """A client of ``url`` (``redis://[user:password@]host:port/db``); ``cluster``: the URL
    names any one node of a Redis Cluster, the client discovers the rest; a
    ``redis+sentinel://`` URL: a client of the primary its sentinels name now.
    ``asynchronous``: redis-py's asyncio client of the same (its connections belong to the
    event loop that opens them)."""
    sentinel = sentinel_url(url)
    if sentinel is not None:
        if cluster:
            raise ConfigError("feature_store.redis_type", "a Redis Cluster is not reached "
                              f"through sentinels: {redact(url)!r}")
        sentinel_class = AsyncSentinel if asynchronous else Sentinel
        return sentinel_class(sentinel.sentinels, socket_timeout=timeout_s,
                              socket_connect_timeout=connect_timeout_s).master_for(
            sentinel.primary, db=sentinel.db, username=sentinel.username,
            password=sentinel.password, socket_timeout=timeout_s,
            socket_connect_timeout=connect_timeout_s)
    client_class: Any = ((AsyncRedisCluster if cluster else redis_asyncio.Redis) if asynchronous
                         else (RedisCluster if cluster else redis_py.Redis))
    return client_class.from_url(url, socket_timeout=timeout_s,
                                 socket_connect_timeout=connect_timeout_s)


def queue_script(pipe: Any, sha: str, keys: Sequence[Any], args: Sequence[Any]) -> None:
    """Queue a call of the script of digest ``sha`` on ``pipe``. A Redis Cluster's pipeline
    is told the node of the keys' slot (one slot: a script's keys share one); untold,
    redis-py's cluster pipeline asks a server for the keys of each call (``COMMAND
    GETKEYS``, a round trip per call)."""
    options = ({"target_nodes": pipe.get_node_from_key(keys[0])}
               if isinstance(pipe, ClusterPipeline) else {})
    pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args, **options)


def execute_with_scripts(client: Any, scripts: Sequence[Any],
                         queue: Callable[[Any], None]) -> list[Any]:
    """The replies of a pipeline (not a transaction) that ``queue`` fills, calling
    ``scripts`` (``register_script``'s, sent by digest with :func:`queue_script`); where a
    server does not hold one (never loaded, restarted, flushed), they are loaded — on every
    primary of a cluster — and the pipeline is filled and sent again, so its commands must
    be safe to repeat."""
    while True:
        pipe = client.pipeline(transaction=False)
        queue(pipe)
        try:
            return list(pipe.execute())
        except redis_py.exceptions.NoScriptError:
            for script in scripts:
                client.script_load(script.script)
