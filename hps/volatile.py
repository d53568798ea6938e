"""The volatile database (L2): a bounded in-memory copy of the hot part of each table.

``VolatileStore`` is the interface; ``HashMapStore`` is the in-process hash map (the local
default). The Redis store of the issue is not here yet.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from hps.slots import OverflowPolicy, SlotIndex


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
