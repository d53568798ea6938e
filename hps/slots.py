"""The key → slot index of the in-process hash map (L2), with its overflow policy.

The vectors live in the store's array; this only decides which slot holds which key and
which keys leave when the store is full. (The L1 cache uses the compiled
:class:`featureline.hps.hash_index.HashIndex`.)
"""

from __future__ import annotations

from typing import Literal

import numpy as np

OverflowPolicy = Literal["evict_oldest", "evict_random", "evict_least_used"]


class SlotIndex:
    def __init__(self, capacity: int, policy: OverflowPolicy = "evict_oldest",
                 seed: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.policy = policy
        self._slots: dict[int, int] = {}  # insertion-ordered: the first key is the oldest
        # Free slots: those evictions gave back (reused first, last in first out), then the
        # never used [_unused, capacity). Not a list of every free slot: at the default 10M
        # that list held 10M ints (~360 MB), and the collector's full passes walked it
        # (~50 ms each: the API's p99).
        self._released: list[int] = []
        self._unused = 0
        self._uses = np.zeros(capacity, dtype=np.int64)
        self._rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self._slots)

    def find(self, keys: np.ndarray) -> np.ndarray:
        """The slot of each key, -1 where absent; counts a use of each slot found."""
        get = self._slots.get
        slots = np.fromiter((get(k, -1) for k in keys.tolist()), dtype=np.int64,
                            count=len(keys))
        hit = slots[slots >= 0]
        if self.policy == "evict_least_used" and len(hit):
            np.add.at(self._uses, hit, 1)
        return slots

    def _evict(self, count: int, keep: set[int]) -> None:
        candidates = [k for k in self._slots if k not in keep]
        if self.policy == "evict_oldest":
            victims = candidates[:count]
        elif self.policy == "evict_random":
            picks = self._rng.choice(len(candidates), size=count, replace=False)
            victims = [candidates[i] for i in picks]
        else:
            uses = self._uses[[self._slots[k] for k in candidates]]
            victims = [candidates[i] for i in np.argsort(uses, kind="stable")[:count]]
        for key in victims:
            slot = self._slots.pop(key)
            self._uses[slot] = 0
            self._released.append(slot)

    def _take(self) -> int:
        if self._released:
            return self._released.pop()
        self._unused += 1
        return self._unused - 1

    def assign(self, keys: np.ndarray) -> np.ndarray:
        """Slots for ``keys`` (unique), evicting others if needed; at most ``capacity`` keys
        are placed — the rest get -1."""
        keys_list = keys.tolist()[: self.capacity]
        new = [k for k in keys_list if k not in self._slots]
        shortfall = len(new) - len(self._released) - (self.capacity - self._unused)
        if shortfall > 0:
            self._evict(shortfall, keep=set(keys_list))
        for key in new:
            self._slots[key] = self._take()
        slots = np.full(len(keys), -1, dtype=np.int64)
        slots[: len(keys_list)] = [self._slots[k] for k in keys_list]
        return slots
