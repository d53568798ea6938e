"""The model's forward pass as ``/v1/rank`` runs it — NumPy over the exported dense part
(``core.scoring``), embedding rows gathered from in-memory tables — against TensorFlow's
``model(x)`` on the same rows, per batch size, interleaved (NumPy, TF, TF, NumPy per round).

The reference model is built from an ETL output's ``metadata.json`` (its groups, tables and
widths) and exported untrained: the cost of a pass does not depend on the weights. Reported
per batch size: the median milliseconds of a pass of each, their ratio, and the largest
difference between their scores.

    python benchmarks/bench_scoring.py --data data/demo/output
    python benchmarks/bench_scoring.py --data data/demo/output --sizes 1,100,1000 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from featureline.core.ids import FIRST_ID
from featureline.core.metadata import read_metadata
from featureline.core.scoring import DenseModel


def _rows(dense: DenseModel, rows: dict[str, int], size: int, rng: np.random.Generator
          ) -> dict[str, np.ndarray]:
    """``size`` rows of every input group: standard normal floats, ids drawn from the tables'
    rows (lists with some padding)."""
    groups = {}
    for group in dense.layout["groups"]:
        if group["kind"] == "continuous":
            groups[group["name"]] = rng.normal(size=(size, group["width"])).astype(np.float32)
            continue
        blocks = []
        for column in group["columns"]:
            ids = rng.integers(FIRST_ID, rows[column["table"]], size=(size, group["per_column"]))
            if group["kind"] == "multi_hot":
                ids[:, group["per_column"] // 2:] = 0  # the back half: padding
            blocks.append(ids)
        groups[group["name"]] = np.hstack(blocks).astype(np.int64)
    return groups


def _time(call: Any, repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - started) * 1000 / repeat


def run(data: str | Path, sizes: tuple[int, ...] = (1, 100, 1000), rounds: int = 3,
        seed: int = 0, rows_per_step: int = 3000) -> dict[str, Any]:
    """``rows_per_step``: each timed step runs passes of a batch until about this many rows
    (three passes at least)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from featureline.trainer.export import export, table_names
    from featureline.trainer.model import build_model, embedding_tables, table_weights

    metadata = read_metadata(data)
    model = build_model(metadata, seed=seed)
    names = table_names(metadata)
    tables = {names[owner]: table_weights(model, owner) for owner in embedding_tables(metadata)}
    with tempfile.TemporaryDirectory() as folder:
        export(model, metadata, Path(folder))
        dense = DenseModel.load(folder)
    rng = np.random.default_rng(seed)
    rows = {name: len(vectors) for name, vectors in tables.items()}

    def lookup(table: str, ids: np.ndarray) -> np.ndarray:
        return tables[table][ids]

    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "rounds": rounds, "sizes": {}}
    for size in sizes:
        groups = _rows(dense, rows, size, rng)
        repeat = max(3, rows_per_step // size)
        passes = {"numpy": lambda g=groups: dense.scores(g, lookup),
                  "tensorflow": lambda g=groups: model(g, training=False)}
        for call in passes.values():
            call()  # the first call builds TensorFlow's graph
        times: dict[str, list[float]] = {"numpy": [], "tensorflow": []}
        for _ in range(rounds):
            for name in ("numpy", "tensorflow", "tensorflow", "numpy"):
                times[name].append(_time(passes[name], repeat))
        numpy_ms = float(np.median(times["numpy"]))
        tf_ms = float(np.median(times["tensorflow"]))
        difference = np.abs(dense.scores(groups, lookup)
                            - np.asarray(model(groups, training=False)).reshape(-1)).max()
        report["sizes"][str(size)] = {
            "numpy_ms": round(numpy_ms, 4), "tensorflow_ms": round(tf_ms, 4),
            "numpy_vs_tensorflow": round(numpy_ms / tf_ms, 3),
            "max_score_difference": float(difference)}
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data/demo/output", help="an ETL output")
    parser.add_argument("--sizes", default="1,100,1000")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.data, tuple(int(s) for s in args.sizes.split(",")),
                         args.rounds), indent=2))


if __name__ == "__main__":
    main()
