"""The persistent database (L3): every key of every table, on disk.

``PersistentStore`` is the interface; ``RocksDBStore`` (rocksdict) keeps one column family
per ``model/table``, int64 keys as 8 big-endian bytes, vectors as raw float32 bytes.

RocksDB lets one process open a folder. Serving workers of one host (``featureline serve
--workers N``) each open the first free replica — the configured folder, else
``<folder>.worker-1``, ``.worker-2``, … (:meth:`RocksDBStore.first_free`) — and each holds a
full copy, imported from the table sources on its first start and kept across restarts.
"""

from __future__ import annotations

import gc
import logging
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np
from rocksdict import Options, Rdict, WriteBatch

from featureline.hps.config import PersistentDbConfig, TableConfig
from featureline.hps.errors import PersistentStoreBusyError, PersistentStoreError
from featureline.hps.formats import key_bytes, read_table

logger = logging.getLogger("featureline.hps")

WRITE_BATCH_ROWS = 100_000
# Replica folders a host's workers may use beside the configured one.
MAX_REPLICAS = 64
# In the default column family: table → the fingerprint of the source it holds whole.
IMPORT_MARK = b"featureline:import:"


class PersistentStore(ABC):
    @abstractmethod
    def insert(self, table: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Insert or overwrite ``keys``."""

    @abstractmethod
    def lookup(self, table: str, keys: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
        """(found mask, vectors) for ``keys``; rows of missing keys are zeros."""

    @abstractmethod
    def size(self, table: str) -> int:
        """Keys stored for ``table``."""

    @abstractmethod
    def import_mark(self, table: str) -> str | None:
        """The fingerprint of the source ``table`` was last imported whole from; None when
        it never was (or an import did not finish)."""

    @abstractmethod
    def set_import_mark(self, table: str, mark: str) -> None:
        """Record that ``table`` now holds the whole source ``mark`` fingerprints."""

    @abstractmethod
    def drop(self, table: str) -> None:
        """Remove every key of ``table``."""

    def compact(self, table: str) -> None:  # noqa: B027 - stores that need no compaction
        """Settle ``table`` after a bulk import, so lookups do not race background work."""

    def close(self) -> None:  # noqa: B027 - stores without resources need nothing
        """Release files and handles."""

    @property
    def replica(self) -> str:
        """Which copy of the tables this store is, among a host's serving processes."""
        return "default"

    @property
    def damaged(self) -> bool:
        """Whether a read found a file damaged (the store must be rebuilt to be whole)."""
        return False

    @property
    def rebuildable(self) -> bool:
        """Whether the server can rebuild this store in place from the table sources
        (``emptied``, ``rebuilt_beside``, ``swapped_with``); else it is restored from a
        backup."""
        return False

    def emptied(self) -> PersistentStore:
        """Close this (damaged) store, remove its data, and open an empty one in its place."""
        raise NotImplementedError(f"{type(self).__name__} cannot be rebuilt in place")

    def rebuilt_beside(self) -> PersistentStore:
        """An empty store beside this one, to import the tables into while this one serves."""
        raise NotImplementedError(f"{type(self).__name__} cannot be rebuilt in place")

    def swapped_with(self, rebuilt: PersistentStore
                     ) -> tuple[PersistentStore, Callable[[], None]]:
        """Close this store and ``rebuilt``; put ``rebuilt``'s data in this one's place and
        open it there. Returns the store, and what removes the old data (called once no
        lookup waits for the swap)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be rebuilt in place")


class RocksDBStore(PersistentStore):
    @classmethod
    def first_free(cls, path: str | Path, replicas: int = MAX_REPLICAS) -> RocksDBStore:
        """The store at ``path``, or at the first replica folder no other process holds."""
        candidates = [Path(path), *(Path(f"{path}.worker-{k}") for k in range(1, replicas))]
        for candidate in candidates:
            try:
                return cls(candidate)
            except Exception as exc:  # rocksdict raises a bare Exception for a held LOCK
                if "lock" not in str(exc).lower():
                    raise
        raise PersistentStoreBusyError(str(path), replicas)

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        existing = Rdict.list_cf(str(self.path), options) if (self.path / "CURRENT").exists() \
            else ["default"]
        families = {name: Options(raw_mode=True) for name in existing if name != "default"}
        self._db = Rdict(str(self.path), options=options, column_families=families or None)
        self._families = {name: self._db.get_column_family(name) for name in families}
        self._sizes: dict[str, int] = {}
        self._damaged = False

    @property
    def replica(self) -> str:
        return self.path.name

    @property
    def damaged(self) -> bool:
        return self._damaged

    @property
    def rebuildable(self) -> bool:
        return True

    def emptied(self) -> RocksDBStore:
        logger.warning("%s is damaged: importing every table again", self.path)
        self.close()
        shutil.rmtree(_set_aside(self.path), ignore_errors=True)
        return RocksDBStore(self.path)

    def rebuilt_beside(self) -> RocksDBStore:
        path = self.path.with_name(f"{self.path.name}.rebuild")
        shutil.rmtree(path, ignore_errors=True)
        return RocksDBStore(path)

    def swapped_with(self, rebuilt: PersistentStore
                     ) -> tuple[RocksDBStore, Callable[[], None]]:
        assert isinstance(rebuilt, RocksDBStore)  # made by rebuilt_beside
        self.close()
        rebuilt.close()
        aside = _set_aside(self.path)
        rebuilt.path.rename(self.path)
        return RocksDBStore(self.path), lambda: shutil.rmtree(aside, ignore_errors=True)

    def _family(self, table: str) -> Rdict:
        if table not in self._families:
            self._db.create_column_family(table, Options(raw_mode=True))
            self._families[table] = self._db.get_column_family(table)
        return self._families[table]

    def insert(self, table: str, keys: np.ndarray, vectors: np.ndarray) -> None:
        self._family(table)
        handle = self._db.get_column_family_handle(table)
        values = np.ascontiguousarray(vectors, dtype="<f4")
        row_bytes = values.shape[1] * 4
        for start in range(0, len(keys), WRITE_BATCH_ROWS):
            stop = min(start + WRITE_BATCH_ROWS, len(keys))
            raw = values[start:stop].tobytes()
            batch = WriteBatch(raw_mode=True)
            for index, key in enumerate(key_bytes(keys[start:stop])):
                batch.put(key, raw[index * row_bytes:(index + 1) * row_bytes], handle)
            self._db.write(batch)
        self._sizes.pop(table, None)

    def import_mark(self, table: str) -> str | None:
        mark = self._db.get(IMPORT_MARK + table.encode())
        return mark.decode() if mark is not None else None

    def set_import_mark(self, table: str, mark: str) -> None:
        self._db.put(IMPORT_MARK + table.encode(), mark.encode())

    def drop(self, table: str) -> None:
        if table in self._families:
            del self._families[table]
            self._db.drop_column_family(table)
        self._db.delete(IMPORT_MARK + table.encode())
        self._sizes.pop(table, None)

    def compact(self, table: str) -> None:
        # A bulk import leaves many level-0 files; compacting them now, in the foreground,
        # keeps that work from competing with the first lookups and shortens reads.
        self._family(table).compact_range(None, None)

    def lookup(self, table: str, keys: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
        found = np.zeros(len(keys), dtype=bool)
        vectors = np.zeros((len(keys), dim), dtype=np.float32)
        if table not in self._families or not len(keys):
            return found, vectors
        # rocksdict's stub takes a list of any key type; ours are bytes (no copy made).
        batch = cast(list[str | int | float | bytes | bool], key_bytes(keys))
        try:
            values = self._families[table].get(batch) or []
        except Exception as exc:  # rocksdict raises a bare Exception ("Corruption: ...")
            raise self._unreadable(table, exc) from exc
        for index, value in enumerate(values):
            if value is not None:
                found[index] = True
                vectors[index] = np.frombuffer(value, dtype="<f4")
        return found, vectors

    def _unreadable(self, table: str, error: object) -> PersistentStoreError:
        # The full message names the file and offset: logged, not answered.
        logger.error("%s: reading %s failed: %s", self.path, table, error)
        self._damaged = self._damaged or "corruption" in str(error).lower()
        return PersistentStoreError(self.replica, "a file of the store cannot be read"
                                    + ("; rebuilding it from the table sources"
                                       if self._damaged else ""))

    def size(self, table: str) -> int:
        if table not in self._families:
            return 0
        if table not in self._sizes:
            iterator = self._families[table].iter()
            iterator.seek_to_first()
            count = 0
            while iterator.valid():
                count += 1
                iterator.next()
            try:
                iterator.status()  # an iterator stops at a damaged block; this raises
            except Exception as exc:
                raise self._unreadable(table, exc) from exc
            finally:
                del iterator
            self._sizes[table] = count
        return self._sizes[table]

    def close(self) -> None:
        self._families.clear()
        gc.collect()  # column-family objects hold the database lock until collected
        self._db.close()


def _set_aside(folder: Path) -> Path:
    """Move a damaged replica folder out of the way (to ``<folder>.damaged``) and return
    where it went, so its path is free at once and the removal can follow."""
    aside = folder.with_name(f"{folder.name}.damaged")
    shutil.rmtree(aside, ignore_errors=True)
    folder.rename(aside)
    return aside


# persistent_db.type → the store; a new L3 backend is one class and one line here.
PERSISTENT_STORES: dict[str, Callable[[PersistentDbConfig], PersistentStore]] = {
    "rocksdb": lambda config: RocksDBStore.first_free(config.path),
}


def persistent_store(config: PersistentDbConfig) -> PersistentStore:
    """The L3 store the configuration's ``type`` names."""
    return PERSISTENT_STORES[config.type](config)


def import_table(store: PersistentStore, key: str, config: TableConfig,
                 mark: str) -> tuple[np.ndarray, np.ndarray]:
    """Write the whole of the table's source into ``store``, then its import mark."""
    assert config.source is not None
    keys, vectors = read_table(config.source, config.format, config.dim)
    write_table(store, key, keys, vectors, mark)
    return keys, vectors


def write_table(store: PersistentStore, key: str, keys: np.ndarray, vectors: np.ndarray,
                mark: str) -> None:
    """``keys`` and ``vectors`` as the whole of table ``key``, marked as source ``mark``."""
    store.insert(key, keys, vectors)
    store.compact(key)
    store.set_import_mark(key, mark)
