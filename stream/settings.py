"""The ``stream`` section of featureline.yaml: where pushed events are logged, and where the
stream processor archives them for the next batch run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from featureline.core.settings import Settings


class StreamConfig(Settings):
    """Pushed events (``POST /v1/push``) → the event log → ``featureline stream``."""

    # redis_stream: a Redis Stream (default: on the online store's Redis).
    log: Literal["redis_stream"] = "redis_stream"
    # A Redis URL (default: the online store's).
    url: str | None = None
    topic: str = "featureline.events"
    # The processors' consumer group: more processors in one group share the partitions.
    group: str = "featureline-stream"
    # Accepted events, in the raw log's schema, one JSONL file per hour of arrival: the next
    # `featureline etl run` reads them with the original log.
    archive: str = "data/stream_archive"
    # Events a processor reads from the log at a time.
    read_batch: int = Field(default=500, ge=1)
