"""A compiled key → slot index for the L1 cache: open addressing with linear probing (numba).

Lookups of a whole batch run in one compiled loop, so a cache hit costs a hash, a probe or
two and the gather — no Python step per key. When the cache is full, the least used slots
(outside the batch being inserted) are evicted.
"""

from __future__ import annotations

import numba
import numpy as np

# cache=True: compiled once into __pycache__/ beside this file, found again by this file's
# size and time stamp; the cache names the module (featureline.…), so a cache written
# under another module name must not match: editing this file invalidates it.
# An entry is (key, slot) side by side, so a probe reads one cache line; the slot column
# doubles as the state: >= 0 held, EMPTY never used, DELETED a tombstone.
KEY, SLOT = 0, 1
EMPTY, DELETED = -1, -2


@numba.njit(cache=True, inline="always")
def _hash(key: np.int64, mask: np.uint64) -> np.uint64:
    # splitmix64's finaliser: every key bit reaches every hash bit.
    z = np.uint64(key) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))) & mask


@numba.njit(cache=True, inline="always")
def _probe(key, entries, mask):
    """The slot holding ``key``, or -1."""
    position = _hash(key, mask)
    while entries[position, SLOT] != EMPTY:
        if entries[position, SLOT] >= 0 and entries[position, KEY] == key:
            return entries[position, SLOT]
        position = (position + np.uint64(1)) & mask
    return -1


@numba.njit(cache=True, nogil=True)
def _find(keys, entries, uses, count_uses):
    mask = np.uint64(len(entries) - 1)
    out = np.empty(len(keys), dtype=np.int64)
    for i in range(len(keys)):
        slot = _probe(keys[i], entries, mask)
        out[i] = slot
        if count_uses and slot >= 0:
            uses[slot] += 1
    return out


@numba.njit(cache=True, nogil=True)
def _find_gather(keys, entries, uses, store, out):
    """One pass per key: probe, count the use, copy the row (zeros for a miss)."""
    mask = np.uint64(len(entries) - 1)
    hit = np.zeros(len(keys), dtype=np.bool_)
    for i in range(len(keys)):
        slot = _probe(keys[i], entries, mask)
        if slot >= 0:
            uses[slot] += 1
            hit[i] = True
            for j in range(store.shape[1]):
                out[i, j] = store[slot, j]
        else:
            for j in range(store.shape[1]):
                out[i, j] = 0.0
    return hit


@numba.njit(cache=True, nogil=True)
def _insert(keys, slots, entries):
    mask = np.uint64(len(entries) - 1)
    for i in range(len(keys)):
        position = _hash(keys[i], mask)
        while entries[position, SLOT] >= 0:
            position = (position + np.uint64(1)) & mask
        entries[position, KEY] = keys[i]
        entries[position, SLOT] = slots[i]


@numba.njit(cache=True, nogil=True)
def _delete(keys, entries):
    mask = np.uint64(len(entries) - 1)
    deleted = 0
    for i in range(len(keys)):
        position = _hash(keys[i], mask)
        while entries[position, SLOT] != EMPTY:
            if entries[position, SLOT] >= 0 and entries[position, KEY] == keys[i]:
                entries[position, SLOT] = DELETED
                deleted += 1
                break
            position = (position + np.uint64(1)) & mask
    return deleted


class HashIndex:
    """``find`` / ``assign`` like :class:`featureline.hps.slots.SlotIndex`, least-used eviction."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        size = 1 << max(4, int(2 * capacity - 1).bit_length())  # load factor <= 1/2
        self._entries = np.full((size, 2), EMPTY, dtype=np.int64)
        self._slot_key = np.zeros(capacity, dtype=np.int64)
        self._slot_used = np.zeros(capacity, dtype=bool)
        self._uses = np.zeros(capacity, dtype=np.int64)
        self._deleted = 0

    def __len__(self) -> int:
        return int(self._slot_used.sum())

    def find(self, keys: np.ndarray) -> np.ndarray:
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        return _find(keys, self._entries, self._uses, True)

    def find_gather(self, keys: np.ndarray, store: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``find`` and the gather of the found rows of ``store`` in one compiled pass:
        (hit mask, rows; zeros where missed)."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        out = np.empty((len(keys), store.shape[1]), dtype=store.dtype)
        hit = _find_gather(keys, self._entries, self._uses, store, out)
        return hit, out

    def assign(self, keys: np.ndarray) -> np.ndarray:
        """Slots for unique ``keys``, evicting the least used others; at most ``capacity``
        keys are placed — the rest get -1."""
        requested = len(keys)
        keys = np.ascontiguousarray(keys, dtype=np.int64)[: self.capacity]
        slots = _find(keys, self._entries, self._uses, False)
        new = slots < 0
        free = np.flatnonzero(~self._slot_used)
        shortfall = int(new.sum()) - len(free)
        if shortfall > 0:
            uses = self._uses.astype(np.float64)
            uses[slots[~new]] = np.inf  # never evict what this batch needs
            uses[free] = np.inf  # nor a slot that is free already
            victims = np.argpartition(uses, shortfall - 1)[:shortfall]
            self._deleted += _delete(self._slot_key[victims], self._entries)
            self._slot_used[victims] = False
            self._uses[victims] = 0
            free = np.flatnonzero(~self._slot_used)
            if self._deleted > len(self._entries) // 4:
                self._rebuild()
        chosen = free[: int(new.sum())]
        slots[new] = chosen
        self._slot_used[chosen] = True
        self._slot_key[chosen] = keys[new]
        _insert(keys[new], chosen, self._entries)
        return np.concatenate([slots, np.full(requested - len(slots), -1, dtype=np.int64)])

    def _rebuild(self) -> None:
        """Drop the tombstones that deletions leave, so probes stay short."""
        held = np.flatnonzero(self._slot_used)
        self._entries[:] = EMPTY
        self._deleted = 0
        _insert(self._slot_key[held], held, self._entries)


def warm_up() -> None:
    """Load the compiled functions now: the first call in a process loads them from the
    cache (numba's typing registries included), ~0.3 s that a server's first lookup would
    otherwise pay. Cheap once loaded."""
    index = HashIndex(1)
    index.assign(np.array([1]))
    index.assign(np.array([2]))  # evicts the first: the delete path
    index.find_gather(np.array([2]), np.zeros((1, 1), dtype=np.float32))
