"""Announcements every API process hears: model reloads, and the entities the stream
processor rewrote (their cached values are forgotten).

A model reload reaches every API process: the worker that takes ``POST
/v1/admin/models/{name}/reload`` reloads, then announces it through the online store's
notifications (``feature_store/online_store.py``) on the project's reload topic; every other
worker of every pod listens there and reloads on hearing it.

The listener is a thread per process; it outlives store restarts (the store subscribes
again) and a reload that fails (logged; the next announcement tries again).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable

from featureline.feature_store.online import ValueCache
from featureline.feature_store.online_store import OnlineStore

logger = logging.getLogger("featureline.api")


def topic(project: str) -> str:
    """The reload topic of the deployment serving the Feast project ``project``."""
    return f"{project}:hps:reload"


def process_id() -> str:
    """This process among every worker of every pod."""
    return f"{socket.gethostname()}:{os.getpid()}"


def announce(store: OnlineStore, project: str, model: str) -> int:
    """Tell every listening process to reload ``model``; how many processes heard it."""
    message = json.dumps({"model": model, "origin": process_id()}).encode()
    return store.announce(topic(project), message)


class ReloadListener:
    """Reloads the models other processes announce, in a background thread."""

    def __init__(self, store: OnlineStore, project: str, reload: Callable[[str], object]) -> None:
        """``reload``: what this process does for an announced model (``Services.reload_here``)."""
        self.store = store
        self.topic = topic(project)
        self.reload = reload
        self.reloads = 0
        self._stop = threading.Event()
        self._subscribed = threading.Event()
        self._thread = threading.Thread(
            target=store.listen, args=(self.topic, self._handle, self._stop, self._subscribed),
            name="hps-reload", daemon=True)

    def start(self, timeout_s: float = 5.0) -> ReloadListener:
        """Start listening; returns once subscribed (or after ``timeout_s``)."""
        self._thread.start()
        self._subscribed.wait(timeout_s)
        return self

    def _handle(self, data: bytes) -> None:
        try:
            message = json.loads(data)
            if message.get("origin") == process_id():
                return
            self.reload(message["model"])
            self.reloads += 1
        except Exception:  # a bad message or a failed reload must not end the listener
            logger.exception("announced reload %r failed", data)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class EvictionListener:
    """Forgets the cached values of the entities the stream processor rewrote, so that the
    feature cache never serves a value older than the stream's for longer than the
    announcement takes."""

    def __init__(self, store: OnlineStore, topic: str, cache: ValueCache) -> None:
        self.cache = cache
        self.evicted = 0
        self._stop = threading.Event()
        subscribed = threading.Event()
        self._thread = threading.Thread(target=store.listen,
                                        args=(topic, self._handle, self._stop, subscribed),
                                        name="feature-cache-evictions", daemon=True)
        self._thread.start()
        subscribed.wait(5.0)

    def _handle(self, data: bytes) -> None:
        try:
            entries = [(view, value) for view, value in json.loads(data)]
        except (ValueError, TypeError):
            logger.exception("bad eviction message %r", data)
            return
        self.cache.evict(entries)
        self.evicted += len(entries)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
