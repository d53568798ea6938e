"""Fault injection under load: nothing lost, nothing wrong, no 500 — counted.

An open-loop load on ``/v1/features``, ``/v1/embeddings/lookup`` and ``/v1/ranking-inputs``
of ``featureline serve --workers 2`` (online store and L2 cache in an embedded Redis, RocksDB
replicas per worker) while, one after another:

- ``redis_restart``: Redis saves, stops, stays down, starts again on the same port;
- ``redis_oom``: Redis answers OOM to every write (``maxmemory 1``), then gets its memory back;
- ``worker_kill``: one API worker is SIGKILLed (uvicorn starts another);
- ``rocksdb_damage``: one RocksDB table file of a worker's replica is overwritten in the middle.
- ``redis_empty_restart``: Redis stops and comes back without its data (no persistence);
  ``featureline publish --repair`` (what the featureline-repair CronJob runs) republishes.

Then the same service on a Redis primary with a replica and three sentinels
(``redis+sentinel://``, online store and L2 cache alike) while:

- ``primary_kill``: the primary is SIGKILLed; the sentinels promote the replica.

Then an ETL run is SIGKILLed (its whole process group, the JVM too) as its output is swapped
in, and run again.

Every 200 is compared byte for byte with the answer of the healthy server, itself checked
value by value against the source tables first. The JSON counts requests sent, answered
correctly, 503s with and without ``Retry-After``, other 5xx (must be 0), wrong answers (must
be 0), dropped connections; per fault the time to recover; for the ETL whether the output was
whole after the kill and whether the rerun's rows add up exactly. Loopback only; it stops by
itself (every wait is bounded).

    python benchmarks/chaos.py
    python benchmarks/chaos.py --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow.dataset as ds
import redis
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_api import REPO, _Connections, _wait_ready
from bench_feast import SNAPSHOT, write_output

from featureline.config import parse_config
from featureline.core.errors import FeaturelineError
from featureline.core.metadata import read_metadata
from featureline.etl.datagen import write_log
from featureline.feature_store.publish import publish
from featureline.feature_store.redis_server import (
    EmbeddedRedis,
    EmbeddedRedisSentinel,
    free_port,
)
from featureline.feature_store.repo import open_repo
from featureline.hps.formats import write_hugectr

BIN = Path(sys.executable).parent
ROUTES = ("/v1/features", "/v1/embeddings/lookup", "/v1/ranking-inputs")
DIM = 16
REQUEST_TIMEOUT_S = 10.0
# Every wait for a recovery gives up after this long (the fault then reports no recovery).
RECOVERY_LIMIT_S = 90.0
OUTCOMES = ("correct", "unavailable_503_with_retry_after", "503_without_retry_after",
            "other_5xx", "wrong", "client_error", "connection_dropped", "timeout")


# --- the service under test -------------------------------------------------------------

def _tables(root: Path, entities: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    vectors = {}
    for name in ("user", "item"):
        keys = np.arange(entities + 2, dtype=np.int64)
        vectors[name] = rng.standard_normal((len(keys), DIM)).astype(np.float32)
        write_hugectr(root / "tables" / name, keys, vectors[name])
    return vectors


class Service:
    """Redis (one server, or a primary, a replica and sentinels), the published online
    store, the embedding tables and two API workers."""

    def __init__(self, root: Path, entities: int, sentinel: bool = False) -> None:
        self.root = root
        self.entities = entities
        self.redis: Any = (EmbeddedRedisSentinel(root / "redis") if sentinel
                           else EmbeddedRedis(root / "redis")).start()
        self.output = write_output(root, entities)
        self.vectors = _tables(root, entities)
        hps_url = self.redis.url.rsplit("/", 1)[0] + "/1"
        # Small upper tiers, so lookups keep reaching L2 and L3 where the faults are.
        (root / "hps.yaml").write_text(yaml.safe_dump({
            "models": [{"name": "ranker", "cache_fraction": 0.02, "tables": [
                {"name": n, "dim": DIM, "source": str(root / "tables" / n)}
                for n in ("user", "item")]}],
            "volatile_db": {"type": "redis", "url": hps_url, "capacity": 1000},
            "persistent_db": {"path": str(root / "rocksdb")}, "cache_device": "cpu"}))
        repo = root / "feature_store"
        repo.mkdir(parents=True)
        (repo / "feature_store.yaml").write_text((REPO / "feature_store.yaml").read_text())
        self.port = free_port()
        settings = {"feature_store": {"repo": str(repo), "ttl": "3650d", "redis_type":
                                      "redis_sentinel" if sentinel else "redis"},
                    "api": {"port": self.port, "data": str(self.output),
                            "hps": str(root / "hps.yaml"), "auth": {"enabled": False},
                            "retry_after_s": 1}}
        config = parse_config(settings)
        with contextlib.redirect_stdout(sys.stderr):  # Feast's progress; ours is JSON
            publish(open_repo(config.feature_store, self.output, url=self.redis.url),
                    end=SNAPSHOT, progress=lambda _: None)
        (root / "featureline.yaml").write_text(yaml.safe_dump(settings))
        self.log = root / "serve.log"
        self.process = subprocess.Popen(
            [str(BIN / "featureline"), "serve", "--config", str(root / "featureline.yaml"),
             "--workers", "2"], env={**os.environ, "REDIS_URL": self.redis.url},
            stdout=self.log.open("w"), stderr=subprocess.STDOUT, cwd=root)
        self.base = f"http://127.0.0.1:{self.port}"
        _wait_ready(f"{self.base}/readyz", self.process)
        if _until(lambda: self.replacement_ready(-1), RECOVERY_LIMIT_S) is None:
            raise RuntimeError(f"the two workers did not start: {self.log.read_text()[-2000:]}")

    def log_count(self, text: str) -> int:
        return self.log.read_text(errors="replace").count(text)

    def workers(self) -> list[int]:
        """The worker processes' pids (children of the supervisor, not its helpers)."""
        pid = self.process.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return [int(c) for c in children
                if b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()]

    def replica_of(self, pid: int) -> Path | None:
        """The RocksDB replica folder the process holds (its LOCK file is open)."""
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = Path(os.readlink(fd))
                if target.name == "LOCK" and target.parent.name.startswith("rocksdb"):
                    return target.parent
        return None

    def replacement_ready(self, dead: int) -> bool:
        """Two workers again, each holding its replica (opened as its startup ends)."""
        workers = self.workers()
        return (len(workers) == 2 and dead not in workers
                and all(self.replica_of(pid) is not None for pid in workers))

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.redis.stop()


def _until(check: Callable[[], bool], limit_s: float) -> float | None:
    """Seconds until ``check()`` holds, polled every 50 ms; None after ``limit_s``."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        try:
            if check():
                return round(time.monotonic() - started, 2)
        except (OSError, httpx.HTTPError, redis.RedisError):
            pass
        time.sleep(0.05)
    return None


# --- requests and their right answers ---------------------------------------------------

def _bodies(entities: int, count: int) -> dict[str, list[dict[str, Any]]]:
    rng = np.random.default_rng(2)

    def ids(prefix: str, n: int) -> list[str]:
        return [f"{prefix}{i}" for i in rng.integers(0, entities, n)]

    return {
        "/v1/features": [{"service": "ranking",
                          "entities": {"user_id": ids("u", 10), "item_id": ids("i", 10)}}
                         for _ in range(count)],
        "/v1/embeddings/lookup": [{"model": "ranker", "table": "item",
                                   "keys": [int(k) for k in rng.integers(2, entities + 2, 32)]}
                                  for _ in range(count)],
        "/v1/ranking-inputs": [{"user_id": ids("u", 1)[0], "item_ids": ids("i", 20)}
                               for _ in range(count)],
    }


def _check_features(answer: dict[str, Any], ids: dict[str, list[str]],
                    tables: dict[str, Any]) -> None:
    for name, values in answer["values"].items():
        column = name.split(":")[-1].split("__")[-1]
        entity = column.split("_", 1)[0]
        rows = [int(i[1:]) for i in ids[f"{entity}_id"]]
        expected = tables[entity][column].to_numpy()[rows]
        assert np.allclose(np.asarray(values, dtype=float), expected), name


def _check_vectors(vectors: list[list[float]], expected: np.ndarray) -> None:
    assert np.array_equal(np.asarray(vectors, dtype=np.float32), expected)


def golden_answers(service: Service, bodies: dict[str, list[dict[str, Any]]]
                   ) -> dict[str, list[bytes]]:
    """The healthy server's answers, each checked against the source tables."""
    tables = {e: ds.dataset(service.output / "entities" / e).to_table().to_pandas()
              for e in ("user", "item")}
    golden: dict[str, list[bytes]] = {}
    with httpx.Client(base_url=service.base, timeout=30) as client:
        for route, route_bodies in bodies.items():
            golden[route] = []
            for body in route_bodies:
                response = client.post(route, json=body)
                assert response.status_code == 200, (route, response.text)
                answer = response.json()
                if route == "/v1/features":
                    _check_features(answer, body["entities"], tables)
                elif route == "/v1/embeddings/lookup":
                    _check_vectors(answer["vectors"], service.vectors["item"][body["keys"]])
                else:
                    items = [int(i[1:]) + 2 for i in body["item_ids"]]
                    assert answer["items"]["encoded_ids"] == items
                    _check_features(answer["items"], {"item_id": body["item_ids"]}, tables)
                    _check_vectors(answer["embeddings"]["item_id_cat"]["vectors"],
                                   service.vectors["item"][items])
                golden[route].append(response.content)
    return golden


# --- the load ---------------------------------------------------------------------------

def _outcome(status: int, headers: list[bytes], body: bytes, right: bytes) -> str:
    if status == 200:
        return "correct" if body == right else "wrong"
    if status == 503:
        retry = any(line.startswith(b"retry-after:") for line in headers)
        return "unavailable_503_with_retry_after" if retry else "503_without_retry_after"
    return "other_5xx" if status >= 500 else "client_error"


async def _load(base: str, bodies: dict[str, list[dict[str, Any]]],
                golden: dict[str, list[bytes]], rate: float, stop: threading.Event,
                record: list[tuple[float, str, str]]) -> None:
    """Requests at ``rate``/s, the routes in turn, until ``stop``: (time, route, outcome)."""
    connections = {route: _Connections(base + route) for route in ROUTES}
    requests = {route: [connections[route].request(json.dumps(b).encode()) for b in items]
                for route, items in bodies.items()}
    tasks = []

    async def one(route: str, index: int) -> None:
        sent = time.monotonic()
        try:
            status, headers, body = await asyncio.wait_for(
                connections[route].exchange(requests[route][index]), REQUEST_TIMEOUT_S)
            outcome = _outcome(status, headers, body, golden[route][index])
        except TimeoutError:
            outcome = "timeout"
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            outcome = "connection_dropped"
        record.append((sent, route, outcome))

    start = time.perf_counter()
    sent = 0
    while not stop.is_set():
        await asyncio.sleep(max(0.0, start + sent / rate - time.perf_counter()))
        route = ROUTES[sent % len(ROUTES)]
        index = (sent // len(ROUTES)) % len(requests[route])
        tasks.append(asyncio.create_task(one(route, index)))
        sent += 1
    await asyncio.gather(*tasks)
    for connection in connections.values():
        connection.close()


def _count(record: list[tuple[float, str, str]], since: float = 0.0,
           until: float = float("inf")) -> dict[str, int]:
    counts = collections.Counter(o for t, _, o in record if since <= t < until)
    return {outcome: counts.get(outcome, 0) for outcome in OUTCOMES} | {
        "sent": sum(counts.values())}


# --- the faults ---------------------------------------------------------------------------

def _answers_again(service: Service, golden: dict[str, list[bytes]],
                   bodies: dict[str, list[dict[str, Any]]]) -> Callable[[], bool]:
    def check() -> bool:
        with httpx.Client(base_url=service.base, timeout=5) as client:
            return all(client.post(route, json=bodies[route][0]).content == golden[route][0]
                       for route in ROUTES)
    return check


def redis_restart(service: Service, hold_s: float, answering: Callable[[], bool]
                  ) -> dict[str, Any]:
    redis.Redis.from_url(service.redis.url).save()  # what a persistent Redis keeps
    service.redis.stop()
    time.sleep(hold_s)
    service.redis.start()
    return {"recovery_s": _until(answering, RECOVERY_LIMIT_S)}


def redis_oom(service: Service, hold_s: float, answering: Callable[[], bool]
              ) -> dict[str, Any]:
    client = redis.Redis.from_url(service.redis.url)
    client.config_set("maxmemory", 1)
    tiers: set[bool] = set()
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        tiers.add(httpx.get(f"{service.base}/readyz", timeout=5).json()["tiers"]["l2"])
        time.sleep(0.1)
    client.config_set("maxmemory", 0)

    def l2_back() -> bool:
        return all(httpx.get(f"{service.base}/readyz", timeout=5).json()["tiers"]["l2"]
                   for _ in range(4))
    return {"l2_breaker_opened": False in tiers,
            "recovery_s": _until(lambda: l2_back() and answering(), RECOVERY_LIMIT_S)}


def worker_kill(service: Service, hold_s: float, answering: Callable[[], bool]
                ) -> dict[str, Any]:
    victim = service.workers()[0]
    os.kill(victim, signal.SIGKILL)
    return {"killed_pid": victim, "recovery_s": _until(
        lambda: service.replacement_ready(victim) and answering(), RECOVERY_LIMIT_S)}


def rocksdb_damage(service: Service, hold_s: float, answering: Callable[[], bool]
                   ) -> dict[str, Any]:
    """Overwrite the middle half of the largest table file of the replica a worker holds,
    then SIGKILL that worker: the one uvicorn starts in its place opens the damaged replica
    (a worker already running would answer from its block cache until it had to read)."""
    folder = service.root / "rocksdb"
    holder = next(pid for pid in service.workers() if service.replica_of(pid) == folder)
    table_file = max(folder.glob("*.sst"), key=lambda p: p.stat().st_size)
    size = table_file.stat().st_size
    with table_file.open("r+b") as handle:
        handle.seek(size // 4)
        handle.write(bytes(range(256)) * (size // 2 // 256))
    os.kill(holder, signal.SIGKILL)
    recovery = _until(lambda: service.replacement_ready(holder) and answering(),
                      RECOVERY_LIMIT_S)
    # The other worker answers meanwhile: the replacement can log the damage (and import its
    # tables again) after the service answers, so the log is watched for it, not read once.
    detected = _until(lambda: service.log_count("is damaged") > 0, RECOVERY_LIMIT_S)
    return {"file": table_file.name, "bytes_overwritten": size // 2 // 256 * 256,
            "detected_and_imported_again": detected is not None,
            "detected_after_recovery_s": detected, "recovery_s": recovery}


def redis_empty_restart(service: Service, hold_s: float, answering: Callable[[], bool]
                        ) -> dict[str, Any]:
    """Redis back without its data (no persistence): the API answers 503 with Retry-After,
    not not_found, until `featureline publish --repair` — what the featureline-repair
    CronJob runs — has republished the served dataset."""
    service.redis.stop()
    (service.redis.data_dir / "dump.rdb").unlink(missing_ok=True)
    time.sleep(hold_s)
    service.redis.start()
    restarted = time.monotonic()

    def empty() -> bool:
        ready = httpx.get(f"{service.base}/readyz", timeout=5)
        return ready.status_code == 503 and ready.json()["checks"].get("published") is False
    detected = _until(empty, RECOVERY_LIMIT_S)
    started = time.monotonic()
    repair = subprocess.run(
        [str(BIN / "featureline"), "publish", "--repair", "--config",
         str(service.root / "featureline.yaml")], cwd=service.root, capture_output=True,
        env={**os.environ, "REDIS_URL": service.redis.url}, text=True,
        timeout=RECOVERY_LIMIT_S)
    repair_s = time.monotonic() - started
    answered = _until(answering, RECOVERY_LIMIT_S)
    lines = repair.stdout.strip().splitlines()
    return {"detected_s": detected, "repair_exit": repair.returncode,
            "repaired": json.loads(lines[-1]).get("repaired") if lines else None,
            "repair_s": round(repair_s, 2),
            "recovery_s": None if answered is None else round(time.monotonic() - restarted, 2)}


def primary_kill(service: Service, hold_s: float, answering: Callable[[], bool]
                 ) -> dict[str, Any]:
    """The Redis primary SIGKILLed (a crash); the sentinels promote the replica and every
    client follows it without a restart."""
    service.redis.wait_replicated()
    killed = service.redis.kill_primary()
    started = time.monotonic()
    promoted = _until(lambda: service.redis.primary_port() != killed, RECOVERY_LIMIT_S)
    answered = _until(answering, RECOVERY_LIMIT_S)
    return {"promoted_s": promoted,
            "recovery_s": None if answered is None else round(time.monotonic() - started, 2)}


FAULTS = {"redis_restart": redis_restart, "redis_oom": redis_oom, "worker_kill": worker_kill,
          "rocksdb_damage": rocksdb_damage, "redis_empty_restart": redis_empty_restart}


SENTINEL_FAULTS = {"primary_kill": primary_kill}


def serve_under_faults(root: Path, entities: int, rate: float, hold_s: float,
                       settle_s: float, scenario: dict[str, Callable[..., dict[str, Any]]] = FAULTS,
                       sentinel: bool = False) -> dict[str, Any]:
    service = Service(root, entities, sentinel)
    try:
        bodies = _bodies(entities, 32)
        golden = golden_answers(service, bodies)
        answering = _answers_again(service, golden, bodies)
        record: list[tuple[float, str, str]] = []
        stop = threading.Event()
        load = threading.Thread(target=lambda: asyncio.run(
            _load(service.base, bodies, golden, rate, stop, record)))
        load.start()
        faults = []
        try:
            time.sleep(settle_s)
            for name, inject in scenario.items():
                started = time.monotonic()
                result = inject(service, hold_s, answering)
                time.sleep(settle_s)
                faults.append({"fault": name, **result,
                               "requests": _count(record, started, time.monotonic())})
        finally:
            stop.set()
            load.join(timeout=REQUEST_TIMEOUT_S * 3)
        return {"entities": entities, "rate": rate, "hold_s": hold_s,
                "requests": _count(record),
                "by_route": {r: _count([x for x in record if x[1] == r]) for r in ROUTES},
                "faults": faults}
    finally:
        service.close()


# --- the ETL killed as it publishes -------------------------------------------------------

def _etl(log: Path, output: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([str(BIN / "featureline"), "etl", "run", "--input", str(log),
                             "--output", str(output), "--refit-vocabularies"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its own group: the JVM dies with it


def _read_output(output: Path) -> dict[str, Any] | None:
    """The output's metadata when the folder is whole (its tables hold what it says)."""
    try:
        metadata = read_metadata(output)
        counted = {name: ds.dataset(output / name, partitioning="hive").count_rows()
                   for name in ("examples", "quarantine", "duplicates")}
    except (OSError, ValueError, FeaturelineError):
        return None
    rows = metadata.rows
    # With a label join only the closed impressions are examples.
    examples = rows.label_join["examples"] if rows.label_join else rows.accepted
    whole = (counted["examples"] == examples
             and counted["quarantine"] == sum(rows.quarantined.values())
             and counted["duplicates"] == rows.duplicates)
    return {"version": metadata.dataset_version, "rows": rows.model_dump(), "whole": whole}


def _kill_at_the_swap(process: subprocess.Popen[bytes], output: Path) -> str:
    """SIGKILL the run's process group at the first sign of its publish, polled every
    millisecond: its staging folder complete (metadata.json written, the exchange next) or
    the output folder exchanged (the previous version being removed)."""
    pattern = f".{output.name}.staging-*"
    before = output.stat().st_ino
    deadline = time.monotonic() + 600
    while process.poll() is None and time.monotonic() < deadline:
        if output.stat().st_ino != before:
            moment = "after the exchange, removing the previous output"
            break
        if any((p / "metadata.json").exists() for p in output.parent.glob(pattern)):
            moment = "staging complete, before the exchange"
            break
        time.sleep(0.001)
    else:
        return "not killed: the run ended first" if process.poll() is not None else "timeout"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return moment


def etl_killed_while_publishing(root: Path, events: int,
                                previous: Path | None = None) -> dict[str, Any]:
    """``previous``: a whole output of an earlier run to start from (a copy is replaced),
    instead of a first run of this one's own. The copy leaves its profiles behind: a log of
    other sizes would fail the validation gate against them, and the gate is not what is
    tested here."""
    logs = [write_log(root / f"events-{seed}.jsonl", events=events, users=max(50, events // 20),
                      items=max(30, events // 40), days=14, seed=seed, bad_fraction=0.02,
                      fmt="jsonl") for seed in (1, 2)]
    output = root / "etl" / "output"
    if previous is not None:
        shutil.copytree(previous, output, ignore=shutil.ignore_patterns("profile*.json"))
    elif _etl(logs[0].path, output).wait(timeout=600) != 0:
        raise RuntimeError("the first ETL run failed")
    before = _read_output(output)
    assert before is not None and before["whole"]
    second = _etl(logs[1].path, output)
    moment = _kill_at_the_swap(second, output)
    after = _read_output(output)
    pattern = f".{output.name}.staging-*"
    leftovers = len(list(output.parent.glob(pattern)))
    third = _etl(logs[1].path, output)
    rerun = third.wait(timeout=600)
    again = _read_output(output)
    rows = again["rows"] if again else {}
    return {
        "events": events, "killed": moment,
        "after_kill": ("previous" if after and after["whole"]
                       and after["version"] == before["version"]
                       else "new" if after and after["whole"] else "broken"),
        "staging_folders_left_by_the_kill": leftovers,
        "rerun_exit": rerun,
        "rerun_whole": bool(again and again["whole"]),
        "rerun_rows_add_up": bool(again) and rows["read"] == logs[1].rows == (
            rows["accepted"] + rows["duplicates"] + sum(rows["quarantined"].values())),
        "staging_folders_after_rerun": len(list(output.parent.glob(pattern))),
    }


def run(entities: int = 20_000, rate: float = 60.0, hold_s: float = 5.0,
        settle_s: float = 2.0, etl_events: int = 20_000,
        previous_output: Path | None = None, etl_beside: bool = False) -> dict[str, Any]:
    """``etl_beside``: the ETL's kill runs at the same time as the serving faults instead of
    after them (the smoke run's choice: its own processes and folders, and the serving
    faults mostly wait; the recovery times then include its load)."""
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(),
                                          "platform": platform.platform(),
                                          "python": platform.python_version()},
                              "etl_beside_serving": etl_beside}
    with tempfile.TemporaryDirectory() as tmp, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        def etl() -> dict[str, Any]:
            return etl_killed_while_publishing(Path(tmp), etl_events, previous_output)

        beside = pool.submit(etl) if etl_beside else None
        report["serving"] = serve_under_faults(Path(tmp) / "serve", entities, rate, hold_s,
                                               settle_s)
        report["sentinel"] = serve_under_faults(Path(tmp) / "sentinel", entities, rate, hold_s,
                                                settle_s, SENTINEL_FAULTS, sentinel=True)
        report["etl"] = etl() if beside is None else beside.result()
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=60.0, help="requests/s, all routes")
    parser.add_argument("--hold", type=float, default=5.0, help="seconds each fault lasts")
    parser.add_argument("--etl-events", type=int, default=20_000)
    parser.add_argument("--smoke", action="store_true", help="the small run of make test")
    args = parser.parse_args(argv)
    if args.smoke:
        report = run(entities=2000, rate=30, hold_s=1.5, settle_s=1.0, etl_events=2000,
                     etl_beside=True)
    else:
        report = run(args.entities, args.rate, args.hold, etl_events=args.etl_events)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
