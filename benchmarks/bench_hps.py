"""Parameter-server lookup speed per path, against baselines measured in the same run.

A table of ``--keys`` int64 keys × ``--dim`` float32, Zipf (α = ``--alpha``) key streams,
batches of each ``--batches`` size. Paths: all keys in L1 (``l1_hit``), L1 too small so L2
answers (``l2``), L1 and L2 too small so RocksDB answers (``l3``). Baselines: a numpy gather
of the same rows from a dense array by position (the CPU memory bound), a Python dict of
key → vector, and Redis MGET of the same keys on a local server. ``--gpu`` adds the L1-hit
path with the cache in GPU memory (``l1_hit_gpu``: CuPy gather, copied back to the host).

    python benchmarks/bench_hps.py --keys 1000000 --dim 64
    python benchmarks/bench_hps.py --gpu        # on a machine with an NVIDIA GPU and CuPy
    python benchmarks/bench_hps.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import redis

from featureline.feature_store.redis_server import EmbeddedRedis
from featureline.hps import ParameterServer
from featureline.hps.config import HpsConfig
from featureline.hps.formats import write_hugectr


def zipf_positions(n: int, size: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    ranks = np.arange(1, n + 1, dtype=np.float64)
    weights = ranks**-alpha
    return rng.choice(n, size=size, p=weights / weights.sum())


def timed(fn: Callable[[np.ndarray], Any], batches: list[np.ndarray]) -> dict[str, float]:
    fn(batches[0])  # warm-up
    seconds = []
    for batch in batches:
        start = time.perf_counter()
        fn(batch)
        seconds.append(time.perf_counter() - start)
    keys = sum(len(b) for b in batches)
    return {"keys_per_s": round(keys / sum(seconds)),
            "p50_ms": round(float(np.percentile(seconds, 50)) * 1000, 3),
            "p99_ms": round(float(np.percentile(seconds, 99)) * 1000, 3)}


def _server(root: Path, name: str, source: Path, dim: int, fraction: float, capacity: int,
            device: str = "cpu") -> ParameterServer:
    return ParameterServer(HpsConfig.model_validate({
        "models": [{"name": "m", "cache_fraction": fraction, "hit_rate_threshold": 1.0,
                    "tables": [{"name": "t", "dim": dim, "source": str(source)}]}],
        "volatile_db": {"capacity": capacity},
        "persistent_db": {"path": str(root / name)}, "cache_device": device}))


def _warm(server: ParameterServer, keys: np.ndarray, chunk: int = 500_000) -> None:
    """Look every key up once, a chunk at a time so a 10M-key table's temporaries fit."""
    for start in range(0, len(keys), chunk):
        server.lookup("m", "t", keys[start:start + chunk])
    server.wait_for_insertions()


def run(keys_n: int, dim: int, batch_sizes: list[int], repeats: int, alpha: float,
        gpu: bool = False) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    keys = rng.choice(2**40, size=keys_n, replace=False).astype(np.int64)
    vectors = rng.standard_normal((keys_n, dim)).astype(np.float32)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-hps-") as tmp:
        root = Path(tmp)
        write_hugectr(root / "table", keys, vectors)
        load_start = time.perf_counter()
        # The L1-hit path never reaches L2: a one-key L2 keeps its memory for the others.
        hot = _server(root, "rocks-hot", root / "table", dim, 1.0, 1)
        load_s = time.perf_counter() - load_start
        _warm(hot, keys)  # everything into L1
        warm_l2 = _server(root, "rocks-l2", root / "table", dim, 1 / keys_n, keys_n)
        _warm(warm_l2, keys)  # everything into L2
        cold = _server(root, "rocks-l3", root / "table", dim, 1 / keys_n, 1)
        servers = [("l1_hit", hot), ("l2", warm_l2), ("l3", cold)]
        if gpu:
            servers.append(("l1_hit_gpu", _server(root, "rocks-gpu", root / "table", dim, 1.0,
                                                   1, device="gpu")))
            _warm(servers[-1][1], keys)
        lookup_of = {name: (lambda s: lambda b: s.lookup("m", "t", b))(server)
                     for name, server in servers}
        dense = vectors  # rows by position
        by_key = {int(k): vectors[i] for i, k in enumerate(keys)}
        with EmbeddedRedis(root / "redis") as server:
            client = redis.Redis.from_url(server.url)
            for start in range(0, keys_n, 10_000):
                chunk = keys[start:start + 10_000].astype(">i8")
                client.mset({k.tobytes(): vectors[start + i].tobytes()
                             for i, k in enumerate(chunk)})
            for size in batch_sizes:
                positions = [zipf_positions(keys_n, size, alpha, rng) for _ in range(repeats)]
                batches = [keys[p] for p in positions]
                entry: dict[str, Any] = {"numpy_gather": timed(lambda p: dense[p], positions)}
                entry["python_dict"] = timed(
                    lambda b: np.stack([by_key[k] for k in b.tolist()]), batches)
                entry["redis_mget"] = timed(
                    lambda b: np.frombuffer(b"".join(client.mget(
                        [k.tobytes() for k in b.astype(">i8")])),
                        dtype=np.float32).reshape(-1, dim), batches)
                for name, lookup in lookup_of.items():
                    entry[name] = timed(lookup, batches)
                gather = entry["numpy_gather"]["keys_per_s"]
                entry["l1_hit_vs_numpy_gather"] = round(entry["l1_hit"]["keys_per_s"] / gather, 3)
                entry["l1_hit_vs_dict"] = round(
                    entry["l1_hit"]["keys_per_s"] / entry["python_dict"]["keys_per_s"], 2)
                if gpu:
                    entry["l1_hit_gpu_vs_host"] = round(
                        entry["l1_hit_gpu"]["keys_per_s"] / entry["l1_hit"]["keys_per_s"], 3)
                results[str(size)] = entry
        for _, server in servers:
            server.close()
    return {"benchmark": "hps", "keys": keys_n, "dim": dim, "zipf_alpha": alpha,
            "repeats": repeats, "load_s": round(load_s, 2),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
            "batches": results}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batches", default="1024,16384,131072")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--alpha", type=float, default=1.2)
    parser.add_argument("--gpu", action="store_true",
                        help="also time L1 hits with the cache in GPU memory (needs CuPy)")
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    args = parser.parse_args(argv)
    if args.smoke:
        report = run(2000, 16, [64, 256], 3, args.alpha, args.gpu)
    else:
        report = run(args.keys, args.dim, [int(b) for b in args.batches.split(",")],
                     args.repeats, args.alpha, args.gpu)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
