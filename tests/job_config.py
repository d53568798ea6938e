"""The job configuration the tests run with: embedded defaults on a small local Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from featureline.etl.config import EtlConfig, SparkSettings, with_overrides

TEST_SPARK = SparkSettings(
    master="local[2]",
    properties={
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.ui.enabled": "false",
        "spark.driver.memory": "2g",
        "spark.sql.adaptive.enabled": "true",
    },
)


def make_config(tmp_path: Path, source: Path, **overrides: Any) -> EtlConfig:
    """The embedded defaults pointed at ``source`` and writing under ``tmp_path``."""
    config = with_overrides(EtlConfig(), input_path=str(source), output=str(tmp_path / "out"))
    data = config.model_dump(mode="json")
    data["spark"] = TEST_SPARK.model_dump(mode="json")
    for key, value in overrides.items():
        data[key] = value
    return EtlConfig.model_validate(data)
