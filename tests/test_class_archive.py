"""The archive of Spark's classes local sessions start from (etl/class_archive.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from featureline.core.files import CACHE_ENV
from featureline.etl.class_archive import (
    ARCHIVE,
    archive_folder,
    class_archive,
    driver_java_options,
)

BIN = Path(sys.executable).parent


def test_a_local_session_gets_the_archive_beside_its_own_java_options(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    local = {"spark.master": "local[2]", "spark.driver.extraJavaOptions": "-Dx=1"}
    assert driver_java_options(local) is None  # no archive made yet
    folder = archive_folder()
    assert folder is not None and folder.parent == tmp_path
    folder.mkdir()
    (folder / ARCHIVE).write_bytes(b"")
    assert driver_java_options(local) == f"-Dx=1 -XX:SharedArchiveFile={folder / ARCHIVE}"
    assert driver_java_options({}) == f"-XX:SharedArchiveFile={folder / ARCHIVE}"
    # A cluster's driver runs elsewhere; options that name an archive already are the user's.
    assert driver_java_options({"spark.master": "k8s://https://api:6443"}) is None
    assert driver_java_options({"spark.driver.extraJavaOptions":
                                "-XX:SharedArchiveFile=/their.jsa"}) is None


def test_the_archive_is_named_by_the_jvm_and_spark_it_was_made_with(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    ours = archive_folder()
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    other = archive_folder()
    assert other is not None and ours is not None and other != ours
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    assert archive_folder() is None


@pytest.mark.slow
def test_spark_submit_starts_its_driver_from_the_archive(tmp_path):
    """-Xshare:on makes a JVM that cannot map the archive (torn, or made for another class
    path) refuse to start, so a driver that runs proves the archive matches Spark's."""
    archive = class_archive()  # made by `featureline fetch` before the suite, else here
    script = tmp_path / "args.py"
    script.write_text(
        "from pyspark import SparkContext\n"
        "sc = SparkContext('local[1]', 'archive')\n"
        "bean = sc._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()\n"
        "print('\\n'.join(bean.getInputArguments()))\n"
        "sc.stop()\n")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    done = subprocess.run(
        [str(BIN / "spark-submit"), "--driver-java-options",
         f"-Xshare:on -XX:SharedArchiveFile={archive}", str(script)],
        capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    assert f"-XX:SharedArchiveFile={archive}" in done.stdout.splitlines()
