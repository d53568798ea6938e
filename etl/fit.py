"""A fit: the statistics a full run fitted on its training split (encodings, normalisation,
the model-ready standardisation), read back from its output so that another run transforms
its events with them unchanged (docs/ARCHITECTURE.md, "Fits").

A run that fits records a new fit under metadata.json's ``fit`` (its version is the run's
dataset version); a run with ``--fit-from OUTPUT`` records that output's fit as its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from featureline.core.errors import ConfigError
from featureline.core.metadata import METADATA_FILE, read_metadata
from featureline.etl.config import EtlConfig
from featureline.etl.incremental import values_hash

ARTIFACTS_DIR = "artifacts"
OPTION = "--fit-from"


@dataclass(frozen=True)
class Fit:
    """A fit as its output holds it: the fitted ops' tables and statistics."""

    output: Path
    version: str
    fitted_at: str
    stats: dict[str, Any]
    spark: SparkSession

    def table(self, name: str) -> DataFrame:
        """An artifact table the fit wrote (``count_encode/user_id``, …)."""
        path = self.output / ARTIFACTS_DIR / name
        if not path.is_dir():
            raise ConfigError(OPTION, f"{self.output}: the fit holds no {ARTIFACTS_DIR}/{name} "
                              "(written by an older Featureline: fit it again)")
        return self.spark.read.parquet(str(path))

    def op_stats(self, op: str) -> dict[str, Any]:
        if op not in self.stats:
            raise ConfigError(OPTION, f"{self.output}: the fit has no statistics of {op}")
        stats: dict[str, Any] = self.stats[op]
        return stats

    def record(self, values_hash: str) -> dict[str, Any]:
        """metadata.json's ``fit`` of a run that transformed with this fit."""
        return {"version": self.version, "fitted_at": self.fitted_at,
                "from": str(self.output), "values_hash": values_hash,
                "age_days": age_days(self.fitted_at)}


def new_fit(version: str, created_at: str, values_hash: str) -> dict[str, Any]:
    """metadata.json's ``fit`` of a run that fitted its own statistics."""
    return {"version": version, "fitted_at": created_at, "from": None,
            "values_hash": values_hash, "age_days": 0.0}


def age_days(fitted_at: str) -> float:
    fitted = datetime.fromisoformat(fitted_at)
    return round((datetime.now(timezone.utc) - fitted).total_seconds() / 86400, 3)


def load_fit(spark: SparkSession, config: EtlConfig) -> Fit | None:
    """The fit ``etl.fit.from_output`` names (None: this run fits), refused when it was
    fitted for other settings: its statistics would not be these features'."""
    source = config.fit.from_output
    if source is None:
        return None
    output = Path(source)
    if not (output / METADATA_FILE).is_file():
        raise ConfigError(OPTION, f"{output}: no {METADATA_FILE} there (expected an ETL output "
                          "folder)")
    metadata = read_metadata(output)
    fit = metadata.fit
    if fit is None:
        raise ConfigError(OPTION, f"{output} records no fit (written before fits were): fit "
                          "again with a full run")
    if fit.values_hash != values_hash(config):
        raise ConfigError(OPTION, f"{output} was fitted for other settings (features, label, "
                          "validation or columns differ): fit again with a full run of these "
                          "settings")
    return Fit(output.resolve(), fit.version, fit.fitted_at, dict(metadata.artifacts), spark)
