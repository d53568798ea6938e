"""The SparkSession of a profile: ``spark_conf/<profile>.conf`` plus the job's own settings.

The gpu profiles need the RAPIDS Accelerator jar, which is published on Maven only; its path
comes from ``etl.spark.rapids_jar`` or ``RAPIDS_JAR``, and without it the job stops here,
before Spark starts.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from featureline.core.errors import ConfigError
from featureline.etl import python_daemon
from featureline.etl.class_archive import driver_java_options
from featureline.etl.config import SparkSettings
from featureline.etl.errors import RapidsJarNotFoundError
from featureline.etl.rapids import JAR_NAME, MAVEN_PACKAGE, RAPIDS_PLUGIN

PYTHON_DAEMON = python_daemon.__name__

_PROPERTY = re.compile(r"^([^\s=:#]+)\s*[=:\s]\s*(.*)$")


def spark_conf_dir() -> Path:
    """``spark_conf/`` of the checkout, or ``FEATURELINE_SPARK_CONF_DIR`` (e.g. in an image)."""
    override = os.environ.get("FEATURELINE_SPARK_CONF_DIR")
    return Path(override) if override else Path(__file__).resolve().parent.parent / "spark_conf"


def read_properties(path: Path) -> dict[str, str]:
    """A Spark properties file: ``key value`` (or ``key=value``) lines, ``#`` comments."""
    properties: dict[str, str] = {}
    for line in path.read_text().splitlines():
        match = _PROPERTY.match(line.strip())
        if match and not line.lstrip().startswith("#"):
            properties[match.group(1)] = match.group(2).strip()
    return properties


def _rapids_jar(settings: SparkSettings, properties: dict[str, str]) -> str:
    jar = os.environ.get("RAPIDS_JAR") or settings.rapids_jar
    if not jar:
        if properties.get("spark.jars") or properties.get("spark.jars.packages"):
            return ""
        raise RapidsJarNotFoundError(
            "etl.spark.rapids_jar",
            f"the {settings.profile!r} profile runs the RAPIDS Accelerator, whose jar is not "
            f"found: set RAPIDS_JAR=/path/to/{JAR_NAME} (or etl.spark.rapids_jar; Maven "
            f"coordinates {MAVEN_PACKAGE} work where Maven is reachable)",
        )
    if ":" in jar and not jar.startswith(("local:", "file:", "/")) and not jar.endswith(".jar"):
        return jar  # Maven coordinates, resolved by Spark through spark.jars.packages
    local = Path(jar.removeprefix("file:"))
    if not jar.startswith("local:") and not local.is_file():
        raise RapidsJarNotFoundError("etl.spark.rapids_jar", f"no such jar: {jar}")
    return jar


def spark_properties(settings: SparkSettings, *, from_profile: bool = True) -> dict[str, str]:
    """The properties a session of ``settings.profile`` is built with."""
    properties: dict[str, str] = {}
    if from_profile:
        path = spark_conf_dir() / f"{settings.profile}.conf"
        if not path.is_file():
            raise ConfigError("etl.spark.profile", f"no properties file {path}")
        properties.update(read_properties(path))
    properties.update(settings.properties)
    if settings.master:
        properties["spark.master"] = settings.master
    plugins = properties.get("spark.plugins", "") or os.environ.get("SPARK_PLUGINS", "")
    if RAPIDS_PLUGIN in plugins or settings.profile.endswith("gpu"):
        jar = _rapids_jar(settings, properties)
        if jar and jar.endswith(".jar"):
            properties["spark.jars"] = ",".join(filter(None, [properties.get("spark.jars"), jar]))
        elif jar:
            properties["spark.jars.packages"] = jar
    properties.setdefault("spark.sql.session.timeZone", "UTC")
    properties.setdefault("spark.app.name", settings.app_name)
    # PySpark's daemon without two fixed costs of every Python task (etl/python_daemon.py).
    properties.setdefault("spark.python.daemon.module", PYTHON_DAEMON)
    return properties


def build_session(settings: SparkSettings, *, from_profile: bool = True) -> SparkSession:
    """Get or create the session; under spark-submit, pass ``from_profile=False``.

    spark-submit has already applied ``--properties-file``; the job then only adds its own
    settings (and still checks the RAPIDS jar).
    """
    properties = spark_properties(settings, from_profile=from_profile)
    java_options = driver_java_options(properties) if from_profile else None
    if java_options:
        properties["spark.driver.extraJavaOptions"] = java_options
    # Python workers must run the interpreter the driver runs, with the same packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if properties.get("spark.master", "local").startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder
    for key, value in properties.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    _quiet_expected_warnings(session)
    return session


def _quiet_expected_warnings(session: SparkSession) -> None:
    """Ranking a vocabulary is one global sort by design; Spark warns about it on every run."""
    log4j = session.sparkContext._jvm.org.apache.logging.log4j  # type: ignore[union-attr]
    log4j.core.config.Configurator.setLevel(
        "org.apache.spark.sql.execution.window.WindowExec", log4j.Level.ERROR)
