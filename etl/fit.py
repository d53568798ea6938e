"""A fit: the statistics a full run fitted on its training split (encodings, normalisation,
the model-ready standardisation), read back from its output so that another run transforms
its events with them unchanged (docs/ARCHITECTURE.md, "Fits").

A run that fits records a new fit under metadata.json's ``fit`` (its version is the run's
dataset version); a run with ``--fit-from OUTPUT`` records that output's fit as its own, and
so does a run keeping the fit of the output it replaces or extends (``etl.fit.refit_every``)
while that fit is young enough: an incremental run keeping it transforms and writes only the
days its new events change.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from featureline.core.errors import ConfigError
from featureline.core.metadata import METADATA_FILE, read_metadata
from featureline.core.settings import duration_seconds
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
    # Where its training split ended (the fitting run's validation start); None: not recorded.
    trained_until: str | None
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

    def age_days(self, valid_from: str) -> float | None:
        """Days from the end of the fit's training split to the end of this run's."""
        if self.trained_until is None:
            return None
        delta = datetime.fromisoformat(valid_from) - datetime.fromisoformat(self.trained_until)
        return round(delta.total_seconds() / 86400, 3)

    def record(self, values_hash: str, valid_from: str) -> dict[str, Any]:
        """metadata.json's ``fit`` of a run that transformed with this fit."""
        return {"version": self.version, "fitted_at": self.fitted_at,
                "trained_until": self.trained_until, "from": str(self.output),
                "values_hash": values_hash, "age_days": self.age_days(valid_from)}


def new_fit(version: str, created_at: str, values_hash: str, valid_from: str
            ) -> dict[str, Any]:
    """metadata.json's ``fit`` of a run that fitted its own statistics."""
    return {"version": version, "fitted_at": created_at, "trained_until": valid_from,
            "from": None, "values_hash": values_hash, "age_days": 0.0}


def load_fit(spark: SparkSession, config: EtlConfig) -> Fit | None:
    """The fit ``etl.fit.from_output`` names (None: none named), refused when it was fitted
    for other settings: its statistics would not be these features'."""
    source = config.fit.from_output
    if source is None:
        return None
    output = Path(source)
    if not (output / METADATA_FILE).is_file():
        raise ConfigError(OPTION, f"{output}: no {METADATA_FILE} there (expected an ETL output "
                          "folder)")
    fit = _recorded(spark, output, config)
    if isinstance(fit, str):
        raise ConfigError(OPTION, f"{output} {fit}")
    return fit


def scheduled_fit(spark: SparkSession, config: EtlConfig, output: Path) -> Fit | None:
    """The fit of the output a run replaces (a full run) or extends (an incremental one),
    where ``etl.fit.refit_every`` (``FitConfig.kept_for``) keeps fits between refits and
    neither ``--fit-from`` nor ``--refit`` is given; None where there is none to keep (no
    output yet, no fit recorded, other settings: a new fit). Whether it is young enough is
    known once the run's split is (``keeps``)."""
    settings = config.fit
    if (settings.kept_for(config.mode) is None or settings.refit
            or settings.from_output is not None
            or not (output / METADATA_FILE).is_file()):
        return None
    fit = _recorded(spark, output, config)
    return None if isinstance(fit, str) else fit


def keeps(age_days: float | None, config: EtlConfig) -> bool:
    """Whether a scheduled fit of this age (:meth:`Fit.age_days` at the run's split; None:
    unknown) is still younger than ``etl.fit.refit_every`` (``FitConfig.kept_for``)."""
    kept_for = config.fit.kept_for(config.mode)
    assert kept_for is not None
    return age_days is not None and age_days * 86400 < duration_seconds(kept_for)


def _recorded(spark: SparkSession, output: Path, config: EtlConfig) -> Fit | str:
    """The fit ``output`` records, or why it cannot be used for ``config``."""
    metadata = read_metadata(output)
    fit = metadata.fit
    if fit is None:
        return "records no fit (written before fits were): fit again with a full run"
    if fit.values_hash != values_hash(config):
        return ("was fitted for other settings (features, label, validation or columns "
                "differ): fit again with a full run of these settings")
    return Fit(output.resolve(), fit.version, fit.fitted_at, fit.trained_until,
               dict(metadata.artifacts), spark)
