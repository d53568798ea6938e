"""The RAPIDS Accelerator release the gpu profiles run, pinned once, and its jar.

The plugin (renamed "cuDF plugin for Apache Spark", Maven coordinates unchanged) is
published on Maven Central only. 26.08.1 supports Spark 4.1.1–4.1.3 with Scala 2.13
(its release's support matrix); pyspark is pinned to 4.1.1 in pyproject.toml. The CUDA
classifier picks the native build: ``cuda12`` (the default jar is the same build) for the
CUDA 12 drivers of the gpu overlay's nodes. ``spark_conf/k8s-gpu.conf``,
``docker/etl.Dockerfile``, the gpu overlay and docs/gpu.md name this jar;
tests/test_gpu_plan.py checks that they agree with the pin below.

``featureline.tools.plugin_jar`` fetches the jar with Maven, for ``featureline etl gpu-check``.
"""

from __future__ import annotations

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
