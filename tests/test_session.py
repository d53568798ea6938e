"""Spark profiles: the properties each one yields, and the RAPIDS jar rules of the gpu ones."""

from __future__ import annotations

import pytest

from featureline.etl.config import SparkSettings
from featureline.etl.errors import RapidsJarNotFoundError
from featureline.etl.session import RAPIDS_PLUGIN, read_properties, spark_conf_dir, spark_properties


@pytest.fixture(autouse=True)
def no_rapids_jar(monkeypatch):
    monkeypatch.delenv("RAPIDS_JAR", raising=False)


def test_cpu_profile():
    properties = spark_properties(SparkSettings(profile="cpu", properties={"a.b": "c"}))
    assert properties["spark.master"] == "local[*]"
    assert properties["spark.sql.session.timeZone"] == "UTC"
    assert properties["a.b"] == "c"
    assert "spark.plugins" not in properties


def test_gpu_profile_needs_the_jar(tmp_path, monkeypatch):
    with pytest.raises(RapidsJarNotFoundError) as info:
        spark_properties(SparkSettings(profile="gpu"))
    assert info.value.key == "etl.spark.rapids_jar"
    with pytest.raises(RapidsJarNotFoundError, match="no such jar"):
        spark_properties(SparkSettings(profile="gpu", rapids_jar=str(tmp_path / "x.jar")))
    jar = tmp_path / "rapids-4-spark_2.13-26.06.0.jar"
    jar.write_bytes(b"PK")
    monkeypatch.setenv("RAPIDS_JAR", str(jar))
    properties = spark_properties(SparkSettings(profile="gpu"))
    assert properties["spark.jars"] == str(jar)
    assert properties["spark.plugins"] == RAPIDS_PLUGIN
    assert properties["spark.rapids.sql.explain"] == "NOT_ON_GPU"


def test_gpu_profile_with_maven_coordinates():
    coordinates = "com.nvidia:rapids-4-spark_2.13:26.06.0"
    properties = spark_properties(SparkSettings(profile="gpu", rapids_jar=coordinates))
    assert properties["spark.jars.packages"] == coordinates


def test_k8s_profile_ships_the_jar_in_the_image():
    properties = spark_properties(SparkSettings(profile="k8s-gpu"))
    assert properties["spark.jars"].startswith("local:///")
    assert properties["spark.executor.resource.gpu.discoveryScript"].endswith(
        "getGpusResources.sh")


def test_every_profile_file_parses():
    for name in ("cpu", "gpu", "k8s-cpu", "k8s-gpu"):
        properties = read_properties(spark_conf_dir() / f"{name}.conf")
        assert properties["spark.sql.session.timeZone"] == "UTC"
        assert all(key.startswith("spark.") for key in properties)


def test_a_profile_built_in_the_suite_leaves_the_shared_session_as_it_was(spark):
    """An in-process ``featureline`` command builds its session from a profile and Spark
    sets the profile's settings on the shared one; the suite puts them back after the test
    (tests/conftest.py), so a test's settings do not depend on what its worker ran before."""
    from featureline.etl.session import build_session
    from tests.conftest import restore_shared_settings
    from tests.job_config import TEST_SPARK

    built = {key: spark.conf.get(key) for key in TEST_SPARK.properties
             if spark.conf.isModifiable(key)}
    assert built["spark.sql.shuffle.partitions"] == "2"
    assert build_session(SparkSettings(profile="cpu")) is spark
    assert spark.conf.get("spark.sql.shuffle.partitions") == "8"
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"
    spark.conf.set("spark.sql.caseSensitive", "true")  # a setting the shared one lacked
    restore_shared_settings()
    assert {key: spark.conf.get(key) for key in built} == built
    assert spark.conf.get("spark.sql.caseSensitive") == "false"  # unset: Spark's default
