"""A single-node Apache Kafka broker (KRaft: broker and controller in one process) started
from Kafka's own release jars, for laptops and the tests; production points ``stream.url``
at its own cluster. The jars come from ``featureline.tools.kafka_classpath``.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType

from featureline.feature_store.redis_server import free_port
from featureline.stream.errors import StreamError

START_TIMEOUT_S = 90.0
HEAP = "-Xmx512m"


def server_properties(folder: Path, port: int, controller_port: int) -> str:
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "inter.broker.listener.name=PLAINTEXT",
        f"log.dirs={folder / 'data'}",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=4",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
    ]) + "\n"


def cluster_id(raw: bytes | None = None) -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding — redrawn when it
    would start with ``-`` (one in 64 draws), which Kafka's command line reads as an option
    (Kafka's own ``Uuid.randomUuid`` redraws for the same reason)."""
    while True:
        text = base64.urlsafe_b64encode(raw or uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text
        raw = None


class EmbeddedKafka:
    """``with EmbeddedKafka(folder, classpath) as broker: broker.bootstrap`` — formatted and
    started on free loopback ports, stopped (and its data kept in ``folder``) on exit."""

    def __init__(self, folder: Path, classpath: str) -> None:
        self.folder = folder
        self.classpath = classpath
        self.port = free_port()
        self.controller_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _java(self, main: str, *args: str) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise StreamError("the embedded Kafka broker needs Java (java on PATH)")
        return [java, HEAP, "-cp", self.classpath, main, *args]

    def start(self) -> EmbeddedKafka:
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self.folder / "server.properties"
        config.write_text(server_properties(self.folder, self.port, self.controller_port))
        cluster = cluster_id()
        formatted = subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(config),
                       "--ignore-formatted"), capture_output=True, text=True, check=False)
        if formatted.returncode != 0:
            raise StreamError(f"kafka storage format failed: {formatted.stderr[-500:]}")
        log = (self.folder / "broker.log").open("ab")
        self.process = subprocess.Popen(self._java("kafka.Kafka", str(config)), stdout=log,
                                        stderr=subprocess.STDOUT)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + START_TIMEOUT_S
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise StreamError(f"the Kafka broker exited ({self.process.returncode}); see "
                                  f"{self.folder / 'broker.log'}")
            try:
                if admin.list_topics(timeout=2).brokers:
                    return
            except Exception:  # not listening yet
                time.sleep(0.5)
        self.stop()
        raise StreamError(f"the Kafka broker did not start within {START_TIMEOUT_S:.0f}s; see "
                          f"{self.folder / 'broker.log'}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> EmbeddedKafka:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()
