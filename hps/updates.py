"""Online updates: training jobs publish changed rows to a Redis stream per model; each
parameter server consumes its stream and applies them to L3 and L2 and refreshes L1.

A message is one compact binary value: ``HPU1``, the table name, N, dim, then N int64 keys
and N × dim float32 values (little-endian). Delivery is at least once through a consumer
group — a message is acknowledged only after it has been applied, and a consumer that
restarts under the same name first re-reads what it had not acknowledged — and applying a
message twice leaves the same values, so redelivery is harmless.

A message that can never apply (not an update, an unknown table, the wrong width) is
acknowledged, counted, and copied with its error to the dead-letter stream
``hps:updates:<model>:dead`` for inspection; the consumer thread outlives it, and outlives
Redis timeouts and restarts (it waits and reads again).

Every serving process applies every update to its own tiers, so each consumes the stream in
a consumer group of its own (:func:`replica_group`: the host and the persistent store's
replica folder). The tables were imported from their sources, which hold the training up to
when they were written, so a new group starts at the messages added since then
(:func:`replay_from`), not at older ones that would overwrite newer trained vectors; and when
the server imports its replica again (a damaged RocksDB file), the group is moved back there,
so the updates the sources do not hold are applied again.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import redis as redis_py

from featureline.core import redis
from featureline.core.errors import ConfigError
from featureline.hps.config import HpsConfig, sources_written
from featureline.hps.errors import UnknownModelError
from featureline.hps.server import ParameterServer

logger = logging.getLogger("featureline.hps")

MAGIC = b"HPU1"
_HEADER = struct.Struct("<4sH")
_SIZES = struct.Struct("<II")
FIELD = b"u"
# Stream ids are Redis's clock, a source's time the writer's: replays start this much before
# the source was written, so an update made just after it is never skipped (re-applying one
# made just before it is the lesser harm).
CLOCK_MARGIN_MS = 5_000


class UpdateFormatError(ValueError):
    """A stream message that is not an update this server can decode."""


@dataclass(frozen=True)
class Update:
    table: str
    keys: np.ndarray
    vectors: np.ndarray


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _millis(message_id: bytes | str) -> int:
    """The time part of a stream message id (``<ms>-<seq>``)."""
    return int(_text(message_id).split("-")[0])


def stream_name(model: str) -> str:
    return f"hps:updates:{model}"


def dead_letter_stream(model: str) -> str:
    return f"{stream_name(model)}:dead"


def _first_unheld(written: float | None) -> str:
    """The first stream id that sources written at ``written`` may not hold."""
    if written is None:
        return "0"
    return f"{max(0, int(written * 1000) - CLOCK_MARGIN_MS)}-0"


def replay_from(server: ParameterServer, model: str) -> str:
    """The first stream id the model's tables do not already hold: a little before their
    sources were written, or the start of the stream when a table has no source."""
    return _first_unheld(server.sources_written(model))


def trim(config: HpsConfig, url: str | None = None) -> dict[str, int]:
    """Remove from each model's stream the updates its configured sources already hold
    (those before :func:`replay_from`), so the stream keeps only what a replica importing
    these sources would replay; how many messages each stream lost. A model with a table
    without a source keeps its whole stream.

    Run it once every replica serves these sources: a replica still on older ones would
    replay from before them after a rebuild, and find those updates gone.
    """
    client = _client(url or (config.updates.url if config.updates else None))
    removed = {}
    for model in config.models:
        written = sources_written(model.tables)
        # redis-py types a sync client's replies as possibly awaitable; this one is not.
        removed[model.name] = 0 if written is None else cast(int, client.xtrim(
            stream_name(model.name), minid=_first_unheld(written), approximate=False))
    return removed


def replica_group(prefix: str, replica: str) -> str:
    """The consumer group of one serving process: every replica of the tiers (one per host
    and persistent-store folder) applies every update, and resumes where it stopped."""
    return f"{prefix}@{socket.gethostname()}:{replica}"


def encode_update(table: str, keys: np.ndarray, vectors: np.ndarray) -> bytes:
    keys = np.ascontiguousarray(keys, dtype="<i8").ravel()
    vectors = np.ascontiguousarray(vectors, dtype="<f4")
    if vectors.ndim != 2 or len(vectors) != len(keys):
        raise ValueError(f"need [len(keys), dim] vectors, got {vectors.shape} for {len(keys)} keys")
    name = table.encode()
    return b"".join((_HEADER.pack(MAGIC, len(name)), name,
                     _SIZES.pack(len(keys), vectors.shape[1]), keys.tobytes(), vectors.tobytes()))


def decode_update(payload: bytes) -> Update:
    try:
        magic, name_length = _HEADER.unpack_from(payload, 0)
        if magic != MAGIC:
            raise UpdateFormatError(f"not an HPS update (starts with {magic!r})")
        offset = _HEADER.size
        table = payload[offset:offset + name_length].decode()
        offset += name_length
        count, dim = _SIZES.unpack_from(payload, offset)
        offset += _SIZES.size
        keys = np.frombuffer(payload, dtype="<i8", count=count, offset=offset)
        offset += 8 * count
        vectors = np.frombuffer(payload, dtype="<f4", count=count * dim, offset=offset)
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise UpdateFormatError(f"malformed update: {exc}") from None
    return Update(table, keys.astype(np.int64), vectors.reshape(count, dim).copy())


def _client(url: str | None) -> redis_py.Redis:
    url = url or redis.url_from_env()
    if not url:
        raise ConfigError(redis.REDIS_URL_ENV,
                          "online updates need a Redis URL (REDIS_URL or url=)")
    return redis.client(url, connect_timeout_s=5.0)


def publish(model: str, table: str, keys: np.ndarray, vectors: np.ndarray,
            url: str | None = None) -> str:
    """Append one update to the model's stream (the producer API for training jobs)."""
    message_id = cast(bytes, _client(url).xadd(stream_name(model),
                                               {FIELD: encode_update(table, keys, vectors)}))
    return message_id.decode()


class UpdateConsumer:
    """Applies one model's stream to a server; ``poll()`` once, or ``start()`` a thread."""

    def __init__(self, server: ParameterServer, model: str, url: str | None = None,
                 group: str = "hps", name: str = "hps-0", block_ms: int = 1000) -> None:
        if model not in server.tables:
            raise UnknownModelError(model, list(server.tables))
        self.server = server
        self.model = model
        self.client = _client(url)
        self.group = group
        self.name = name
        self.block_ms = block_ms
        self.applied = 0
        self.dead_lettered = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._backlog = True  # first re-read what this consumer had not acknowledged
        # The server's rebuilds this consumer has replayed the stream for; a server that
        # rebuilt its replica while it started is replayed for at the first poll.
        self._rebuilds_seen = 0
        self._ensure_group()

    def _ensure_group(self) -> None:
        """The consumer group, created at ``replay_from`` when missing (a new replica, or a
        Redis restarted without persistence)."""
        try:
            self.client.xgroup_create(stream_name(self.model), self.group,
                                      id=replay_from(self.server, self.model), mkstream=True)
        except redis_py.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _replay_after_rebuild(self) -> None:
        """After the server imported its replica again, deliver the stream again from
        ``replay_from``: the updates since the sources were written are in no tier now."""
        rebuilds = self.server.rebuilds
        if rebuilds == self._rebuilds_seen:
            return
        start = replay_from(self.server, self.model)
        self.client.xgroup_setid(stream_name(self.model), self.group, start)
        logger.warning("%s: the replica was imported again; replaying its update stream from "
                       "%s", self.model, start)
        self._rebuilds_seen = rebuilds

    def lag_seconds(self) -> float | None:
        """How far behind the stream this consumer's group is, in time: the newest message's
        id (milliseconds when it was added) less the last one delivered to the group; None
        when Redis does not answer or the group is not there yet."""
        stream = stream_name(self.model)
        try:
            last = cast(dict[str, Any], self.client.xinfo_stream(stream))["last-generated-id"]
            groups = cast(list[dict[str, Any]], self.client.xinfo_groups(stream))
        except redis_py.RedisError:
            return None
        delivered = next((g["last-delivered-id"] for g in groups
                          if _text(g["name"]) == self.group), None)
        if delivered is None:
            return None
        return max(0.0, (_millis(last) - _millis(delivered)) / 1000)

    def poll(self, count: int = 100) -> int:
        """Apply the available messages (waiting up to ``block_ms`` for one); how many."""
        self._replay_after_rebuild()
        start_id = "0" if self._backlog else ">"
        response = cast(list[Any], self.client.xreadgroup(
            self.group, self.name, {stream_name(self.model): start_id}, count=count,
            block=None if self._backlog else self.block_ms))
        messages = response[0][1] if response else []
        if self._backlog and not messages:
            self._backlog = False
        done = 0
        for message_id, fields in messages:
            if not fields:  # trimmed while pending (see trim): the sources hold it
                self.client.xack(stream_name(self.model), self.group, message_id)
                done += 1
                continue
            payload = fields.get(FIELD)
            try:
                update = decode_update(payload or b"")
                self.server.apply_update(self.model, update.table, update.keys, update.vectors)
                self.applied += 1
            except (UpdateFormatError, KeyError, ValueError) as exc:
                # A message that can never apply is kept aside and acknowledged, not retried
                # forever.
                logger.error("update %s on %s dead-lettered: %s", message_id, self.model, exc)
                self.client.xadd(dead_letter_stream(self.model), {
                    "id": message_id, "group": self.group, "error": str(exc),
                    FIELD: payload or b""})
                self.dead_lettered += 1
            self.client.xack(stream_name(self.model), self.group, message_id)
            done += 1
        return done

    def start(self) -> UpdateConsumer:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.poll()
                except redis_py.RedisError as exc:  # down, timed out, restarted: read again
                    logger.warning("update stream of %s unavailable: %s", self.model, exc)
                    self._stop.wait(1.0)
                    with contextlib.suppress(redis_py.RedisError):
                        self._ensure_group()
                except Exception:  # a tier failed (L3 damaged, say): the message stays
                    logger.exception("applying an update of %s failed; retrying", self.model)
                    self._backlog = True  # read the unacknowledged message again first
                    self._stop.wait(1.0)

        self._thread = threading.Thread(target=loop, name=f"hps-updates-{self.model}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.block_ms / 1000 + 5)


def start_consumers(server: ParameterServer) -> list[UpdateConsumer]:
    """One running consumer per model when the server's configuration has ``updates``."""
    settings = server.config.updates
    if settings is None:
        return []
    group = replica_group(settings.group, server.persistent.replica)
    return [UpdateConsumer(server, model, url=settings.url, group=group, name="replica").start()
            for model in server.tables]
