"""The event log on Apache Kafka (``stream.log: kafka``, ``stream.url``: bootstrap servers):
one topic of ``stream.partitions`` partitions, events keyed by user so that one user's
events keep their order and processors scale out as a consumer group.

The producer is idempotent and waits for every replica in sync (``acks=all``): ``append``
returns once the broker stored every event, else raises. Processors commit offsets only
after the features are written (auto-commit off); a processor restarted under its name
rejoins as the same static member (``group.instance.id``) and resumes from the group's
committed offsets, without waiting out the dead member's session.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from featureline.stream.errors import EventLogUnavailableError
from featureline.stream.settings import StreamConfig

if TYPE_CHECKING:
    from featureline.stream.log import Delivered

APPEND_TIMEOUT_S = 10.0
# A dead member's partitions go to the others after this long (the broker's minimum).
SESSION_TIMEOUT_MS = 6000


class KafkaLog:
    def __init__(self, config: StreamConfig, url: str) -> None:
        self.url = url
        self.topic = config.topic
        self.group = config.group
        self.partitions = config.partitions
        self._producer: Any = None
        self._consumer: Any = None
        self._lock = threading.Lock()
        self._topic_ready = False

    def _ensure_topic(self) -> None:
        """The topic, created with ``partitions`` partitions when missing."""
        if self._topic_ready:
            return
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.url, "log_level": 0})
        try:
            metadata = admin.list_topics(timeout=APPEND_TIMEOUT_S)
            if self.topic not in metadata.topics:
                future = admin.create_topics([NewTopic(self.topic, self.partitions, 1)])
                try:
                    future[self.topic].result(timeout=APPEND_TIMEOUT_S)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise
        except KafkaException as exc:
            raise EventLogUnavailableError(self.url, str(exc)) from exc
        self._topic_ready = True

    def append(self, events: Sequence[tuple[str, bytes]], accepted_at: float) -> None:
        from confluent_kafka import KafkaException, Producer

        with self._lock:
            self._ensure_topic()
            if self._producer is None:
                self._producer = Producer({
                    "bootstrap.servers": self.url, "enable.idempotence": True, "acks": "all",
                    "linger.ms": 2, "message.timeout.ms": int(APPEND_TIMEOUT_S * 1000),
                    "log_level": 0})
            failures: list[str] = []

            def delivered(error: Any, _: Any) -> None:
                if error is not None:
                    failures.append(str(error))

            try:
                # One message per event; its timestamp is the time it was accepted.
                stamp = int(accepted_at * 1000)
                for key, line in events:
                    self._producer.produce(self.topic, line, key.encode(), timestamp=stamp,
                                           on_delivery=delivered)
                    self._producer.poll(0)
                left = self._producer.flush(APPEND_TIMEOUT_S)
            except (KafkaException, BufferError) as exc:
                raise EventLogUnavailableError(self.url, str(exc)) from exc
            if left or failures:
                reason = failures[0] if failures else f"{left} events not confirmed"
                raise EventLogUnavailableError(self.url, reason)

    def read(self, consumer: str, count: int, block_s: float) -> list[Delivered]:
        from confluent_kafka import Consumer, KafkaException

        from featureline.stream.log import Delivered

        if self._consumer is None:
            self._ensure_topic()
            self._consumer = Consumer({
                "bootstrap.servers": self.url, "group.id": self.group,
                "group.instance.id": consumer, "client.id": consumer,
                "enable.auto.commit": False, "auto.offset.reset": "earliest",
                "session.timeout.ms": SESSION_TIMEOUT_MS, "log_level": 0})
            self._consumer.subscribe([self.topic])
        try:
            messages = self._consumer.consume(num_messages=count, timeout=block_s)
        except KafkaException as exc:
            raise EventLogUnavailableError(self.url, str(exc)) from exc
        delivered = []
        for message in messages:
            if message.error() is not None:
                raise EventLogUnavailableError(self.url, str(message.error()))
            delivered.append(Delivered((message.partition(), message.offset()),
                                       message.value(), message.timestamp()[1] / 1000))
        return delivered

    def commit(self, delivered: Sequence[Delivered]) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        if not delivered or self._consumer is None:
            return
        next_offsets: dict[int, int] = {}
        for item in delivered:
            partition, offset = item.token
            next_offsets[partition] = max(next_offsets.get(partition, 0), offset + 1)
        try:
            self._consumer.commit(offsets=[TopicPartition(self.topic, p, o)
                                           for p, o in next_offsets.items()],
                                  asynchronous=False)
        except KafkaException as exc:
            raise EventLogUnavailableError(self.url, str(exc)) from exc

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(APPEND_TIMEOUT_S)
        if self._consumer is not None:
            self._consumer.close()
