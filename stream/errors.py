"""Typed errors of the stream stage."""

from __future__ import annotations

from featureline.core.errors import FeaturelineError, UnavailableError
from featureline.core.redis import redact


class StreamError(FeaturelineError):
    """Base class of the stream stage's errors."""


class EventLogUnavailableError(StreamError, UnavailableError):
    """The event log did not take or give events; nothing was acknowledged."""

    retry_after = True
    hint = "check that the event log (stream.log, stream.url) is up"

    def __init__(self, url: str, reason: str) -> None:
        self.url = redact(url)
        super().__init__(f"event log {self.url} is unavailable: {reason}")


class KafkaFetchError(StreamError):
    """Apache Kafka's release jars could not be fetched from Maven; the message says why."""

    hint = "check that Maven (mvn) is installed and Maven Central is reachable"
