"""The model's forward pass as ``/v1/rank`` runs it — NumPy over the exported dense part
(``core.scoring``), embedding rows gathered from in-memory tables — against TensorFlow's
``model(x)`` on the same rows, and against the same dense layers in ONNX Runtime (an ONNX
graph built from the exported weights; the lookups and pooling in NumPy as before), per batch
size, interleaved (NumPy, TF, ONNX, ONNX, TF, NumPy per round).

The reference model is built from an ETL output's ``metadata.json`` (its groups, tables and
widths) and exported untrained: the cost of a pass does not depend on the weights. Reported
per batch size: the median milliseconds of a pass of each, their ratios, and the largest
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


def onnx_session(dense: DenseModel, parts: list[np.ndarray]) -> Any:
    """An ONNX Runtime session of ``dense``'s layers (one intra-op thread, as the API runs
    NumPy's BLAS): inputs ``part<i>`` as :meth:`DenseModel.inputs` gives them."""
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    nodes, weights = [], []

    def layer(x: str, name: str, activation: str) -> str:
        weights.extend([numpy_helper.from_array(dense.weights[f"{name}/kernel"], f"{name}/k"),
                        numpy_helper.from_array(dense.weights[f"{name}/bias"], f"{name}/b")])
        nodes.append(helper.make_node("Gemm", [x, f"{name}/k", f"{name}/b"], [f"{name}/z"]))
        nodes.append(helper.make_node(activation, [f"{name}/z"], [f"{name}/{x}/a"]))
        return f"{name}/{x}/a"

    names = [f"part{i}" for i in range(len(parts))]
    hidden = list(names)
    for index in dense.continuous_parts:
        for name in dense.layout["bottom"]:
            hidden[index] = layer(hidden[index], name, "Relu")
    nodes.append(helper.make_node("Concat", hidden, ["joined"], axis=1))
    x = "joined"
    for name in dense.layout["top"]:
        x = layer(x, name, "Relu")
    x = layer(x, dense.layout["output"], "Sigmoid")
    graph = helper.make_graph(
        nodes, "dense", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, p.shape[1]])
                         for n, p in zip(names, parts, strict=True)],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [None, 1])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])

    def run(parts: list[np.ndarray]) -> np.ndarray:
        return session.run(None, dict(zip(names, parts, strict=True)))[0].reshape(-1)

    return run


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
    onnx = onnx_session(dense, dense.inputs(_rows(dense, rows, 1, rng), lookup))
    for size in sizes:
        groups = _rows(dense, rows, size, rng)
        repeat = max(3, rows_per_step // size)
        passes = {"numpy": lambda g=groups: dense.scores(g, lookup),
                  "tensorflow": lambda g=groups: model(g, training=False),
                  "onnx": lambda g=groups: onnx(dense.inputs(g, lookup))}
        for call in passes.values():
            call()  # the first call builds TensorFlow's graph
        times: dict[str, list[float]] = {name: [] for name in passes}
        for _ in range(rounds):
            for name in ("numpy", "tensorflow", "onnx", "onnx", "tensorflow", "numpy"):
                times[name].append(_time(passes[name], repeat))
        ms = {name: float(np.median(measured)) for name, measured in times.items()}
        scores = dense.scores(groups, lookup)
        difference = np.abs(scores - np.asarray(model(groups, training=False)).reshape(-1)).max()
        report["sizes"][str(size)] = {
            "numpy_ms": round(ms["numpy"], 4), "tensorflow_ms": round(ms["tensorflow"], 4),
            "onnx_ms": round(ms["onnx"], 4),
            "numpy_vs_tensorflow": round(ms["numpy"] / ms["tensorflow"], 3),
            "numpy_vs_onnx": round(ms["numpy"] / ms["onnx"], 3),
            "max_score_difference": float(difference),
            "onnx_max_score_difference": float(np.abs(scores - passes["onnx"]()).max())}
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
