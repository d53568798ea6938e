"""A model reload reaches every API process: the worker that takes ``POST
/v1/admin/models/{name}/reload`` reloads, then announces it on a Redis channel that every
worker of every pod listens to; the others reload on hearing it.

The listener is a thread per process; it outlives Redis restarts (it subscribes again) and a
reload that fails (logged; the next announcement tries again). Redis channels are shared by
every database of a server, so the channel is named for the Feast project and the database
the deployment's online store uses.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

import redis as redis_py

logger = logging.getLogger("featureline.api")

def channel(client: Any, project: str) -> str:
    """The reload channel of the deployment whose online store ``client`` reaches."""
    pool = getattr(client, "connection_pool", None)
    database = pool.connection_kwargs.get("db", 0) if pool is not None else 0
    return f"featureline:{project}:db{database}:hps:reload"


def process_id() -> str:
    """This process among every worker of every pod."""
    return f"{socket.gethostname()}:{os.getpid()}"


def announce(client: Any, project: str, model: str) -> int:
    """Tell every listening process to reload ``model``; how many processes heard it."""
    return int(client.publish(channel(client, project),
                              json.dumps({"model": model, "origin": process_id()})))


class ReloadListener:
    """Reloads the models other processes announce, in a background thread."""

    def __init__(self, client: Any, project: str, reload: Callable[[str], object]) -> None:
        """``reload``: what this process does for an announced model (``Services.reload_here``)."""
        self.client = client
        self.channel = channel(client, project)
        self.reload = reload
        self.reloads = 0
        self._stop = threading.Event()
        self._subscribed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hps-reload", daemon=True)

    def start(self, timeout_s: float = 5.0) -> ReloadListener:
        """Start listening; returns once subscribed (or after ``timeout_s``)."""
        self._thread.start()
        self._subscribed.wait(timeout_s)
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self.channel)
                self._subscribed.set()
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message is not None:
                        self._handle(message["data"])
            except redis_py.RedisError as exc:  # down or restarted: subscribe again
                logger.warning("reload channel unavailable: %s", exc)
                self._stop.wait(1.0)
            finally:
                pubsub.close()

    def _handle(self, data: bytes | str) -> None:
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
