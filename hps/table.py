"""A served table of the parameter server: its tiers' names for it, its L1 cache, its lock,
and what answered its lookups (per tier, insertions by mode, a latency histogram)."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from featureline.hps.cache import EmbeddingCache
from featureline.hps.config import TableConfig

TIERS = ("l1", "l2", "l3", "default")
# Upper bounds (seconds) of the lookup latency histogram buckets, Prometheus style.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 1.0, math.inf)


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


def record(stats: TableStats, l1_hits: int, inverse: np.ndarray, found2: np.ndarray,
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


def tables_stats(tables: dict[str, dict[str, Table]]) -> dict[str, Any]:
    """Per model and table: width, keys, vocabulary version, the L1 cache, what answered."""
    return {model: {name: {"dim": t.config.dim, "keys": t.size,
                           "vocabulary_version": t.config.vocabulary_version,
                           "fit_version": t.config.fit_version,
                           "cache": {"device": t.cache.device, "capacity": t.cache.capacity,
                                     "held": len(t.cache)},
                           **t.stats.to_json()}
                    for name, t in served.items()}
            for model, served in tables.items()}
