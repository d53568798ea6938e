"""``ParameterServer``: lookups that cascade L1 cache → L2 volatile → L3 persistent → default.

Missed keys found lower down are inserted into the tiers above them — before the lookup
returns while the table's running L1 hit rate is below ``hit_rate_threshold``, in a
background thread above it (HugeCTR's policy: a warm cache answers at once). Lookups and
insertions of one table are serialised by a lock, so a reader never sees a vector
half-written by an insertion.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from featureline.core import redis
from featureline.core.errors import ConfigError
from featureline.hps.cache import EmbeddingCache, make_cache
from featureline.hps.config import (
    HpsConfig,
    ModelConfig,
    TableConfig,
    VolatileDbConfig,
    load_hps_config,
    sources_written,
)
from featureline.hps.errors import PersistentStoreError, UnknownModelError, UnknownTableError
from featureline.hps.formats import fingerprint, read_table
from featureline.hps.hash_index import warm_up
from featureline.hps.persistent import PersistentStore, RocksDBStore
from featureline.hps.volatile import HashMapStore, RedisStore, VolatileStore

logger = logging.getLogger("featureline.hps")

# The L2 cache's Redis: its own keyspace and memory policy, apart from the online store's.
HPS_REDIS_URL_ENV = "HPS_REDIS_URL"

TIERS = ("l1", "l2", "l3", "default")
# Upper bounds (seconds) of the lookup latency histogram buckets, Prometheus style.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 1.0, math.inf)


_NO_INDEX = np.zeros(0, dtype=np.int64)
_NO_FLAGS = np.zeros(0, dtype=bool)
# Weight of the newest lookup in the running L1 hit rate.
HIT_RATE_SMOOTHING = 0.1


@dataclass
class TableStats:
    """Keys answered by each tier, insertions by mode, and the lookup latency histogram."""

    answered: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    latency_counts: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))
    lookups: int = 0
    running_hit_rate: float = 0.0
    insertions: dict[str, int] = field(default_factory=lambda: {"sync": 0, "async": 0})

    def hit_rate(self, tier: str = "l1") -> float:
        total = sum(self.answered.values())
        return self.answered[tier] / total if total else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"lookups": self.lookups, "keys_by_tier": dict(self.answered),
                "l1_hit_rate": self.hit_rate("l1"), "running_l1_hit_rate": self.running_hit_rate,
                "insertions": dict(self.insertions),
                "latency_buckets_s": [str(b) for b in LATENCY_BUCKETS],
                "latency_counts": list(self.latency_counts)}


def table_key(model: str, table: str) -> str:
    """How the persistent store names a table (its column family in RocksDB)."""
    return f"{model}/{table}"


def cache_key(model: str, config: TableConfig) -> str:
    """How the L2 cache, which processes share, names a table: with its width, so processes
    serving two widths of one table (a rollout after the embedding plan widened it) never
    read each other's vectors."""
    return f"{table_key(model, config.name)}@{config.dim}"


@dataclass
class Table:
    model: str
    config: TableConfig
    cache: EmbeddingCache
    size: int
    hit_rate_threshold: float
    stats: TableStats = field(default_factory=TableStats)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Bumped by every update: a background insertion of vectors read before it is dropped,
    # so it can never write an older value over a newer one.
    generation: int = 0
    # Set when a reload replaced the table (a new width) or removed it: a lookup that waited
    # for this entry's lock goes to the table's current entry instead.
    retired: bool = False

    @property
    def key(self) -> str:
        return table_key(self.model, self.config.name)

    @property
    def cache_key(self) -> str:
        return cache_key(self.model, self.config)


def volatile_store(config: VolatileDbConfig) -> VolatileStore:
    """The L2 store the configuration's ``type`` names."""
    if config.type in ("redis", "redis_cluster"):
        url = redis.url_from_env(config.url, HPS_REDIS_URL_ENV)
        if not url:
            raise ConfigError("hps.volatile_db.url", f"type {config.type} needs a url "
                              f"(or {HPS_REDIS_URL_ENV})")
        return RedisStore(url, config.capacity, config.overflow_policy,
                          cluster=config.type == "redis_cluster")
    return HashMapStore(config.capacity, config.overflow_policy)


def _set_aside(folder: Path) -> Path:
    """Move a damaged replica folder out of the way (to ``<folder>.damaged``) and return
    where it went, so its path is free at once and the removal can follow."""
    aside = folder.with_name(f"{folder.name}.damaged")
    shutil.rmtree(aside, ignore_errors=True)
    folder.rename(aside)
    return aside


class ParameterServer:
    def __init__(self, config: HpsConfig, persistent: PersistentStore | None = None,
                 volatile: VolatileStore | None = None, config_path: Path | None = None
                 ) -> None:
        self.config = config
        # The file the configuration came from: a reload reads its model's tables there again.
        self.config_path = config_path
        self.persistent = persistent or RocksDBStore.first_free(config.persistent_db.path)
        self.volatile = volatile or volatile_store(config.volatile_db)
        # How many times L3 was imported again from the sources (a damaged replica): update
        # consumers then replay what the sources do not hold (hps/updates.py).
        self.rebuilds = 0
        try:
            self.tables = self._load_all()
        except PersistentStoreError:
            # Found damaged while opening (a restart after a disk fault): start from an empty
            # replica, imported again from the sources, when every table has one.
            if not isinstance(self.persistent, RocksDBStore) or not self.persistent.damaged:
                raise
            unsourced = [f"{m.name}/{t.name}" for m in config.models for t in m.tables
                         if t.source is None]
            if unsourced:
                raise
            self.persistent = self._emptied(self.persistent)
            self.tables = self._load_all()
            self.rebuilds += 1
        warm_up()  # the cache index's compiled code, loaded before the first lookup
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hps-insert")
        self._pending: list[Future[None]] = []
        self._repair_lock = threading.Lock()
        # One reload at a time (the admin route and announcements from other processes).
        self._reload_lock = threading.Lock()
        self._repairing: threading.Thread | None = None

    def _load_all(self) -> dict[str, dict[str, Table]]:
        return {model.name: {table.name: self._load(model.name, table, model.cache_fraction,
                                                    model.hit_rate_threshold)
                             for table in model.tables}
                for model in self.config.models}

    @staticmethod
    def _emptied(damaged: RocksDBStore) -> RocksDBStore:
        """Close a damaged replica, remove it, and open an empty one in its place."""
        logger.warning("%s is damaged: importing every table again", damaged.path)
        damaged.close()
        shutil.rmtree(_set_aside(damaged.path), ignore_errors=True)
        return RocksDBStore(damaged.path)

    @classmethod
    def from_config(cls, path: str | Path) -> ParameterServer:
        return cls(load_hps_config(path), config_path=Path(path))

    def _load(self, model: str, config: TableConfig, cache_fraction: float,
              hit_rate_threshold: float) -> Table:
        key = table_key(model, config.name)
        size = self.persistent.size(key)
        source = (fingerprint(config.source, config.format) if config.source is not None
                  else None)
        # All or nothing: a table is imported again unless the store holds the whole of this
        # very source (an import a crash cut short left no mark; a newer source another).
        imported = self.persistent.import_mark(key)
        if source is not None and imported != source:
            if size:
                logger.warning("%s: importing %s again (%s)", key, config.source,
                               "its source changed" if imported else "no finished import")
                self.persistent.drop(key)
            keys, vectors = self._import(self.persistent, key, config, source)
            size = len(keys)  # read_table rejects duplicate keys
            self._warm(model, config, keys, vectors)
        return self._entry(model, config, size, cache_fraction, hit_rate_threshold)

    def _entry(self, model: str, config: TableConfig, size: int, cache_fraction: float,
               hit_rate_threshold: float) -> Table:
        capacity = max(1, math.ceil(size * cache_fraction))
        cache = make_cache(capacity, config.dim, self.config.cache_device)
        return Table(model, config, cache, size, hit_rate_threshold)

    def _warm(self, model: str, config: TableConfig, keys: np.ndarray,
              vectors: np.ndarray) -> None:
        """Put the first ``initial_cache_rate`` of a table just imported into L2."""
        warm = int(len(keys) * self.config.volatile_db.initial_cache_rate)
        if warm:
            self.volatile.insert(cache_key(model, config), keys[:warm], vectors[:warm])

    @staticmethod
    def _import(store: PersistentStore, key: str, config: TableConfig,
                mark: str) -> tuple[np.ndarray, np.ndarray]:
        """Write the whole of the table's source into ``store``, then its import mark."""
        assert config.source is not None
        keys, vectors = read_table(config.source, config.format, config.dim)
        ParameterServer._write(store, key, keys, vectors, mark)
        return keys, vectors

    @staticmethod
    def _write(store: PersistentStore, key: str, keys: np.ndarray, vectors: np.ndarray,
               mark: str) -> None:
        store.insert(key, keys, vectors)
        store.compact(key)
        store.set_import_mark(key, mark)

    @property
    def repairing(self) -> bool:
        return self._repairing is not None and self._repairing.is_alive()

    def _start_repair(self) -> None:
        with self._repair_lock:
            if not self.repairing:
                self._repairing = threading.Thread(target=self._repair, name="hps-repair",
                                                   daemon=True)
                self._repairing.start()

    def _repair(self) -> None:
        """Rebuild a damaged RocksDB replica from the table sources beside it, then swap it
        in (docs/ARCHITECTURE.md, "Faults"). Until then lookups that need a damaged file
        are answered 503 and ``health()`` reports L3 down. Vectors of online updates since
        the import are not in the sources: the model's update consumers replay them from the
        stream once ``rebuilds`` has grown (hps/updates.py)."""
        damaged = self.persistent
        entries = [entry for tables in self.tables.values() for entry in tables.values()]
        unsourced = [entry.key for entry in entries if entry.config.source is None]
        if not isinstance(damaged, RocksDBStore) or unsourced:
            logger.error("%s is damaged and cannot be rebuilt here (%s): restore it from a "
                         "backup", damaged.replica,
                         f"no source for {', '.join(unsourced)}" if unsourced else "not ours")
            return
        started = time.monotonic()
        rebuilt_path = damaged.path.with_name(f"{damaged.path.name}.rebuild")
        shutil.rmtree(rebuilt_path, ignore_errors=True)
        rebuilt = RocksDBStore(rebuilt_path)
        try:
            for entry in entries:
                assert entry.config.source is not None
                self._import(rebuilt, entry.key, entry.config,
                             fingerprint(entry.config.source, entry.config.format))
        finally:
            rebuilt.close()
        with contextlib.ExitStack() as held:
            for entry in entries:
                held.enter_context(entry.lock)
            damaged.close()
            aside = _set_aside(damaged.path)
            rebuilt_path.rename(damaged.path)
            self.persistent = RocksDBStore(damaged.path)
            for entry in entries:
                entry.size = self.persistent.size(entry.key)
            self.rebuilds += 1
        shutil.rmtree(aside, ignore_errors=True)
        logger.warning("%s was damaged: rebuilt from the table sources in %.1fs",
                       damaged.path, time.monotonic() - started)

    def sources_written(self, model: str) -> float | None:
        """When the newest file of the model's table sources was written (seconds since the
        epoch); None when a table has no source."""
        if model not in self.tables:
            raise UnknownModelError(model, list(self.tables))
        return sources_written(entry.config for entry in self.tables[model].values())

    def table(self, model: str, table: str) -> Table:
        if model not in self.tables:
            raise UnknownModelError(model, list(self.tables))
        if table not in self.tables[model]:
            raise UnknownTableError(model, table, list(self.tables[model]))
        return self.tables[model][table]

    def lookup(self, model: str, table: str, keys: np.ndarray | list[int]) -> np.ndarray:
        """Vectors of ``keys`` in request order, shape ``[len(keys), dim]``; duplicates and
        unknown keys allowed (unknown ones get the table's default vector)."""
        started = time.perf_counter()
        keys = np.asarray(keys, dtype=np.int64).ravel()
        with self._current(model, table) as entry:
            dim = entry.config.dim
            # L1 answers duplicates as they come; only its misses are de-duplicated.
            hit1, vectors = entry.cache.lookup(keys)
            stats = entry.stats
            hits = int(np.count_nonzero(hit1))
            rate = hits / len(keys) if len(keys) else 1.0
            stats.running_hit_rate += HIT_RATE_SMOOTHING * (rate - stats.running_hit_rate)
            if hits == len(keys):  # the hot path: nothing below L1 to ask or insert
                self._record(stats, hits, _NO_INDEX, _NO_FLAGS, _NO_FLAGS,
                             time.perf_counter() - started)
                return vectors
            unique, inverse = np.unique(keys[~hit1], return_inverse=True)
            below = np.full((len(unique), dim), entry.config.default_value, dtype=np.float32)
            found3 = np.zeros(len(unique), dtype=bool)
            found2, from_volatile = self.volatile.lookup(entry.cache_key, unique, dim)
            below[found2] = from_volatile[found2]
            still = ~found2
            if still.any():
                try:
                    hit3, from_disk = self.persistent.lookup(entry.key, unique[still], dim)
                except PersistentStoreError:
                    if self.persistent.damaged:
                        self._start_repair()
                    raise
                found3[still] = hit3
                below[found3] = from_disk[hit3]
            vectors[~hit1] = below[inverse]
            upper = found2 | found3
            if upper.any():
                insertion = (unique[upper], below[upper], unique[found3], below[found3])
                if stats.running_hit_rate < entry.hit_rate_threshold:
                    self._insert(entry, *insertion)
                    stats.insertions["sync"] += 1
                else:
                    self._queue(self._background.submit(self._insert_locked, entry,
                                                        entry.generation, *insertion))
                    stats.insertions["async"] += 1
            self._record(stats, hits, inverse, found2, found3,
                         time.perf_counter() - started)
        return vectors

    def _insert(self, entry: Table, cache_keys: np.ndarray, cache_vectors: np.ndarray,
                volatile_keys: np.ndarray, volatile_vectors: np.ndarray) -> None:
        if len(volatile_keys):
            self.volatile.insert(entry.cache_key, volatile_keys, volatile_vectors)
        entry.cache.insert(cache_keys, cache_vectors)

    def _insert_locked(self, entry: Table, generation: int, *insertion: np.ndarray) -> None:
        with entry.lock:
            if entry.generation == generation:  # else an update came after the read
                self._insert(entry, *insertion)

    @contextlib.contextmanager
    def _current(self, model: str, table: str) -> Iterator[Table]:
        """The table's entry, locked; one a reload retired while we waited for its lock is
        let go for the entry that replaced it."""
        while True:
            entry = self.table(model, table)
            with entry.lock:
                if not entry.retired:
                    yield entry
                    return

    def apply_update(self, model: str, table: str, keys: np.ndarray,
                     vectors: np.ndarray) -> None:
        """New values for ``keys``: written to L3 and L2, refreshed where L1 holds them."""
        keys = np.asarray(keys, dtype=np.int64).ravel()
        vectors = np.asarray(vectors, dtype=np.float32)
        # The last value of a key repeated within one update wins.
        unique, last = np.unique(keys[::-1], return_index=True)
        rows = vectors[::-1][last]
        with self._current(model, table) as entry:
            if vectors.shape != (len(keys), entry.config.dim):
                raise ValueError(f"{entry.key}: update of shape {vectors.shape}, expected "
                                 f"({len(keys)}, {entry.config.dim})")
            entry.generation += 1
            self.persistent.insert(entry.key, unique, rows)
            self.volatile.insert(entry.cache_key, unique, rows)
            entry.cache.refresh(unique, rows)

    def reload(self, model: str) -> dict[str, int]:
        """Read the model's settings and table sources again and apply them: the rows of a
        table whose width is unchanged as an update (L3, L2, L1); a table the configuration
        widened, or added, imported whole into a new entry that then replaces it (lookups of it
        wait for the import); a table the configuration no longer lists, removed.

        The settings come from the configuration file again when the server was opened from
        one (``from_config``; the daily chain's train step rewrites it), so a new width or
        vocabulary version is served without a restart; server-wide settings (tiers, cache
        device) still need one. Keys that left a source stay in L3. Every source is read
        (and checked) before any table changes, so a source that cannot be read, or a
        configuration that does not load, leaves all of them as they were. Returns the rows
        read per table.
        """
        with self._reload_lock:
            return self._reload(model)

    def _reload(self, model: str) -> dict[str, int]:
        settings = self._model_settings(model)
        served = self.tables[model]
        for config in settings.tables:
            entry = served.get(config.name)
            if config.source is None and (entry is None or entry.config.dim != config.dim):
                raise ConfigError(f"hps.models.{model}.tables.{config.name}",
                                  "a table without a source can be added or change width only "
                                  "by a restart with an empty persistent store")
        sources = {}
        for config in settings.tables:
            if config.source is not None:
                mark = fingerprint(config.source, config.format)
                sources[config.name] = (config, mark,
                                        *read_table(config.source, config.format, config.dim))
        for name, (config, mark, keys, vectors) in sources.items():
            entry = served.get(name)
            if entry is not None and entry.config.dim == config.dim:
                with entry.lock:
                    entry.config = config  # its vocabulary version, source, default value
                self.apply_update(model, name, keys, vectors)
                self.persistent.set_import_mark(entry.key, mark)
                entry.size = self.persistent.size(entry.key)
            else:
                self._replace(model, settings, config, entry, mark, keys, vectors)
        for name in [n for n in served if n not in {t.name for t in settings.tables}]:
            with served[name].lock:
                served[name].retired = True
                self._serve(model, name, None)
        self.config = self.config.model_copy(update={"models": [
            settings if m.name == model else m for m in self.config.models]})
        return {name: len(keys) for name, (_, _, keys, _) in sources.items()}

    def _model_settings(self, model: str) -> ModelConfig:
        """The model's settings as they are now: read again from the configuration file when
        there is one."""
        if model not in self.tables:
            raise UnknownModelError(model, list(self.tables))
        config = load_hps_config(self.config_path) if self.config_path else self.config
        settings = next((m for m in config.models if m.name == model), None)
        if settings is None:
            raise ConfigError("hps.models", f"{self.config_path}: model {model!r} is no longer "
                              "configured; it is served as it was until a restart")
        return settings

    def _replace(self, model: str, settings: ModelConfig, config: TableConfig,
                 entry: Table | None, mark: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Import a table whole into L3 and serve it from a new entry (a new L1 of its width;
        L2 names it with its width, ``cache_key``), retiring the entry it replaces."""
        key = table_key(model, config.name)
        new = self._entry(model, config, len(keys), settings.cache_fraction,
                          settings.hit_rate_threshold)
        with entry.lock if entry is not None else contextlib.nullcontext():
            self.persistent.drop(key)
            self._write(self.persistent, key, keys, vectors, mark)
            self._warm(model, config, keys, vectors)
            self._serve(model, config.name, new)
            if entry is not None:
                entry.retired = True
                entry.generation += 1  # its queued background insertions are dropped

    def _serve(self, model: str, name: str, entry: Table | None) -> None:
        """Serve ``entry`` as the table (None: no longer serve it). The model's tables are
        replaced, not changed, so a thread iterating them (stats, health) never sees them
        change size."""
        tables = {n: t for n, t in self.tables[model].items() if n != name}
        self.tables[model] = tables if entry is None else {**tables, name: entry}

    def _queue(self, future: Future[None]) -> None:
        still_running = []
        for queued in self._pending:
            if not queued.done():
                still_running.append(queued)
            elif queued.exception() is not None:
                logger.error("background insertion failed: %s", queued.exception())
        self._pending = [*still_running, future]

    def wait_for_insertions(self) -> None:
        """Block until the background insertions queued so far are done."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    @staticmethod
    def _record(stats: TableStats, l1_hits: int, inverse: np.ndarray, found2: np.ndarray,
                found3: np.ndarray, seconds: float) -> None:
        """Count each requested key under the tier that answered it."""
        below = np.select([found2, found3], [1, 2], default=3)[inverse]
        counts = np.bincount(below, minlength=4)
        counts[0] = l1_hits
        for tier, count in zip(TIERS, counts, strict=True):
            stats.answered[tier] += int(count)
        stats.lookups += 1
        bucket = next(i for i, bound in enumerate(LATENCY_BUCKETS) if seconds <= bound)
        stats.latency_counts[bucket] += 1

    def health(self) -> dict[str, bool]:
        """Whether each lower tier answers: L2 (False while its circuit breaker is open) and
        L3 (a read of the persistent store)."""
        try:
            for model, tables in self.tables.items():
                for name in tables:
                    self.persistent.import_mark(table_key(model, name))
            persistent = not self.repairing
        except Exception:  # any failure of the store's own read is "not answering"
            logger.exception("persistent store unavailable")
            persistent = False
        return {"l2": self.volatile.available, "l3": persistent}

    def stats(self) -> dict[str, Any]:
        return {model: {name: {"dim": t.config.dim, "keys": t.size,
                               "vocabulary_version": t.config.vocabulary_version,
                               "cache": {"device": t.cache.device, "capacity": t.cache.capacity,
                                         "held": len(t.cache)},
                               **t.stats.to_json()}
                        for name, t in tables.items()}
                for model, tables in self.tables.items()}

    def close(self) -> None:
        if self._repairing is not None:
            self._repairing.join()
        self.wait_for_insertions()
        self._background.shutdown()
        self.persistent.close()
