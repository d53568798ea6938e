"""The volatile database (L2): a bounded in-memory copy of the hot part of each table.

``VolatileStore`` is the interface; ``HashMapStore`` is the in-process hash map (the local
default) and ``RedisStore`` a Redis server shared by replicas.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np

from featureline.core import redis
from featureline.core.errors import ConfigError
from featureline.hps.config import VolatileDbConfig
from featureline.hps.formats import key_bytes
from featureline.hps.slots import OverflowPolicy, SlotIndex

logger = logging.getLogger("featureline.hps")


class VolatileStore(ABC):
    @abstractmethod
    def lookup(self, table: str, keys: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
        """(found mask, vectors) for unique ``keys``."""

    @abstractmethod
    def insert(self, table: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Insert or overwrite unique ``keys``; over capacity, the overflow policy evicts."""

    @abstractmethod
    def size(self, table: str) -> int:
        """Keys held for ``table``."""

    @property
    def available(self) -> bool:
        """Whether the store is answering (an in-process store always is)."""
        return True


class HashMapStore(VolatileStore):
    def __init__(self, capacity: int, policy: OverflowPolicy = "evict_oldest") -> None:
        self.capacity = capacity
        self.policy = policy
        self._index: dict[str, SlotIndex] = {}
        self._vectors: dict[str, np.ndarray] = {}

    def _table(self, table: str, dim: int) -> tuple[SlotIndex, np.ndarray]:
        if table not in self._index:
            self._index[table] = SlotIndex(self.capacity, self.policy)
            self._vectors[table] = np.zeros((self.capacity, dim), dtype=np.float32)
        return self._index[table], self._vectors[table]

    def lookup(self, table: str, keys: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
        index, storage = self._table(table, dim)
        slots = index.find(keys)
        found = slots >= 0
        vectors = np.zeros((len(keys), dim), dtype=np.float32)
        vectors[found] = storage[slots[found]]
        return found, vectors

    def insert(self, table: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        index, storage = self._table(table, vectors.shape[1])
        slots = index.assign(keys)
        placed = slots >= 0
        storage[slots[placed]] = vectors[placed]

    def size(self, table: str) -> int:
        return len(self._index[table]) if table in self._index else 0


class RedisStore(VolatileStore):
    """L2 in Redis, shared by every replica of the server.

    Keys are namespaced ``<namespace>:<model>/<table>@<dim>:`` + the 8-byte big-endian key, values
    raw float32 bytes; batches go in one pipelined round trip per ``batch_size`` keys. A
    sorted set per table orders the keys for the overflow policy. When Redis cannot be
    reached the store answers "not here" and drops insertions, so lookups fall through to
    RocksDB instead of failing; each such event is logged.

    ``cluster``: ``url`` names one node of a Redis Cluster; a table's keys spread over every
    node (no hash tag), and batches are split by slot and sent to the nodes in parallel.

    A circuit breaker keeps a dead or blackholed Redis from costing every lookup its socket
    timeout (while the table's lock is held): after a failure the store answers "not here"
    at once, and asks Redis again only ``retry_after_s`` later.
    """

    def __init__(self, url: str, capacity: int, policy: OverflowPolicy = "evict_oldest",
                 namespace: str = "hps", batch_size: int = 10_000,
                 timeout_s: float = 1.0, cluster: bool = False,
                 retry_after_s: float = 5.0) -> None:
        from featureline.core import redis

        self._errors = redis.UNAVAILABLE_ERRORS
        self.client = redis.client(url, cluster=cluster, timeout_s=timeout_s,
                                   connect_timeout_s=timeout_s)
        self.cluster = cluster
        self.capacity = capacity
        self.policy = policy
        self.namespace = namespace
        self.batch_size = batch_size
        self.unavailable = 0
        self.skipped = 0  # operations answered without asking Redis, the breaker open
        self.retry_after_s = retry_after_s
        self._closed_at = 0.0  # monotonic time from which Redis is asked again

    @property
    def available(self) -> bool:
        """False while the breaker is open (Redis failed less than ``retry_after_s`` ago)."""
        return time.monotonic() >= self._closed_at

    def _skip(self) -> bool:
        if self.available:
            return False
        self.skipped += 1
        return True

    def _prefix(self, table: str) -> bytes:
        return f"{self.namespace}:{table}:".encode()

    def _keys(self, table: str, keys: np.ndarray) -> list[bytes]:
        prefix = self._prefix(table)
        return [prefix + key for key in key_bytes(keys)]

    def _meta(self, table: str, name: str) -> bytes:
        # '#' where data keys have ':', so no 8-byte key can collide with these.
        return f"{self.namespace}:{table}#{name}".encode()

    def _order(self, table: str) -> bytes:
        return self._meta(table, "order")

    def lookup(self, table: str, keys: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
        found = np.zeros(len(keys), dtype=bool)
        vectors = np.zeros((len(keys), dim), dtype=np.float32)
        if self._skip():
            return found, vectors
        names = self._keys(table, keys)
        try:
            values = self._mget(names)
        except self._errors as exc:
            self._down("lookup", exc)
            return found, vectors
        for index, value in enumerate(values):
            if value is not None:
                found[index] = True
                vectors[index] = np.frombuffer(value, dtype="<f4")
        if self.policy == "evict_least_used" and found.any():
            self._count_uses(table, [n for n, hit in zip(names, found, strict=True) if hit])
        return found, vectors

    def _mget(self, names: list[bytes]) -> list[bytes | None]:
        if self.cluster:
            return [v for start in range(0, len(names), self.batch_size)
                    for v in self.client.mget_nonatomic(names[start:start + self.batch_size])]
        pipeline = self.client.pipeline(transaction=False)
        for start in range(0, len(names), self.batch_size):
            pipeline.mget(names[start:start + self.batch_size])
        return [v for chunk in pipeline.execute() for v in chunk]

    def _count_uses(self, table: str, names: list[bytes]) -> None:
        try:
            pipeline = self.client.pipeline(transaction=False)
            for name in names:
                pipeline.zincrby(self._order(table), 1, name)
            pipeline.execute()
        except self._errors as exc:
            self._down("use count", exc)

    def insert(self, table: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        if self._skip():
            return
        names = self._keys(table, keys)
        values = np.ascontiguousarray(vectors, dtype="<f4")
        row = values.shape[1] * 4
        raw = values.tobytes()
        try:
            first = 0 if self.policy == "evict_least_used" else self.client.incrby(
                self._meta(table, "sequence"), len(names)) - len(names)
            pipeline = self.client.pipeline(transaction=False)
            for start in range(0, len(names), self.batch_size):
                chunk = names[start:start + self.batch_size]
                values_of = {n: raw[(start + i) * row:(start + i + 1) * row]
                             for i, n in enumerate(chunk)}
                if self.cluster:  # keys of many slots: split by slot, sent node by node
                    self.client.mset_nonatomic(values_of)
                else:
                    pipeline.mset(values_of)
                scores = {n: first + start + i for i, n in enumerate(chunk)}
                pipeline.zadd(self._order(table), scores,
                              nx=self.policy == "evict_least_used")
            pipeline.execute()
            self._evict(table)
        except self._errors as exc:
            self._down("insert", exc)

    def _evict(self, table: str) -> None:
        excess = self.client.zcard(self._order(table)) - self.capacity
        if excess <= 0:
            return
        if self.policy == "evict_random":
            victims = self.client.zrandmember(self._order(table), excess) or []
            if victims:
                self.client.zrem(self._order(table), *victims)
        else:
            victims = [name for name, _ in self.client.zpopmin(self._order(table), excess)]
        if victims:
            self.client.delete(*victims)

    def size(self, table: str) -> int:
        if self._skip():
            return 0
        try:
            return int(self.client.zcard(self._order(table)))
        except self._errors as exc:
            self._down("size", exc)
            return 0

    def _down(self, operation: str, exc: Exception) -> None:
        self.unavailable += 1
        self._closed_at = time.monotonic() + self.retry_after_s
        logger.warning("Redis volatile store unavailable during %s (%s); using the lower tiers "
                       "for %.0fs", operation, exc, self.retry_after_s)


# The L2 cache's Redis: its own keyspace and memory policy, apart from the online store's.
HPS_REDIS_URL_ENV = "HPS_REDIS_URL"


def _redis_store(config: VolatileDbConfig) -> VolatileStore:
    url = redis.url_from_env(config.url, HPS_REDIS_URL_ENV)
    if not url:
        raise ConfigError("hps.volatile_db.url", f"type {config.type} needs a url "
                          f"(or {HPS_REDIS_URL_ENV})")
    return RedisStore(url, config.capacity, config.overflow_policy,
                      cluster=config.type == "redis_cluster")


# volatile_db.type → the store; a new L2 backend is one class and one line here.
VOLATILE_STORES: dict[str, Callable[[VolatileDbConfig], VolatileStore]] = {
    "hash_map": lambda config: HashMapStore(config.capacity, config.overflow_policy),
    "redis": _redis_store,
    "redis_cluster": _redis_store,
}


def volatile_store(config: VolatileDbConfig) -> VolatileStore:
    """The L2 store the configuration's ``type`` names."""
    return VOLATILE_STORES[config.type](config)
