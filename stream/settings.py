"""The ``stream`` section of featureline.yaml: where pushed events are logged, and where the
stream processor archives them for the next batch run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from featureline.core.settings import Settings


class StreamConfig(Settings):
    """Pushed events (``POST /v1/push``) → the event log → ``featureline stream``."""

    # redis_stream: a Redis Stream (default: on the online store's Redis) | kafka.
    log: Literal["redis_stream", "kafka"] = "redis_stream"
    # redis_stream: a Redis URL (default: the online store's); kafka: bootstrap servers
    # (host:port,host:port), required.
    url: str | None = None
    # The Kafka topic, or the Redis Stream's key.
    topic: str = "featureline.events"
    # The processors' consumer group: more processors in one group share the partitions.
    group: str = "featureline-stream"
    # Partitions of the Kafka topic when the stream creates it (events keyed by user_id).
    partitions: int = Field(default=8, ge=1)
    # Accepted events, in the raw log's schema, one JSONL file per hour of arrival: the next
    # `featureline etl run` reads them with the original log.
    archive: str = "data/stream_archive"
    # The processor's Prometheus /metrics (freshness, events); None: not served.
    metrics_port: int | None = Field(default=9108, ge=1, le=65535)
    # At most this many events a processor reads from the log at a time: under a backlog,
    # big batches write each entity once for many of its events; otherwise a read returns
    # what has arrived.
    read_batch: int = Field(default=20_000, ge=1)

    @model_validator(mode="after")
    def _kafka_needs_brokers(self) -> StreamConfig:
        if self.log == "kafka" and not self.url:
            raise ValueError("stream.log: kafka needs stream.url (the bootstrap servers)")
        return self
