# The API image (also runs Feast's CLI for the apply and materialize jobs): slim, non-root,
# no compiler. `--build-arg EXTRAS=gpu` adds CuPy for the GPU embedding cache.
#   docker build -f docker/api.Dockerfile -t featureline/api:0.1.0 .
#   docker build -f docker/api.Dockerfile --build-arg EXTRAS=gpu -t featureline/api:0.1.0-gpu .
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

FROM python:3.11-slim
ARG EXTRAS=""
# pyspark is a dependency of the package but idle here: the API never starts Spark.
COPY --from=wheel /wheels /wheels
RUN WHEEL="$(ls /wheels/*.whl)" \
 && pip install --no-cache-dir "${WHEEL}${EXTRAS:+[$EXTRAS]}" && rm -rf /wheels \
 && useradd --uid 10001 --user-group --no-create-home featureline
WORKDIR /opt/featureline
COPY --chown=10001:10001 feature_store/feast_repo feature_store/feast_repo
# Feast's registry (feature_store/feast_repo/data/registry.db) lives on the shared volume.
RUN ln -s /data feature_store/feast_repo/data
USER 10001
EXPOSE 8000
ENTRYPOINT []
CMD ["featureline", "serve", "--config", "/etc/featureline/featureline.yaml", "--host", "0.0.0.0"]
