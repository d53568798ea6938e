"""Training input: the reference model fed from the TFRecords vs the same model fed from the
Parquet examples through pandas and NumPy, measured in the same run.

For each path: rows/s into ``model.fit`` over the training split (the Parquet path's time
includes reading the examples into NumPy, which the TFRecord path does while it trains),
seconds per epoch, and the input alone (rows/s out of the reader, no model). The ratios are
TFRecord ÷ Parquet. Without ``--data`` it generates a log of ``--events`` and runs the ETL on
local[2] first.

    python benchmarks/bench_train.py --events 1200000      # ~1M training rows
    python benchmarks/bench_train.py --data data/demo/output
    python benchmarks/bench_train.py --smoke
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

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from featureline.core.metadata import Metadata, read_metadata
from featureline.etl.tfrecord import dataset
from featureline.trainer.model import build_model, label_group, tfrecord_groups

BATCH = 4096


def _compiled(metadata: Metadata) -> Any:
    import keras

    model = build_model(metadata, seed=0)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy")
    return model


class _EpochTimes:
    def __init__(self) -> None:
        import keras

        times: list[float] = []

        class Callback(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                times.append(time.perf_counter())

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                times[-1] = time.perf_counter() - times[-1]

        self.times = times
        self.callback = Callback()


def parquet_inputs(metadata: Metadata, output: Path) -> tuple[dict[str, np.ndarray],
                                                              np.ndarray]:
    """The training split's examples as the model's input blocks: pandas reads the Parquet,
    NumPy stacks each group's columns in metadata.json's order."""
    import pandas as pd

    frame = pd.read_parquet(output / "examples" / "split=train")
    label = label_group(metadata)
    blocks = {}
    for name, group in tfrecord_groups(metadata).items():
        dtype = np.float32 if group.dtype == "float32" else np.int64
        parts = [np.stack(frame[c].to_numpy()) if group.width > len(group.columns)
                 else frame[c].to_numpy()[:, None] for c in group.columns]
        blocks[name] = np.hstack(parts).astype(dtype)
    return {k: v for k, v in blocks.items() if k != label}, blocks[label]


def run(output: Path, epochs: int = 2, batch_size: int = BATCH) -> dict[str, Any]:
    import tensorflow as tf
    from tensorflow.config import threading

    metadata = read_metadata(output)
    rows = metadata.split.rows["train"]
    label = label_group(metadata)

    def records() -> Any:
        return dataset(metadata, batch_size, "train", grouped=True)

    # The input alone: batches out of each reader.
    start = time.perf_counter()
    read_rows = sum(int(b[label].shape[0]) for b in records())
    tfrecord_input_s = time.perf_counter() - start
    assert read_rows == rows, (read_rows, rows)
    start = time.perf_counter()
    parquet_inputs(metadata, output)
    parquet_input_s = time.perf_counter() - start

    fed = records().map(lambda b: ({k: v for k, v in b.items() if k != label}, b[label]))
    timer = _EpochTimes()
    start = time.perf_counter()
    _compiled(metadata).fit(fed, epochs=epochs, verbose=0, shuffle=False,
                            callbacks=[timer.callback])
    tfrecord_s = time.perf_counter() - start
    tfrecord_epochs = timer.times

    timer = _EpochTimes()
    start = time.perf_counter()
    features, labels = parquet_inputs(metadata, output)  # counted: the path reads them too
    _compiled(metadata).fit(features, labels, batch_size=batch_size, epochs=epochs, verbose=0,
                            shuffle=False, callbacks=[timer.callback])
    parquet_s = time.perf_counter() - start

    def rate(seconds: float) -> float:
        return round(rows * epochs / seconds, 1)

    return {
        "benchmark": "train",
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count(), "tensorflow": tf.__version__,
                    # 0: TensorFlow's default, one thread per core.
                    "tf_threads": {"inter_op": threading.get_inter_op_parallelism_threads(),
                                   "intra_op": threading.get_intra_op_parallelism_threads()}},
        "train_rows": rows, "epochs": epochs, "batch_size": batch_size,
        "input_only": {"tfrecord_rows_per_s": round(rows / tfrecord_input_s, 1),
                       "parquet_pandas_rows_per_s": round(rows / parquet_input_s, 1),
                       "tfrecord_vs_parquet": round(parquet_input_s / tfrecord_input_s, 2)},
        "fit": {"tfrecord": {"rows_per_s": rate(tfrecord_s), "total_s": round(tfrecord_s, 2),
                             "epoch_s": [round(t, 2) for t in tfrecord_epochs]},
                "parquet_pandas": {"rows_per_s": rate(parquet_s),
                                   "total_s": round(parquet_s, 2),
                                   "epoch_s": [round(t, 2) for t in timer.times]},
                "tfrecord_vs_parquet": round(parquet_s / tfrecord_s, 2)},
    }


def _etl(events: int, workdir: Path) -> Path:
    from featureline.etl import job
    from featureline.etl.config import EtlConfig, with_overrides
    from featureline.etl.datagen import write_log
    from featureline.etl.session import build_session

    raw = workdir / "events.jsonl"
    write_log(raw, events=events, users=max(100, events // 40), items=max(50, events // 100),
              days=14, seed=7)
    config = with_overrides(EtlConfig(), input_path=str(raw), output=str(workdir / "out"),
                            refit_vocabularies=True)
    spark = build_session(config.spark)
    try:
        return job.run(config, spark, progress=lambda _: None).output
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="an ETL output folder (default: run one)")
    parser.add_argument("--events", type=int, default=1_200_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    args = parser.parse_args(argv)
    events = 20_000 if args.smoke else args.events
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        output = args.data or _etl(events, Path(tmp))
        print(json.dumps(run(output, epochs=1 if args.smoke else args.epochs), indent=2))


if __name__ == "__main__":
    main()
