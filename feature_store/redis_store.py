"""The online store on Redis — one server or a Redis Cluster — in Feast's layout: one hash
per entity key, one field per feature (``feature_store/online_store.py`` is the interface).

Reads are one round trip of ``HMGET``s: redis-py's pipeline spends ~10 µs of Python per
command (its command stack, response callbacks, error bookkeeping), 2 ms for a 200-entity
read, so on one server hiredis packs the commands in C and the replies are read off one
pooled connection, retried as the client's pipeline retries (a dropped connection is
reopened). On a cluster the pipeline stays: it routes each key to its node. The API reads
with redis-py's asyncio client (``read_vectors_async``): its event loop never waits on Redis,
and a request makes no hop to a worker thread (docs/ARCHITECTURE.md, "Processes that serve").

Writes go through a Lua script that compares and sets a few hundred entities per call,
pipelined, so a replace learns how many entities changed without reading the store back.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
import numpy as np
import pyarrow as pa
import redis as redis_py
from redis.crc import key_slot

from featureline.core import redis
from featureline.feature_store.errors import online_store_errors
from featureline.feature_store.publication import (
    Publication,
    generations_key,
    publication_key,
)
from featureline.feature_store.writer import (
    Layout,
    Written,
    encode_vectors,
    encoded_slices,
    vector_keys,
    vector_prefix,
)

# Entities per script call; entities and keys per pipelined round trip; keys per UNLINK.
CHUNK = 200
BATCH = 10_000
UNLINK_KEYS = 1_000
# Sets each entity's fields and returns how many entities had a feature value that differs
# from the stored one (or were new). KEYS: the entities. ARGV: the key ttl (0: none), the
# number n of feature fields, the n fields, the timestamp field, then per entity its n values
# and its timestamp. The timestamp is not compared: a snapshot re-stamped with the same
# values is not a change.
COMPARE_AND_SET = """
local ttl, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local fields = {}
for j = 1, n do fields[j] = ARGV[2 + j] end
local stamp_field = ARGV[n + 3]
local at, changed = n + 4, 0
for k = 1, #KEYS do
  local old = redis.call('HMGET', KEYS[k], unpack(fields))
  local args = {}
  for j = 1, n do
    if old[j] ~= ARGV[at + j - 1] then changed = changed + 1; break end
  end
  for j = 1, n do
    args[2 * j - 1] = fields[j]
    args[2 * j] = ARGV[at + j - 1]
  end
  args[2 * n + 1] = stamp_field
  args[2 * n + 2] = ARGV[at + n]
  redis.call('HSET', KEYS[k], unpack(args))
  if ttl > 0 then redis.call('EXPIRE', KEYS[k], ttl) end
  at = at + n + 1
end
return changed
"""
logger = logging.getLogger("featureline.feature_store")
# COMPARE_AND_SET without the compare: sets each entity's fields, returns how many.
SET_ONLY = """
local ttl, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local at = n + 4
for k = 1, #KEYS do
  local args = {}
  for j = 1, n do
    args[2 * j - 1] = ARGV[2 + j]
    args[2 * j] = ARGV[at + j - 1]
  end
  args[2 * n + 1] = ARGV[n + 3]
  args[2 * n + 2] = ARGV[at + n]
  redis.call('HSET', KEYS[k], unpack(args))
  if ttl > 0 then redis.call('EXPIRE', KEYS[k], ttl) end
  at = at + n + 1
end
return #KEYS
"""
# The publication's fields a read fetches with the values: when, and which generation of
# entity vectors it serves.
STAMP_FIELDS = ("published_at", "generation")
# Seconds a listener waits for a message before it looks at its stop flag, and before it
# subscribes again after the server went away.
LISTEN_POLL_S = 0.5
RESUBSCRIBE_S = 1.0


class RedisOnlineStore:
    """The online store on one Redis server (``redis://[user:password@]host:port/db``)."""

    cluster = False

    def __init__(self, url: str, timeout_s: float = redis.SOCKET_TIMEOUT_S) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.client = redis.client(url, cluster=self.cluster, timeout_s=timeout_s)
        # The asyncio client, and the event loop its connections belong to.
        self._async: tuple[asyncio.AbstractEventLoop, Any] | None = None
        # Sent by digest (a cluster's pipeline cannot load a script), loaded where a server
        # lacks one (``redis.execute_with_scripts``).
        self.scripts = {compare: self.client.register_script(COMPARE_AND_SET if compare
                                                             else SET_ONLY)
                        for compare in (True, False)}

    # Reads

    def read_vectors(self, keys: Sequence[bytes], project: str
                     ) -> tuple[list[bytes | None], list[bytes | None]]:
        # The stamp after the values: if it still names their generation, they were all
        # read while it was the served one (docs/ARCHITECTURE.md, "Publishing").
        with online_store_errors(self.url):
            answers = self._execute(self._read_commands(keys, project))
        return answers[-1], answers[0] if keys else []

    async def read_vectors_async(self, keys: Sequence[bytes], project: str
                                 ) -> tuple[list[bytes | None], list[bytes | None]]:
        with online_store_errors(self.url):
            answers = await self._execute_async(self._read_commands(keys, project))
        return answers[-1], answers[0] if keys else []

    @staticmethod
    def _read_commands(keys: Sequence[bytes], project: str) -> list[tuple[Any, ...]]:
        commands: list[tuple[Any, ...]] = [("MGET", *keys)] if keys else []
        commands.append(("HMGET", publication_key(project), *STAMP_FIELDS))
        return commands

    def _async_client(self) -> Any:
        """The asyncio client of the running event loop (a client's connections serve the
        loop that opened them: a new loop, as a test harness may start, gets its own)."""
        loop = asyncio.get_running_loop()
        if self._async is None or self._async[0] is not loop:
            self._async = (loop, redis.client(self.url, cluster=self.cluster,
                                              timeout_s=self.timeout_s, asynchronous=True))
        return self._async[1]

    async def _execute_async(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """:meth:`_execute` on the asyncio client."""
        pool = self._async_client().connection_pool
        connection = await pool.get_connection()
        packed = b"".join(map(hiredis.pack_command, commands))

        async def round_trip() -> list[Any]:
            await connection.send_packed_command([packed])
            return [await connection.read_response() for _ in commands]

        async def dropped(_: BaseException) -> None:
            await connection.disconnect()

        try:
            return await connection.retry.call_with_retry(round_trip, dropped)
        except BaseException:
            await connection.disconnect()  # replies may be left unread on it
            raise
        finally:
            await pool.release(connection)

    def _execute(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """The replies to ``commands``, sent packed in one round trip."""
        pool = self.client.connection_pool
        connection = pool.get_connection()
        packed = b"".join(map(hiredis.pack_command, commands))

        def round_trip() -> list[Any]:
            connection.send_packed_command([packed])
            return [connection.read_response() for _ in commands]

        try:
            return connection.retry.call_with_retry(round_trip,
                                                    lambda _: connection.disconnect())
        except BaseException:
            connection.disconnect()  # replies may be left unread on it
            raise
        finally:
            pool.release(connection)

    def project_keys(self, project: str) -> set[bytes]:
        # Feast's keys start with the serialized entity key (binary), the entity vectors'
        # with theirs; the stamp and the counter are ours too.
        skip = (publication_key(project).encode(), generations_key(project).encode())
        with online_store_errors(self.url):
            return {k for k in self.client.scan_iter(match=f"*{project}", count=BATCH)
                    if k not in skip}

    def holding(self, keys: Sequence[bytes], views: Sequence[str]) -> list[bytes]:
        """Those of ``keys`` whose hash holds one of the views' timestamp fields."""
        stamps = [f"_ts:{view}" for view in views]
        held = []
        with online_store_errors(self.url):
            for low in range(0, len(keys), BATCH):
                batch = keys[low:low + BATCH]
                pipe = self.client.pipeline(transaction=False)
                for key in batch:
                    pipe.hmget(key, stamps)
                held += [key for key, found in zip(batch, pipe.execute(), strict=True)
                         if any(value is not None for value in found)]
        return held

    def keys_under(self, prefix: bytes) -> set[bytes]:
        # SCAN's pattern: the prefix's glob characters escaped.
        pattern = re.sub(rb"([*?\[\]\\])", rb"\\\1", prefix) + b"*"
        with online_store_errors(self.url):
            return set(self.client.scan_iter(match=pattern, count=BATCH))

    def write_values(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        with online_store_errors(self.url):
            for low in range(0, len(keys), BATCH):
                pipe = self.client.pipeline(transaction=False)
                self._set(pipe, list(keys[low:low + BATCH]), list(values[low:low + BATCH]),
                          None)
                pipe.execute()

    def publication(self, project: str) -> Publication | None:
        with online_store_errors(self.url):
            fields = self.client.hgetall(publication_key(project))
        if not fields:
            return None
        text = {k.decode(): v.decode() for k, v in fields.items()}
        return Publication(dataset_version=text["dataset_version"], output=text["output"],
                           published_at=text["published_at"],
                           vocabularies=json.loads(text.get("vocabularies", "{}")),
                           generation=int(text.get("generation", 0)),
                           layout=int(text.get("layout", 1)))

    def ping(self) -> bool:
        try:
            return bool(self.client.ping())
        except redis.UNAVAILABLE_ERRORS:
            return False

    # Writes

    def _chunks(self, keys: list[bytes]) -> list[np.ndarray]:
        """Row indices, ``CHUNK`` at most per script call."""
        return [np.arange(low, min(low + CHUNK, len(keys))) for low in range(0, len(keys), CHUNK)]

    def write_view(self, rows: pa.Table, layout: Layout,
                   progress: Callable[[int], None] | None = None, *,
                   keep_keys: bool = True, compare: bool = True,
                   generation: int | None = None) -> Written:
        changed = written = 0
        prefix = None if generation is None else vector_prefix(layout.project, generation,
                                                               layout.view)
        written_keys: set[bytes] = set()
        script = self.scripts[compare]
        with online_store_errors(self.url):
            for part, keys, fields, by_row in encoded_slices(rows, layout):
                vectors = [] if prefix is None else encode_vectors(part, layout)
                head = [layout.key_ttl_seconds or 0, len(fields) - 1, *fields]
                chunks = self._chunks(keys)
                per_batch = max(1, BATCH // CHUNK)
                for low in range(0, len(chunks), per_batch):
                    batch = [chunk.tolist() for chunk in chunks[low:low + per_batch]]
                    calls = [([keys[i] for i in indices],
                              [*head, *(value for i in indices for value in by_row[i])])
                             for indices in batch]
                    sets = [] if prefix is None else [
                        (vector_keys(prefix, [keys[i] for i in indices]),
                         [vectors[i] for i in indices]) for indices in batch]
                    # Sent again where a server lacked the script: the same writes (a count
                    # of changes may miss those a cluster node that held it made the first
                    # time).
                    replies = redis.execute_with_scripts(self.client, [script], functools.partial(
                        self._queue_writes, script=script, calls=calls, sets=sets,
                        ttl=layout.key_ttl_seconds))
                    changed += int(sum(replies[:len(batch)]))
                    written += sum(map(len, batch))
                    if progress is not None:
                        progress(written)
                if keep_keys:
                    written_keys.update(keys)
        return Written(written, changed, written_keys)

    def _queue_writes(self, pipe: Any, *, script: Any, calls: list[tuple[list[bytes], list[Any]]],
                      sets: list[tuple[list[bytes], list[bytes]]], ttl: int | None) -> None:
        """Queue ``script`` with each ``(keys, args)`` of ``calls``, then each ``(keys,
        values)`` of ``sets`` (after the scripts, whose replies count changes)."""
        for keys, args in calls:
            redis.queue_script(pipe, script.sha, keys, args)
        for keys, values in sets:
            self._set(pipe, keys, values, ttl)

    def _set(self, pipe: Any, keys: list[bytes], values: list[bytes], ttl: int | None) -> None:
        """Queue the string ``values`` at ``keys`` on ``pipe``: one MSET, or one SET each with
        the keys' ttl."""
        if ttl:
            for key, value in zip(keys, values, strict=True):
                pipe.set(key, value, ex=ttl)
        else:
            pipe.execute_command("MSET", *[x for pair in zip(keys, values, strict=True)
                                           for x in pair])

    def delete(self, keys: Sequence[bytes]) -> None:
        # UNLINK: the server frees the values in the background, not between two reads.
        with online_store_errors(self.url):
            for low in range(0, len(keys), BATCH):
                pipe = self.client.pipeline(transaction=False)
                for first in range(low, min(low + BATCH, len(keys)), UNLINK_KEYS):
                    pipe.execute_command("UNLINK", *keys[first:min(first + UNLINK_KEYS,
                                                                     low + BATCH)])
                pipe.execute()

    def next_generation(self, project: str, served: int) -> int:
        with online_store_errors(self.url):
            generation = int(self.client.incr(generations_key(project)))
            if generation <= served:  # the counter was lost: above the served one
                generation = served + 1
                self.client.set(generations_key(project), generation)
        return generation

    def write_publication(self, project: str, publication: Publication) -> None:
        with online_store_errors(self.url):
            self.client.hset(publication_key(project), mapping={
                "dataset_version": publication.dataset_version, "output": publication.output,
                "published_at": publication.published_at, "generation": publication.generation,
                "layout": publication.layout,
                "vocabularies": json.dumps(publication.vocabularies)})

    # Notifications: Redis channels, shared by every database of a server, so each is named
    # for the database too.

    def channel(self, topic: str) -> str:
        pool = getattr(self.client, "connection_pool", None)
        database = pool.connection_kwargs.get("db", 0) if pool is not None else 0
        return f"featureline:db{database}:{topic}"

    def announce(self, topic: str, message: bytes) -> int:
        with online_store_errors(self.url):
            return int(self.client.publish(self.channel(topic), message))

    def listen(self, topic: str, on_message: Callable[[bytes], None], stop: threading.Event,
               subscribed: threading.Event) -> None:
        while not stop.is_set():
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self.channel(topic))
                subscribed.set()
                while not stop.is_set():
                    message = pubsub.get_message(timeout=LISTEN_POLL_S)
                    if message is not None:
                        on_message(message["data"])
            except redis_py.RedisError as exc:  # down or restarted: subscribe again
                logger.warning("channel %s unavailable: %s", topic, exc)
                stop.wait(RESUBSCRIBE_S)
            finally:
                pubsub.close()

    def close(self) -> None:
        self.client.close()

    async def close_async(self) -> None:
        """Close the asyncio client's connections, on the event loop they belong to."""
        if self._async is not None and self._async[0] is asyncio.get_running_loop():
            client = self._async[1]
            await client.aclose()
            # A sentinel-watched primary's client also holds clients of the sentinels.
            manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager",
                              None)
            for sentinel in getattr(manager, "sentinels", ()):
                await sentinel.aclose()
        self._async = None


class RedisClusterOnlineStore(RedisOnlineStore):
    """The online store on a Redis Cluster (the URL names any one node)."""

    cluster = True

    def _execute(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return pipe.execute()

    def read_vectors(self, keys: Sequence[bytes], project: str
                     ) -> tuple[list[bytes | None], list[bytes | None]]:
        # One GET per key (a cluster's MGET takes one slot); the stamp once the values are
        # in: its node may answer before theirs.
        with online_store_errors(self.url):
            values = self._execute([("GET", key) for key in keys]) if keys else []
            stamp = self.client.hmget(publication_key(project), STAMP_FIELDS)
        return stamp, values

    async def read_vectors_async(self, keys: Sequence[bytes], project: str
                                 ) -> tuple[list[bytes | None], list[bytes | None]]:
        client = self._async_client()
        with online_store_errors(self.url):
            values = []
            if keys:
                pipe = client.pipeline(transaction=False)
                for key in keys:
                    pipe.get(key)
                values = await pipe.execute()
            stamp = await client.hmget(publication_key(project), STAMP_FIELDS)
        return stamp, values

    def _set(self, pipe: Any, keys: list[bytes], values: list[bytes], ttl: int | None) -> None:
        for key, value in zip(keys, values, strict=True):
            pipe.set(key, value, ex=ttl or None)

    def delete(self, keys: Sequence[bytes]) -> None:
        # One key per command: a cluster's multi-key command takes one slot.
        with online_store_errors(self.url):
            for low in range(0, len(keys), BATCH):
                pipe = self.client.pipeline(transaction=False)
                for key in keys[low:low + BATCH]:
                    pipe.unlink(key)
                pipe.execute()

    def _chunks(self, keys: list[bytes]) -> list[np.ndarray]:
        """Row indices, ``CHUNK`` at most per script call, each call's keys in one hash slot
        (a script's keys must share one)."""
        slots = np.array([key_slot(key) for key in keys], dtype=np.int64)
        order = np.argsort(slots, kind="stable")
        bounds = np.flatnonzero(np.diff(slots[order])) + 1
        return [part[low:low + CHUNK] for part in np.split(order, bounds)
                for low in range(0, len(part), CHUNK)]
