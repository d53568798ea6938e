"""The online store's interface: what the API, ``featureline publish`` and the reload
broadcast ask of the store that holds the served feature values (docs/ARCHITECTURE.md,
"Where new things go").

Modelled on Feast's ``OnlineStore`` (``online_read`` / ``online_write_batch``), at the level
our reader and writer work at: the values are written in Feast's layout (one hash per entity
key, one field per feature, ``feature_store/writer.py`` makes the keys and bytes) so that
Feast's own clients read what we write, and as one entity vector per view and entity,
versioned by a generation the publication stamp names, which our reader reads. A backend is
a class with these methods and one line in :data:`ONLINE_STORES`;
``feature_store.redis_type`` (Feast's own setting) picks it.

Every method raises :class:`~featureline.feature_store.errors.OnlineStoreUnavailableError`
when the store cannot serve (down, timed out, refusing), never the client library's errors.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import pyarrow as pa

from featureline.core.redis import SOCKET_TIMEOUT_S
from featureline.feature_store.publication import Publication
from featureline.feature_store.redis_store import RedisClusterOnlineStore, RedisOnlineStore
from featureline.feature_store.writer import Layout, Written


class OnlineStore(Protocol):
    # As configured: may hold a password (``core.redis.redact`` before printing it).
    url: str

    def read_vectors(self, keys: Sequence[bytes], project: str
                     ) -> tuple[list[bytes | None], list[bytes | None]]:
        """The publication stamp of ``project`` (its ``published_at`` and ``generation``,
        None where absent) and the string stored at each of ``keys`` (None: absent), in
        one round trip on one server; the stamp is read after the values."""
        ...

    async def read_vectors_async(self, keys: Sequence[bytes], project: str
                                 ) -> tuple[list[bytes | None], list[bytes | None]]:
        """:meth:`read_vectors` for a caller on an event loop, which it never blocks."""
        ...

    def write_view(self, rows: pa.Table, layout: Layout,
                   progress: Callable[[int], None] | None = None, *,
                   keep_keys: bool = True, compare: bool = True,
                   generation: int | None = None) -> Written:
        """Write ``rows`` (one per entity) into the view's fields: how many entities were
        written and how many had a value that differs from the stored one (or were new;
        without ``compare``, every one counts as changed and nothing is read);
        ``keep_keys``: also every key written; ``generation``: also each entity's vector
        of that generation."""
        ...

    def next_generation(self, project: str, served: int) -> int:
        """A generation number of the project's entity vectors never used before, above
        ``served``."""
        ...

    def project_keys(self, project: str) -> set[bytes]:
        """Every entity key of the project: in Feast's layout, and its entity vectors of every
        generation (its publication stamp and generation counter excluded)."""
        ...

    def holding(self, keys: Sequence[bytes], views: Sequence[str]) -> list[bytes]:
        """Those of ``keys`` that hold values of any of ``views``."""
        ...

    def keys_under(self, prefix: bytes) -> set[bytes]:
        """Every key that starts with ``prefix`` (the aggregations' tiles of a project)."""
        ...

    def write_values(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """Set each of ``keys`` to its string of ``values``, pipelined."""
        ...

    def delete(self, keys: Sequence[bytes]) -> None:
        ...

    def publication(self, project: str) -> Publication | None:
        """The stamp of the dataset last published into the project (None before any)."""
        ...

    def write_publication(self, project: str, publication: Publication) -> None:
        ...

    def announce(self, topic: str, message: bytes) -> int:
        """Send ``message`` to every process listening on ``topic``; how many heard it."""
        ...

    def listen(self, topic: str, on_message: Callable[[bytes], None], stop: threading.Event,
               subscribed: threading.Event) -> None:
        """Call ``on_message`` with each message announced on ``topic`` until ``stop`` is
        set, subscribing again after the store went away; ``subscribed`` is set once
        listening. Blocks: run it in a thread of its own."""
        ...

    def ping(self) -> bool:
        """Whether the store answers now (never raises)."""
        ...

    def close(self) -> None:
        ...

    async def close_async(self) -> None:
        """Close what :meth:`read_vectors_async` opened on the running event loop."""
        ...


# Feast's ``online_store.redis_type`` → the backend (a class taking the URL, then the socket
# timeout in seconds).
ONLINE_STORES: dict[str, Callable[[str, float], OnlineStore]] = {
    "redis": RedisOnlineStore,
    "redis_cluster": RedisClusterOnlineStore,
    # The same store; its redis+sentinel:// URL makes the client follow the primary.
    "redis_sentinel": RedisOnlineStore,
}


def open_online_store(kind: str, url: str, timeout_s: float = SOCKET_TIMEOUT_S) -> OnlineStore:
    """A client of the online store of type ``kind`` (``feature_store.redis_type``) at
    ``url``."""
    return ONLINE_STORES[kind](url, timeout_s)
