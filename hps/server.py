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
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from featureline.hps.cache import make_cache
from featureline.hps.config import (
    HpsConfig,
    TableConfig,
    load_hps_config,
    sources_written,
)
from featureline.hps.errors import PersistentStoreError, UnknownModelError, UnknownTableError
from featureline.hps.formats import fingerprint
from featureline.hps.hash_index import warm_up
from featureline.hps.persistent import PersistentStore, import_table, persistent_store
from featureline.hps.reload import Reloads
from featureline.hps.repair import Repairs
from featureline.hps.table import Table, cache_key, record, table_key, tables_stats
from featureline.hps.volatile import VolatileStore, volatile_store

logger = logging.getLogger("featureline.hps")


_NO_INDEX = np.zeros(0, dtype=np.int64)
_NO_FLAGS = np.zeros(0, dtype=bool)
# Weight of the newest lookup in the running L1 hit rate.
HIT_RATE_SMOOTHING = 0.1


class ParameterServer(Reloads, Repairs):
    def __init__(self, config: HpsConfig, persistent: PersistentStore | None = None,
                 volatile: VolatileStore | None = None, config_path: Path | None = None
                 ) -> None:
        self.config = config
        # The file the configuration came from: a reload reads its model's tables there again.
        self.config_path = config_path
        self.persistent = persistent or persistent_store(config.persistent_db)
        self.volatile = volatile or volatile_store(config.volatile_db)
        # How many times L3 was imported again from the sources (a damaged replica): update
        # consumers then replay what the sources do not hold (hps/updates.py).
        self.rebuilds = 0
        try:
            self.tables = self._load_all()
        except PersistentStoreError:
            # Found damaged while opening (a restart after a disk fault): start from an empty
            # replica, imported again from the sources, when every table has one.
            if not (self.persistent.damaged and self.persistent.rebuildable):
                raise
            unsourced = [f"{m.name}/{t.name}" for m in config.models for t in m.tables
                         if t.source is None]
            if unsourced:
                raise
            self.persistent = self.persistent.emptied()
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
            keys, vectors = import_table(self.persistent, key, config, source)
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
                record(stats, hits, _NO_INDEX, _NO_FLAGS, _NO_FLAGS,
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
            record(stats, hits, inverse, found2, found3,
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
        return tables_stats(self.tables)

    def close(self) -> None:
        if self._repairing is not None:
            self._repairing.join()
        self.wait_for_insertions()
        self._background.shutdown()
        self.persistent.close()
