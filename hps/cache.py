"""The embedding cache (L1): a fixed share of a table in GPU memory (CuPy), or host memory.

``EmbeddingCache`` is the interface. ``HostCache`` keeps vectors in numpy; ``GpuCache`` in
CuPy device memory (imported only when asked for, so machines without a GPU never load
it). ``make_cache(device="auto")`` picks the GPU when CuPy sees one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from featureline.hps.hash_index import HashIndex

Device = Literal["auto", "cpu", "gpu"]


class EmbeddingCache(ABC):
    device: str

    def __init__(self, capacity: int, dim: int) -> None:
        self.capacity = capacity
        self.dim = dim
        self.index = HashIndex(capacity)

    @abstractmethod
    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(hit mask, host vectors) for unique ``keys``; rows of misses are zeros."""

    @abstractmethod
    def insert(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Cache unique ``keys`` (evicting the least used when full)."""

    @abstractmethod
    def refresh(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Overwrite the vectors of those unique ``keys`` the cache holds; add none."""

    def __len__(self) -> int:
        return len(self.index)


class HostCache(EmbeddingCache):
    device = "cpu"

    def __init__(self, capacity: int, dim: int) -> None:
        super().__init__(capacity, dim)
        self._vectors = np.zeros((capacity, dim), dtype=np.float32)

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.index.find_gather(keys, self._vectors)

    def insert(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        slots = self.index.assign(keys)
        placed = slots >= 0
        self._vectors[slots[placed]] = vectors[placed]

    def refresh(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        slots = self.index.find(keys)
        held = slots >= 0
        self._vectors[slots[held]] = vectors[held]


class GpuCache(EmbeddingCache):
    device = "gpu"

    def __init__(self, capacity: int, dim: int) -> None:
        import cupy
        import cupyx

        super().__init__(capacity, dim)
        self._cupy: Any = cupy
        self._empty_pinned: Any = cupyx.empty_pinned
        self._vectors = cupy.zeros((capacity, dim), dtype=cupy.float32)

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        slots = self.index.find(keys)
        hit = slots >= 0
        # The whole batch is gathered on the device (misses read row 0, then zeroed there) and
        # copied out once, into page-locked host memory from CuPy's pool: a copy from pageable
        # memory and host-side masking cost several times the gather (benchmarks/README.md).
        on_device = self._cupy.asarray(slots)
        gathered = self._vectors.take(self._cupy.maximum(on_device, 0), axis=0)
        if not hit.all():
            gathered[on_device < 0] = 0.0
        vectors = self._empty_pinned((len(keys), self.dim), dtype=np.float32)
        gathered.get(out=vectors)
        return hit, vectors

    def insert(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        slots = self.index.assign(keys)
        placed = slots >= 0
        if placed.any():
            self._vectors[self._cupy.asarray(slots[placed])] = self._cupy.asarray(
                vectors[placed])

    def refresh(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        slots = self.index.find(keys)
        held = slots >= 0
        if held.any():
            self._vectors[self._cupy.asarray(slots[held])] = self._cupy.asarray(vectors[held])


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device: all mean "no GPU here"
        return False


# cache_device → the L1 cache; a new L1 backend is one class and one line here.
L1_CACHES: dict[str, Callable[[int, int], EmbeddingCache]] = {"cpu": HostCache, "gpu": GpuCache}


def make_cache(capacity: int, dim: int, device: Device = "auto") -> EmbeddingCache:
    """The L1 cache ``device`` names; ``auto``: the GPU's when one answers, else the host's."""
    if device == "auto":
        device = "gpu" if gpu_available() else "cpu"
    return L1_CACHES[device](capacity, dim)
