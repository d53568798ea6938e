"""The event log between ``POST /v1/push`` and the stream processor: the source of truth for
streamed events. The API only appends; processors read in a consumer group and commit an
event only after its features are written, so an event is delivered at least once and a
processor that restarts under its name gets back what it had not committed.

A backend is a class with these methods and one line in :data:`EVENT_LOGS` (``stream.log``
selects it): ``redis_stream`` (the embedded default) and ``kafka``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from featureline.stream.kafka_log import KafkaLog
from featureline.stream.redis_log import RedisStreamLog
from featureline.stream.settings import StreamConfig


@dataclass(frozen=True)
class Delivered:
    """One record read from the log: ``payload``, the lines of one or more events
    (``core.events.event_line``, newline-separated) accepted at ``accepted_at`` (Unix
    seconds); ``token`` is what :meth:`EventLog.commit` needs."""

    token: Any
    payload: bytes
    accepted_at: float


class EventLog(Protocol):
    url: str

    def append(self, events: Sequence[tuple[str, bytes]], accepted_at: float) -> None:
        """Append ``(key, line)`` pairs accepted at ``accepted_at``, partitioned by key;
        returns once every one is stored, else raises
        :class:`~featureline.stream.errors.EventLogUnavailableError` (some may be stored:
        appending again is safe, duplicates count once)."""
        ...

    def read(self, consumer: str, count: int, block_s: float) -> list[Delivered]:
        """About ``count`` events (whole records) for ``consumer`` of the group: first those
        delivered to it and not committed, then new ones (waiting up to ``block_s`` for
        them)."""
        ...

    def commit(self, delivered: Sequence[Delivered]) -> None:
        ...

    def close(self) -> None:
        ...


EVENT_LOGS: dict[str, Callable[[StreamConfig, str], EventLog]] = {
    "redis_stream": RedisStreamLog,
    "kafka": KafkaLog,
}


def open_event_log(config: StreamConfig, online_store_url: str, cluster: bool = False
                   ) -> EventLog:
    """The configured log; a Redis Stream defaults to the online store's Redis (``cluster``:
    the online store is a Redis Cluster — the stream is then one key on one of its nodes)."""
    if config.log == "redis_stream" and not config.url:
        return RedisStreamLog(config, online_store_url, cluster=cluster)
    return EVENT_LOGS[config.log](config, config.url or online_store_url)


def written_topic(project: str) -> str:
    """Where processors announce, through the online store, the entities they rewrote (the
    API's feature caches forget them)."""
    return f"{project}:stream:written"
