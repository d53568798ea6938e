"""The feature-op interface: fit statistics on the training split, transform any split.

Each op is a pure ``DataFrame -> DataFrame`` step made of built-in Spark SQL only (no Python
UDFs), so the RAPIDS Accelerator can run it on the GPU.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

from pyspark.sql import DataFrame

LABEL = "label"
SPLIT = "split"
TRAIN = "train"
VALID = "valid"
# Event time in microseconds since the epoch: the order and range key of the time windows.
TS_MICROS = "_ts_us"

Kind = Literal["categorical", "continuous", "multi_hot"]


@dataclass(frozen=True)
class FeatureSpec:
    """One output column of a feature op, as metadata.json describes it."""

    name: str
    kind: Kind
    dtype: Literal["int64", "float32"]
    cardinality: int | None = None
    # The categorical feature whose ids (and embedding table) this one reuses.
    shares: str | None = None
    # Values per row: 1, or K for a multi-hot list.
    width: int = 1
    short_name: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "short_name": self.short_name,
                                "dtype": self.dtype, "kind": self.kind, "width": self.width}
        if self.cardinality is not None:
            data["cardinality"] = self.cardinality
        if self.shares is not None:
            data["shares"] = self.shares
        return data


@dataclass
class Artifacts:
    """What a fitted op keeps for serving: Parquet tables and a JSON-able summary."""

    tables: dict[str, DataFrame] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)


class FeatureOp(ABC):
    """A feature transform with an explicit fit on the training split."""

    name: str

    def fit(self, train: DataFrame) -> None:  # noqa: B027 - stateless ops need no statistics
        """Learn statistics from the training split (stateless ops have none)."""

    @abstractmethod
    def transform(self, events: DataFrame) -> DataFrame:
        """Add this op's output columns to ``events``."""

    @abstractmethod
    def features(self) -> list[FeatureSpec]:
        """The output columns, valid after ``fit``."""

    def artifacts(self) -> Artifacts:
        return Artifacts()

    def keep(self, frame: DataFrame) -> DataFrame:
        """Cache a fitted statistic for the transforms; ``release`` frees it."""
        self.__dict__.setdefault("_kept", []).append(frame.persist())
        return frame

    def release(self) -> None:
        for frame in self.__dict__.pop("_kept", []):
            frame.unpersist()
