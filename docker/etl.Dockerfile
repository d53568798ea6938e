# The ETL image: Spark 4.1.1 (Scala 2.13, Java 17), the RAPIDS Accelerator jar and Spark's
# GPU discovery script, and Featureline's wheel. One image for the CPU and GPU profiles.
#   docker build -f docker/etl.Dockerfile -t featureline/etl:0.1.0 .
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core core
COPY etl etl
COPY feature_store feature_store
COPY hps hps
COPY api api
COPY trainer trainer
COPY stream stream
COPY featureline featureline
COPY spark_conf spark_conf
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM apache/spark:4.1.1-scala2.13-java17-python3-ubuntu
# The pin of etl/rapids.py (tests/test_gpu_plan.py checks they agree).
ARG RAPIDS_VERSION=26.08.1
ARG RAPIDS_CLASSIFIER=cuda12
ARG RAPIDS_JAR=rapids-4-spark_2.13-${RAPIDS_VERSION}-${RAPIDS_CLASSIFIER}.jar
USER root
RUN mkdir -p /opt/sparkRapidsPlugin \
 && curl -fsSL -o "/opt/sparkRapidsPlugin/${RAPIDS_JAR}" \
      "https://repo1.maven.org/maven2/com/nvidia/rapids-4-spark_2.13/${RAPIDS_VERSION}/${RAPIDS_JAR}" \
 && cp /opt/spark/examples/src/main/scripts/getGpusResources.sh /opt/sparkRapidsPlugin/ \
 && chmod 0755 /opt/sparkRapidsPlugin/getGpusResources.sh
COPY --from=wheel /wheels /wheels
# pyspark comes from the image's Spark; the wheel's own pin is the same version.
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
WORKDIR /opt/featureline
COPY spark_conf spark_conf
COPY k8s/spark k8s/spark
COPY etl/main.py etl/main.py
COPY featureline.yaml .
ENV PYSPARK_PYTHON=python3 SPARK_CONF_DIR=/opt/spark/conf
USER 185
