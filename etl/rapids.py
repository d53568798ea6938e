"""The RAPIDS Accelerator release the gpu profiles run, pinned once, and its jar.

The plugin (renamed "cuDF plugin for Apache Spark", Maven coordinates unchanged) is
published on Maven Central only. 26.08.1 supports Spark 4.1.1–4.1.3 with Scala 2.13
(its release's support matrix); pyspark is pinned to 4.1.1 in pyproject.toml. The CUDA
classifier picks the native build: ``cuda12`` (the default jar is the same build) for the
CUDA 12 drivers of the gpu overlay's nodes. ``spark_conf/k8s-gpu.conf``,
``docker/etl.Dockerfile``, the gpu overlay and the README name this jar;
tests/test_gpu_plan.py checks that they agree with the pin below.

:func:`plugin_jar` fetches the jar once with Maven into the cache (``~/.cache/featureline``
or ``FEATURELINE_CACHE``), staged and published whole, for ``featureline etl gpu-check``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from featureline.core.files import fetched_once
from featureline.etl.errors import PluginFetchError
from featureline.etl.qualification import cache_root

RAPIDS_VERSION = "26.08.1"
RAPIDS_PLUGIN = "com.nvidia.spark.SQLPlugin"
SCALA_VERSION = "2.13"
CUDA_CLASSIFIER = "cuda12"
GROUP = "com.nvidia"
ARTIFACT = f"rapids-4-spark_{SCALA_VERSION}"
JAR_NAME = f"{ARTIFACT}-{RAPIDS_VERSION}-{CUDA_CLASSIFIER}.jar"
# Spark's spark.jars.packages takes group:artifact:version, no classifier: the default jar.
MAVEN_PACKAGE = f"{GROUP}:{ARTIFACT}:{RAPIDS_VERSION}"
MAVEN_ARTIFACT = f"{MAVEN_PACKAGE}:jar:{CUDA_CLASSIFIER}"
# Where the ETL image keeps it (docker/etl.Dockerfile, spark_conf/k8s-gpu.conf, the overlay).
IMAGE_JAR = f"/opt/sparkRapidsPlugin/{JAR_NAME}"


def plugin_jar() -> Path:
    """The pinned plugin jar: fetched into the cache the first time, then reused."""
    root = cache_root() / f"rapids-plugin-{RAPIDS_VERSION}-{CUDA_CLASSIFIER}"
    return fetched_once(root, JAR_NAME, _fetch) / JAR_NAME


def _fetch(folder: Path) -> None:
    """``mvn dependency:copy`` of the jar into ``folder``, with a Maven repository of its own
    inside the staging folder (removed after), so the cache holds one copy of ~1 GB."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise PluginFetchError(f"cannot fetch {MAVEN_ARTIFACT}: mvn is not on PATH")
    repository = folder / "maven-repository"
    done = subprocess.run(
        [mvn, "--batch-mode", "--quiet", "dependency:copy", f"-Dartifact={MAVEN_ARTIFACT}",
         f"-DoutputDirectory={folder}", f"-Dmaven.repo.local={repository}"],
        capture_output=True, text=True, check=False, cwd=folder)
    shutil.rmtree(repository, ignore_errors=True)
    if done.returncode != 0 or not (folder / JAR_NAME).is_file():
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise PluginFetchError(f"cannot fetch {MAVEN_ARTIFACT} from Maven Central: "
                               f"{' '.join(tail) or done.returncode}")
