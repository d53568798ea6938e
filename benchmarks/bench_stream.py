"""Fresh features end to end: events pushed to ``POST /v1/push`` at a fixed rate, the stream
processor writing them, a reader polling ``/v1/features`` until each pushed entity shows its
event — API, processor and Redis sharing the machine — and, as the baseline, redis-py writing
the same updates straight into Redis.

- **Fixed rate** (open loop): requests of ``--batch`` events start on a fixed schedule for
  ``--seconds``; one event in ``--track`` belongs to a user seen nowhere else, and a poller
  reads those users' ``user_events`` every 10 ms: push→servable is from the request's
  scheduled start to the first read that shows the event (p50/p99), next to the processor's
  own histogram (accepted → written). ``sustained``: the rate was held (pushes answered 202
  on time) and the processor kept up (every event written within 5 s of the last push).
- **Throughput**: a burst of events logged first, then drained by the processor: events/s,
  against redis-py writing the same per-event updates (both entities' five fields, one
  `HSET` each, pipelined) — measured before and after the processor (interleaved) on the
  same server.

- **In process** (``--in-process``): the processor of ``featureline stream`` applying bursts
  (records of 500 events, read ``stream.read_batch`` — 20,000 — at a time) in this process,
  without and with ``gc.freeze()`` after it started (as the command does), rounds
  alternated: seconds, this process's CPU and Redis's CPU per burst. With ``--cluster``: on
  one server and on a 3-node Redis Cluster (``redis_type: redis_cluster``), alternated.

    python benchmarks/bench_stream.py --rate 2000 --seconds 20
    python benchmarks/bench_stream.py --in-process --rounds 4
    python benchmarks/bench_stream.py --in-process --cluster --rounds 3
    python benchmarks/bench_stream.py --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import redis
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_api import _Connections, _wait_ready
from bench_feast import SNAPSHOT, _project, write_output

from featureline.core.aggregations import GroupSpec, entity_group
from featureline.core.events import micros_of
from featureline.etl.config import EtlConfig
from featureline.feature_store.publish import publish
from featureline.feature_store.redis_server import EmbeddedRedis, free_port
from featureline.feature_store.repo import open_repo

BIN = Path(sys.executable).parent
AGGREGATIONS = Path(__file__).resolve().parent / "aggregations.yaml"
POLL_S = 0.01
CATCH_UP_S = 5.0


def _output(root: Path, entities: int, aggregations: bool = False,
            model_inputs: bool = False) -> Path:
    """bench_feast's entity tables, with the ETL's default event contract recorded, and the
    tiles of the entity tables' groups — with ``aggregations``, of the spec of
    ``benchmarks/aggregations.yaml`` too, with ``model_inputs`` of the default features' input
    groups (the user, (user, item) pair and item keys ``/v1/model-inputs`` reads) — empty up
    to the snapshot time (the stream's pushes fill them)."""
    output = write_output(root, entities)
    metadata = json.loads((output / "metadata.json").read_text())
    metadata["events"] = EtlConfig().event_contract().model_dump(mode="json")
    spec = yaml.safe_load(AGGREGATIONS.read_text())["aggregations"] if aggregations else []
    if model_inputs:
        from featureline.etl.features.pipeline import FeaturePipeline

        spec += [g.model_dump(mode="json") for g in FeaturePipeline(EtlConfig()).inputs().groups]
    groups = list(map(GroupSpec.model_validate, spec))
    for entity, table in metadata["entities"].items():
        group = entity_group(entity, EtlConfig().entities.recent_days)
        table["group"] = group.model_dump(mode="json")
        groups.append(group)
    tables = {}
    for group in groups:
        for feature in group.outputs():
            relative = f"tiles/{group.name}/{feature.output}"
            (output / relative).mkdir(parents=True)
            pq.write_table(pa.table({**{key: pa.array([], pa.string()) for key in group.keys},
                                     "tile": pa.array([], pa.int64())}),
                           output / relative / "part-00000.parquet")
            tables[feature.qualified] = relative
    metadata["tiles"] = {"cut_us": micros_of(SNAPSHOT), "tables": tables, "groups": spec}
    (output / "metadata.json").write_text(json.dumps(metadata))
    return output


def _event(user: str, item: str, at: datetime, kind: str = "view") -> dict[str, Any]:
    return {"user_id": user, "item_id": item, "event_type": kind, "ts": at.isoformat(),
            "value": 1.0, "category": "c1", "device": "mobile", "price": 9.5}


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, flags=re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _histogram_quantile(text: str, name: str, q: float) -> float | None:
    buckets = sorted((float(le), float(v)) for le, v in re.findall(
        rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', text, flags=re.MULTILINE))
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    return next(le for le, count in buckets if count >= q * total)


class Stack:
    """Embedded Redis, the published output, ``featureline serve --stream`` (API + processor)."""

    def __init__(self, root: Path, entities: int, aggregations: bool = False,
                 model_inputs: bool = False) -> None:
        self.root = root
        self.redis = EmbeddedRedis(root / "redis").start()
        output = _output(root, entities, aggregations, model_inputs)
        # What the poller reads to see a pushed event served, and its name in the answer: the
        # lifetime sum, whose value does not depend on the request time (the events are
        # pushed at the entity tables' snapshot time, months ago).
        self.served = (("user_activity:value_sum_all",) * 2 if aggregations
                       else ("user_features:user_events", "user_events"))
        config = _project(root)
        publish(open_repo(config.feature_store, output, url=self.redis.url),
                progress=lambda _: None)
        self.port, self.metrics_port = free_port(), free_port()
        settings = config.model_dump(mode="json", exclude={"etl"})
        settings["api"].update({"data": str(output), "port": self.port,
                                "auth": {"enabled": False},
                                "limits": {"max_events": 10_000,
                                           "max_body_bytes": 16 * 1024 * 1024}})
        settings["stream"].update({"archive": str(root / "archive"),
                                   "metrics_port": self.metrics_port})
        config_file = root / "featureline.yaml"
        config_file.write_text(yaml.safe_dump(settings))
        self.base = f"http://127.0.0.1:{self.port}"
        self.server = subprocess.Popen(
            [str(BIN / "featureline"), "serve", "--config", str(config_file), "--stream"],
            env={**os.environ, "REDIS_URL": self.redis.url}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        _wait_ready(f"{self.base}/readyz", self.server)
        _wait_ready(f"http://127.0.0.1:{self.metrics_port}/metrics", self.server)

    def processor_metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text

    def processed(self) -> float:
        return _metric(self.processor_metrics(), "featureline_stream_events_total")

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.server.pid, 15)
        self.server.wait(timeout=30)
        self.redis.stop()


async def _fixed_rate(stack: Stack, rate: float, seconds: float, batch: int,
                      track: int) -> dict[str, Any]:
    """Open-loop pushes at ``rate`` events/s; push→servable of the tracked events."""
    requests = max(1, int(rate * seconds / batch))
    interval = batch / rate
    day = SNAPSHOT + timedelta(hours=1)
    connections = _Connections(f"{stack.base}/v1/push")
    pending: dict[str, float] = {}  # tracked user → scheduled send time
    servable: list[float] = []
    statuses: list[int] = []
    lags: list[float] = []
    done = asyncio.Event()
    processed_before = stack.processed()

    async def poll() -> None:
        async with httpx.AsyncClient(base_url=stack.base, timeout=10) as client:
            while not (done.is_set() and not pending):
                users = list(pending)[:500]
                if users:
                    reference, name = stack.served
                    answer = await client.post("/v1/features", json={
                        "features": [reference], "entities": {"user_id": users}})
                    now = time.perf_counter()
                    for user, count in zip(users, answer.json()["values"][name],
                                           strict=True):
                        if count:
                            servable.append(now - pending.pop(user))
                await asyncio.sleep(POLL_S)
                if done.is_set() and time.perf_counter() > deadline[0]:
                    break

    deadline = [float("inf")]
    poller = asyncio.create_task(poll())
    start = time.perf_counter()

    async def send(index: int, scheduled: float) -> None:
        lags.append(time.perf_counter() - scheduled)
        events = []
        for j in range(batch):
            n = index * batch + j
            at = day + timedelta(microseconds=n)
            if n % track == 0:
                user = f"fresh-{n}"
                pending[user] = scheduled
            else:
                user = f"u{n % 997}"
            events.append(_event(user, f"i{n % 499}", at))
        body = json.dumps({"events": events}).encode()
        status = await connections.send(connections.request(body))
        statuses.append(status)

    tasks = []
    for index in range(requests):
        scheduled = start + index * interval
        await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
        tasks.append(asyncio.create_task(send(index, scheduled)))
    await asyncio.gather(*tasks)
    pushed_s = time.perf_counter() - start
    deadline[0] = time.perf_counter() + CATCH_UP_S
    done.set()
    await poller
    connections.close()
    total = requests * batch
    caught_up = not pending
    processed = stack.processed() - processed_before
    ms = np.array(servable) * 1000
    metrics = stack.processor_metrics()
    return {
        "rate": rate, "events": total, "achieved_events_per_s": round(total / pushed_s),
        "push_errors": sum(status != 202 for status in statuses),
        "send_lag_p99_ms": round(float(np.percentile(np.array(lags) * 1000, 99)), 2),
        "tracked": len(servable) + len(pending), "not_servable_in_time": len(pending),
        "push_to_servable_p50_ms": round(float(np.percentile(ms, 50)), 1) if len(ms) else None,
        "push_to_servable_p99_ms": round(float(np.percentile(ms, 99)), 1) if len(ms) else None,
        "processor_freshness_p99_le_s": _histogram_quantile(
            metrics, "featureline_feature_freshness_seconds", 0.99),
        "processed": int(processed),
        "sustained": caught_up and processed == total and not any(s != 202 for s in statuses)
        and total / pushed_s >= 0.95 * rate}


def _burst(stack: Stack, events: int, batch: int) -> dict[str, Any]:
    """Push ``events`` as fast as one client can, then time the processor's drain."""
    day = SNAPSHOT + timedelta(hours=2)
    before = stack.processed()
    started = time.perf_counter()
    with httpx.Client(base_url=stack.base, timeout=60) as client:
        for first in range(0, events, batch):
            body = [_event(f"u{n % 997}", f"i{n % 499}", day + timedelta(microseconds=n),
                           "click" if n % 5 == 0 else "view")
                    for n in range(first, min(first + batch, events))]
            assert client.post("/v1/push", json={"events": body}).status_code == 202
    pushed = time.perf_counter()
    while stack.processed() - before < events:
        time.sleep(0.05)
        if time.perf_counter() - pushed > 300:
            raise RuntimeError("the processor did not drain the burst in 300 s")
    seconds = time.perf_counter() - started
    return {"events": events, "push_s": round(pushed - started, 2),
            "end_to_end_events_per_s": round(events / seconds)}


def raw_updates(url: str, events: int, batch: int = 1000) -> float:
    """events/s of redis-py writing each event's updates: both entities' hash, five
    serialized values and a timestamp each, pipelined."""
    client = redis.Redis.from_url(url)
    value = b"\x20\x80\x01"  # an int64 Value
    mapping = {f"f{i}".encode(): value for i in range(6)}
    start = time.perf_counter()
    for first in range(0, events, batch):
        pipe = client.pipeline(transaction=False)
        for n in range(first, min(first + batch, events)):
            pipe.hset(f"raw:user:{n % 997}".encode(), mapping=mapping)
            pipe.hset(f"raw:item:{n % 499}".encode(), mapping=mapping)
        pipe.execute()
    seconds = time.perf_counter() - start
    for key in client.scan_iter(match="raw:*", count=10_000):
        client.delete(key)
    return events / seconds


def run(entities: int = 10_000, rate: float = 2000, seconds: float = 20, batch: int = 50,
        track: int = 20, burst: int = 20_000, aggregations: bool = False,
        model_inputs: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        stack = Stack(Path(folder), entities, aggregations, model_inputs)
        try:
            fixed = asyncio.run(_fixed_rate(stack, rate, seconds, batch, track))
            raw_before = raw_updates(stack.redis.url, burst)
            drained = _burst(stack, burst, 500)
            raw_after = raw_updates(stack.redis.url, burst)
        finally:
            stack.close()
    raw = (raw_before + raw_after) / 2
    return {"machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "entities": entities, "aggregations": aggregations,
            "model_inputs": model_inputs, "fixed_rate": fixed,
            "throughput": {**drained, "raw_redis_updates_per_s": round(raw),
                           "raw_runs": [round(raw_before), round(raw_after)],
                           "stream_vs_raw": round(drained["end_to_end_events_per_s"] / raw,
                                                  3)}}


def aggregations_cost(rounds: int = 1, added: str = "aggregations", **sizes: Any
                      ) -> dict[str, Any]:
    """The same pushes into a store without and with the aggregations of
    ``benchmarks/aggregations.yaml`` (14 values in a user and an item group, added to their
    tiles by the processor) — or, ``added="model_inputs"``, the model inputs' groups — A B B
    A per round: push→servable (of the user's entity feature, or with the aggregations of
    its lifetime ``value_sum_all``) and the burst's events/s, each beside the same run's raw
    Redis writes."""
    runs: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
    for _ in range(rounds):
        for name in ("without", "with", "with", "without"):
            runs[name].append(run(**sizes, **{added: name == "with"}))
    summary = {}
    for name, measured in runs.items():
        summary[name] = {
            "push_to_servable_p99_ms": [r["fixed_rate"]["push_to_servable_p99_ms"]
                                        for r in measured],
            "sustained": all(r["fixed_rate"]["sustained"] for r in measured),
            "stream_vs_raw": [r["throughput"]["stream_vs_raw"] for r in measured],
            "events_per_s": [r["throughput"]["end_to_end_events_per_s"] for r in measured]}
    ratio = float(np.mean(summary["with"]["stream_vs_raw"]) /
                  np.mean(summary["without"]["stream_vs_raw"]))
    return {"runs": runs, "summary": summary, "throughput_with_vs_without": round(ratio, 3)}


def _burst_records(index: int, burst: int, validate: Any) -> list[Any]:
    """Burst ``index``'s events as the log delivers them (records of 500): the benchmark's 997
    users and 499 items, renamed for the burst, an hour apart from the burst before."""
    from featureline.core.events import event_line
    from featureline.stream.log import Delivered

    day = SNAPSHOT + timedelta(hours=2 + index)
    records = []
    for first in range(0, burst, 500):
        lines = []
        for n in range(first, min(first + 500, burst)):
            event, _ = validate(_event(f"r{index}u{n % 997}", f"r{index}i{n % 499}",
                                       day + timedelta(microseconds=n),
                                       "click" if n % 5 == 0 else "view"))
            assert event is not None
            lines.append(event_line(event))
        records.append(Delivered(None, b"\n".join(lines), time.time()))
    return records


def in_process(entities: int = 10_000, burst: int = 20_000, rounds: int = 4,
               cluster: bool = False) -> dict[str, Any]:
    """The processor applying ``burst`` events in this process, ``rounds`` times each without
    and with the collector frozen after startup — with ``cluster``: with it frozen, on one
    server and on a 3-node Redis Cluster (``redis_type: redis_cluster``) — alternated; each
    burst's users and items are new (the benchmark's 997 and 499 keys, renamed)."""
    import gc

    from featureline.core.events import EventValidator
    from featureline.feature_store.redis_server import EmbeddedRedisCluster
    from featureline.stream.processor import open_processor

    sides = ("one_server", "cluster") if cluster else ("collected", "frozen")
    measured: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as servers:
        root = Path(folder)
        output = _output(root, entities)
        processors, nodes = {}, {}
        for side in sides:
            on_cluster = side == "cluster"
            if on_cluster:
                server: Any = servers.enter_context(EmbeddedRedisCluster(root / side))
                nodes[side] = [redis.Redis(port=port) for port in server.ports]
            else:
                server = EmbeddedRedis(root / side).start()
                servers.callback(server.stop)
                nodes[side] = [redis.Redis.from_url(server.url)]
            config = _project(root / side)
            feature_store = config.feature_store.model_copy(
                update={"redis_type": "redis_cluster" if on_cluster else "redis"})
            publish(open_repo(feature_store, output, url=server.url), progress=lambda _: None)
            stream = config.stream.model_copy(update={"archive": str(root / side / "archive")})
            processor = open_processor(stream, feature_store, output, url=server.url)
            processor.refresh_base()
            processor.log.commit = lambda delivered: None  # type: ignore[method-assign]
            processors[side] = processor

        def redis_cpu(side: str) -> float:
            infos = [node.info("cpu") for node in nodes[side]]
            return sum(float(i["used_cpu_sys"]) + float(i["used_cpu_user"]) for i in infos)

        for index in range(2 * rounds):
            side = sides[index % 2]
            processor = processors[side]
            validate = EventValidator(processor.contract, datetime.now().astimezone())
            records = _burst_records(index, burst, validate)
            gc.collect()
            if side != "collected":
                gc.freeze()
            redis_before, cpu_before = redis_cpu(side), time.process_time()
            started = time.perf_counter()
            per_read = max(1, processor.read_batch // 500)  # records of 500, as the log's
            for low in range(0, len(records), per_read):
                processor.process(records[low:low + per_read])
            seconds = time.perf_counter() - started
            measured[side].append({"seconds": round(seconds, 3),
                                   "process_cpu_s": round(time.process_time() - cpu_before, 3),
                                   "redis_cpu_s": round(redis_cpu(side) - redis_before, 3)})
            gc.unfreeze()
        processed = {side: processor.processed for side, processor in processors.items()}

    def mean(side: str, field: str) -> float:
        return float(np.mean([m[field] for m in measured[side]]))

    return {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "events": burst,
            "processed": processed, "runs": measured,
            f"{sides[1]}_vs_{sides[0]}": {field: round(mean(sides[1], field)
                                                      / mean(sides[0], field), 3)
                                           for field in ("seconds", "process_cpu_s",
                                                         "redis_cpu_s")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entities", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--burst", type=int, default=20_000)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check it runs")
    parser.add_argument("--aggregations", action="store_true",
                        help="without and with benchmarks/aggregations.yaml, A B B A")
    parser.add_argument("--model-inputs", action="store_true",
                        help="without and with the model inputs' groups, A B B A")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --aggregations, --model-inputs or --in-process")
    parser.add_argument("--in-process", action="store_true",
                        help="the processor's bursts in this process, without and with "
                             "gc.freeze(), alternated")
    parser.add_argument("--cluster", action="store_true",
                        help="with --in-process: on one server and on a 3-node Redis "
                             "Cluster, alternated")
    args = parser.parse_args()
    if args.in_process:
        report = (in_process(200, 1000, 1, args.cluster) if args.smoke else
                  in_process(args.entities, args.burst, args.rounds, args.cluster))
    elif args.aggregations or args.model_inputs:
        sizes = ({"entities": 200, "rate": 100, "seconds": 1, "batch": 10, "track": 5,
                  "burst": 500} if args.smoke else
                 {"entities": args.entities, "rate": args.rate, "seconds": args.seconds,
                  "burst": args.burst})
        report = aggregations_cost(args.rounds, "model_inputs" if args.model_inputs
                                   else "aggregations", **sizes)
    elif args.smoke:
        report = run(entities=200, rate=100, seconds=1, batch=10, track=5, burst=500)
    else:
        report = run(args.entities, args.rate, args.seconds, burst=args.burst)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
