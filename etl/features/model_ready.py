"""Model-ready continuous features (docs/ARCHITECTURE.md, "Model-ready features").

Every continuous feature the ops derive goes into the examples transformed the way NVIDIA's
recommender pipelines prepare them: ``log1p_standardize`` (non-negative heavy-tailed values:
counts, seconds) is ``log1p`` then standardised, ``standardize`` only standardises, ``none``
leaves the values as they are. Mean and standard deviation come from the training split only.
A feature that can have no value (the seconds since a first event's previous one) gets a
0/1 missing indicator beside it, and its missing values become the training mean (0 after
standardising) rather than a sentinel. Each op proposes a transform per feature;
``etl.model_ready.transforms`` overrides it by feature name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from pydantic import Field
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from featureline.core.errors import ConfigError
from featureline.core.settings import Settings
from featureline.core.transforms import LOG1P_STANDARDIZE, NONE, Transform, missing_indicator
from featureline.etl.features.base import FeatureSpec, population_std


class ModelReadyConfig(Settings):
    """How derived continuous features go into the examples (log1p, standardised)."""

    # false: every derived feature keeps its raw value (missing values become 0).
    enabled: bool = True
    # Feature (output) name → transform, overriding the op's choice.
    transforms: dict[str, Transform] = Field(default_factory=dict)


def _shaped(column: str, transform: str) -> Column:
    value = F.col(column).cast("double")
    # log1p below -1 is undefined; negative values count as 0 (counts and seconds never are).
    # Not greatest(value, 0): it skips nulls, and a missing value must stay missing.
    clipped = F.when(value < 0, F.lit(0.0)).otherwise(value)
    return F.log1p(clipped) if transform == LOG1P_STANDARDIZE else value


class ModelReady:
    """Fit on the training rows of the featured events, then transform every row."""

    def __init__(self, specs: list[FeatureSpec], config: ModelReadyConfig) -> None:
        continuous = {s.name: s for s in specs if s.kind == "continuous"}
        for name in config.transforms:
            if name not in continuous:
                raise ConfigError(f"etl.model_ready.transforms.{name}",
                                  f"no continuous feature {name!r} (known: "
                                  f"{', '.join(sorted(continuous))})")
        self.transforms = {name: config.transforms.get(name, spec.transform_hint)
                           if config.enabled else NONE for name, spec in continuous.items()}
        self.missing = [name for name, spec in continuous.items() if spec.missing]
        self.stats: dict[str, dict[str, Any]] = {}

    def fit(self, train: DataFrame, names: Collection[str] | None = None) -> None:
        """Mean and standard deviation of each shaped feature (of ``names`` only, where given:
        the others keep theirs) over the training rows that have a value, and how many have
        none; one pass."""
        fitted = [n for n, t in self.transforms.items()
                  if t != NONE and (names is None or n in names)]
        aggregates = [F.count(F.lit(1)).alias("_rows")]
        for index, name in enumerate(fitted):
            shaped = _shaped(name, self.transforms[name])
            aggregates += [F.mean(shaped).alias(f"m{index}"),
                           population_std(shaped).alias(f"s{index}"),
                           F.count(F.col(name)).alias(f"n{index}")]
        row = train.agg(*aggregates).collect()[0]
        for index, name in enumerate(fitted):
            mean, std = row[f"m{index}"] or 0.0, row[f"s{index}"] or 0.0
            self.stats[name] = {"name": self.transforms[name], "mean": mean,
                                "std": std if std > 0 else 1.0,
                                "missing_in_train": row["_rows"] - row[f"n{index}"]}
        for name in self.missing:
            if names is None or name in names:
                self.stats.setdefault(name, {"name": NONE, "fill": 0.0})
                self.stats[name]["missing_indicator"] = missing_indicator(name)

    def restore(self, stats: dict[str, Any]) -> None:
        """The statistics of a fit (its ``artifacts.model_ready``) instead of fitting them;
        only those of this spec's features."""
        self.stats = {name: dict(stats[name]) for name in stats
                      if name in self.transforms or name in self.missing}

    def transform(self, featured: DataFrame, names: Collection[str] | None = None
                  ) -> DataFrame:
        """The features (``names`` only, where given) replaced by their transformed values,
        indicators added; every expression reads the op's raw column (``withColumns``
        evaluates them together)."""
        columns = {missing_indicator(n): F.col(n).isNull().cast("double") for n in self.missing
                   if names is None or n in names}
        for name, stats in self.stats.items():
            if names is not None and name not in names:
                continue
            if stats["name"] == NONE:
                columns[name] = F.coalesce(F.col(name).cast("double"), F.lit(stats["fill"]))
            else:
                mean = F.lit(stats["mean"])
                columns[name] = ((F.coalesce(_shaped(name, stats["name"]), mean) - mean)
                                 / F.lit(stats["std"]))
        return featured.withColumns(columns)

    def features(self, specs: list[FeatureSpec]) -> list[FeatureSpec]:
        """``specs`` with each continuous feature's transform, each indicator after its
        feature."""
        out = []
        for spec in specs:
            if spec.kind != "continuous":
                out.append(spec)
                continue
            transform = self.stats.get(spec.name) or spec.transform or {"name": NONE}
            out.append(dataclasses.replace(spec, transform=transform))
            if spec.name in self.missing:
                out.append(FeatureSpec(missing_indicator(spec.name), "continuous", "float32",
                                       transform={"name": "missing_indicator",
                                                  "of": spec.name}))
        return out

    def artifacts(self) -> dict[str, Any]:
        return self.stats
