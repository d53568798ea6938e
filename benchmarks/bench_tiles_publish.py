"""Publish's encoding of an output's tiles at a million keys: each key's value in the online
store (every output of its group, ``feature_store/tiles.py``) from the output's tables of
tiles — by columns, a chunk of keys at a time (``stored_tiles``, what publish runs), against
the tables read row by row into every key's decoded tiles and each key encoded from them
(``read_tiles`` + ``encode_key_tiles``, what publish ran before). Each side runs in a
process of its own, the sides alternated; reported per run: seconds and the process's peak
memory (``ru_maxrss``), and whether both sides encoded the same bytes for every key.

The tables are made up, one row per tile as the ETL writes them: each key with 1–8 tiles of
each windowed output (its hop apart, ending at the cut) and one of each lifetime output.

    python benchmarks/bench_tiles_publish.py                   # 1,000,000 keys, the user table
    python benchmarks/bench_tiles_publish.py --spec aggregations --keys 200000
    python benchmarks/bench_tiles_publish.py --keys 20000 --rounds 1   # the smoke run
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from featureline.core.aggregations import MICROS, AggregateFeature, GroupSpec, entity_group
from featureline.core.metadata import Metadata, TilesInfo
from featureline.feature_store.tiles import encode_key_tiles, read_tiles, stored_tiles

AGGREGATIONS = Path(__file__).resolve().parent / "aggregations.yaml"
CUT_US = 1_767_225_600 * MICROS  # 2026-01-01
MAX_TILES = 8


def group_of(spec: str) -> GroupSpec:
    """The user table's group, or the user group of ``benchmarks/aggregations.yaml``."""
    if spec == "entity":
        return entity_group("user", 7)
    return GroupSpec.model_validate(yaml.safe_load(AGGREGATIONS.read_text())["aggregations"][0])


def _fields(feature: AggregateFeature, rows: int, rng: np.random.Generator) -> dict[str, Any]:
    """A tile's partial fields, as ``etl.aggregations.output_tiles`` names them."""
    op = feature.spec.op
    counts = rng.integers(1, 50, rows)
    if op == "count":
        return {"n": pa.array(counts)}
    if op == "sum":
        return {"s": pa.array(rng.random(rows) * 100)}
    if op == "mean":
        return {"s": pa.array(rng.random(rows) * 100), "n": pa.array(counts)}
    if op in ("min", "max"):
        return {"m": pa.array(rng.random(rows))}
    if op == "approx_distinct":
        registers = [sorted(set(rng.integers(0, 1 << 14, 3).tolist())) for _ in range(rows)]
        return {"registers": pa.array(registers, pa.list_(pa.int32())),
                "ranks": pa.array([[1] * len(r) for r in registers], pa.list_(pa.int32()))}
    raise ValueError(f"no made-up tiles of {op}")


def write_tiles(root: Path, group: GroupSpec, keys: int, seed: int = 0) -> Metadata:
    """An output holding only ``group``'s tables of tiles for ``keys`` keys."""
    rng = np.random.default_rng(seed)
    names = pa.array([f"u{n}" for n in range(keys)])
    tables = {}
    for feature in group.outputs():
        if feature.window.hop is None:
            index, tile = np.arange(keys), np.zeros(keys, np.int64)
        else:
            per_key = rng.integers(1, MAX_TILES + 1, keys)
            index = np.repeat(np.arange(keys), per_key)
            back = np.arange(len(index)) - np.repeat(np.cumsum(per_key) - per_key, per_key)
            tile = CUT_US - (back + 1) * feature.window.hop * MICROS
        columns = {group.keys[0]: names.take(pa.array(index)), "tile": pa.array(tile)}
        columns.update(_fields(feature, len(index), rng))
        relative = f"tiles/{group.name}/{feature.output}"
        (root / relative).mkdir(parents=True)
        pq.write_table(pa.table(columns), root / relative / "part-00000.parquet")
        tables[feature.qualified] = relative
    return Metadata.model_construct(folder=str(root),
                                    tiles=TilesInfo.model_construct(cut_us=CUT_US, tables=tables))


def encode(metadata: Metadata, group: GroupSpec, side: str) -> tuple[int, str]:
    """How many keys, and a digest of every key's encoded value that does not depend on
    their order (nothing kept but the count and the digest, as publish keeps nothing)."""
    keys, total = 0, 0
    for key, stored in _pairs(metadata, group, side):
        hashed = hashlib.sha256(json.dumps(key).encode() + b"\0" + stored).digest()
        total = (total + int.from_bytes(hashed, "big")) % (1 << 256)
        keys += 1
    return keys, f"{total:064x}"


def _pairs(metadata: Metadata, group: GroupSpec, side: str
           ) -> Iterator[tuple[tuple[Any, ...], bytes]]:
    if side == "columns":
        for chunk in stored_tiles(metadata, group):
            yield from chunk
        return
    tiles = read_tiles(metadata, [group])
    features = {feature.output: feature for feature in group.outputs()}
    by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
    for feature in features.values():
        for key, key_tiles in tiles.by_output[feature.qualified].items():
            by_key.setdefault(key, {})[feature.output] = key_tiles
    for key, by_output in by_key.items():
        yield key, encode_key_tiles(features, {output: by_output.get(output, {})
                                               for output in features})


def _side(root: str, spec: str, side: str) -> None:
    """One side in this process: prints its seconds, peak memory, keys and digest."""
    group = group_of(spec)
    metadata = Metadata.model_construct(folder=root, tiles=TilesInfo.model_validate_json(
        (Path(root) / "tiles.json").read_text()))
    started = time.perf_counter()
    keys, digest = encode(metadata, group, side)
    print(json.dumps({"seconds": round(time.perf_counter() - started, 2),
                      "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                      "keys": keys, "digest": digest}))


def run(keys: int, spec: str, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        metadata = write_tiles(root, group_of(spec), keys)
        assert metadata.tiles is not None
        (root / "tiles.json").write_text(metadata.tiles.model_dump_json())
        runs: dict[str, list[dict[str, Any]]] = {"rows": [], "columns": []}
        for _ in range(rounds):
            for side in ("rows", "columns"):
                done = subprocess.run([sys.executable, __file__, "--side", side, "--root",
                                       folder, "--spec", spec],
                                      check=True, capture_output=True, text=True)
                runs[side].append(json.loads(done.stdout))
    digests = {run["digest"] for measured in runs.values() for run in measured}

    def median(side: str, field: str) -> float:
        return float(np.median([run[field] for run in runs[side]]))

    return {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "keys": keys,
            "spec": spec, "runs": runs, "equal": len(digests) == 1,
            "columns_vs_rows": {field: round(median("columns", field) / median("rows", field),
                                             3) for field in ("seconds", "peak_mb")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--spec", choices=("entity", "aggregations"), default="entity")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--side", choices=("rows", "columns"), help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        _side(args.root, args.spec, args.side)
        return
    print(json.dumps(run(args.keys, args.spec, args.rounds), indent=2))


if __name__ == "__main__":
    main()
