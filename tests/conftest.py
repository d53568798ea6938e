"""One local SparkSession for the whole run (the machine has 2 cores), and one job output
that several test modules read."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from etl.config import EtlConfig, SparkSettings, with_overrides  # noqa: E402

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


@pytest.fixture(scope="session")
def spark():
    from etl.session import build_session

    session = build_session(TEST_SPARK)
    yield session
    session.stop()


def make_config(tmp_path: Path, source: Path, **overrides) -> EtlConfig:
    """The embedded defaults pointed at ``source`` and writing under ``tmp_path``."""
    config = with_overrides(EtlConfig(), input_path=str(source), output=str(tmp_path / "out"))
    data = config.model_dump(mode="json")
    data["spark"] = TEST_SPARK.model_dump(mode="json")
    for key, value in overrides.items():
        data[key] = value
    return EtlConfig.model_validate(data)


@pytest.fixture(scope="session")
def small_log(tmp_path_factory) -> Path:
    from etl.datagen import write_log

    path = tmp_path_factory.mktemp("raw") / "events.jsonl"
    write_log(path, events=6000, users=150, items=120, days=6, seed=11, bad_fraction=0.02)
    return path


@pytest.fixture(scope="session")
def job_output(spark, small_log, tmp_path_factory):
    from etl import job

    config = test_config(tmp_path_factory.mktemp("job"), small_log)
    return job.run(config, spark, progress=lambda _: None)
