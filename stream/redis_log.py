"""The event log on a Redis Stream (``stream.log: redis_stream``): one stream, one consumer
group; a processor's unacknowledged entries are re-read when it restarts under its name, and
taken over by another processor when it does not come back."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import redis as redis_py

from featureline.core import redis
from featureline.stream.errors import EventLogUnavailableError
from featureline.stream.settings import StreamConfig

if TYPE_CHECKING:
    from featureline.stream.log import Delivered

# An entry holds the lines of up to PER_ENTRY events of one append (FIELD) and the time they
# were accepted (ACCEPTED).
FIELD, ACCEPTED = b"e", b"a"
PER_ENTRY = 100
# A processor that has not acknowledged an entry for this long is taken for dead, and another
# processor of the group takes the entry over.
CLAIM_IDLE_MS = 30_000


class RedisStreamLog:
    def __init__(self, config: StreamConfig, url: str, cluster: bool = False) -> None:
        self.url = url
        self.stream = config.topic
        self.group = config.group
        self.client = redis.client(url, cluster=cluster)
        self._pending_done: set[str] = set()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except redis.UNAVAILABLE_ERRORS as exc:
            raise EventLogUnavailableError(self.url, str(exc) or type(exc).__name__) from exc

    def append(self, events: Sequence[tuple[str, bytes]], accepted_at: float) -> None:
        with self._errors():
            pipe = self.client.pipeline(transaction=False)
            for low in range(0, len(events), PER_ENTRY):
                lines = b"\n".join(line for _, line in events[low:low + PER_ENTRY])
                pipe.xadd(self.stream, {FIELD: lines, ACCEPTED: repr(accepted_at)})
            pipe.execute()

    def _ensure_group(self) -> None:
        try:
            self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis_py.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read(self, consumer: str, count: int, block_s: float) -> list[Delivered]:
        from featureline.stream.log import Delivered

        count = max(1, -(-count // PER_ENTRY))  # entries
        with self._errors():
            self._ensure_group()
            entries = []
            if consumer not in self._pending_done:  # its own pending entries first (a restart)
                entries = self._read(consumer, "0", count, None)
                if not entries:
                    self._pending_done.add(consumer)
            if not entries:  # left pending by a processor that is gone
                entries = self._claim(consumer, count)
            if not entries:
                entries = self._read(consumer, ">", count, int(block_s * 1000))
        return [Delivered(message_id, fields[FIELD], float(fields[ACCEPTED]))
                for message_id, fields in entries]

    def _read(self, consumer: str, start: str, count: int, block_ms: int | None) -> list[Any]:
        reply = cast(list[Any], self.client.xreadgroup(self.group, consumer,
                                                       {self.stream: start}, count=count,
                                                       block=block_ms))
        return reply[0][1] if reply else []

    def _claim(self, consumer: str, count: int) -> list[Any]:
        """Entries delivered to another consumer and not acknowledged for ``CLAIM_IDLE_MS``
        (it died, under a name that will not come back): now this consumer's."""
        reply = cast(list[Any], self.client.xautoclaim(self.stream, self.group, consumer,
                                                       CLAIM_IDLE_MS, "0-0", count=count))
        return [entry for entry in reply[1] if entry[1]]

    def commit(self, delivered: Sequence[Delivered]) -> None:
        if delivered:
            with self._errors():
                self.client.xack(self.stream, self.group, *[d.token for d in delivered])

    def close(self) -> None:
        self.client.close()
