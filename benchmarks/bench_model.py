"""The reference model on real data: MovieLens 100K (943 users, 1,682 movies, 100,000
ratings from 1997–98; GroupLens, fetched from the RecBole package on PyPI into the cache —
``featureline.tools.movielens_100k``), label ``value >= 4``, the last 30 days as the
validation split, everything else as a new user would leave it. Runs the ETL (Spark
local[2]), then ``featureline train``, and prints the validation AUC and log-loss of the
model, of the popularity baseline and of gradient-boosted trees (LightGBM) on the same
examples, with the epoch history.

    python benchmarks/bench_model.py
    python benchmarks/bench_model.py --epochs 10 --patience 2
    python benchmarks/bench_model.py --smoke      # one epoch (tests/test_benchmarks.py)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from featureline.tools import movielens_100k

BIN = Path(sys.executable).parent
VALID_DAYS = 30


def etl_config(log: Path, output: Path) -> dict[str, Any]:
    """The ETL settings for the ratings log: the defaults, with its one event type, the
    label and the temporal split; no context columns."""
    return {"etl": {
        "source": {"path": str(log), "format": "jsonl"},
        "validation": {"event_types": ["rating"], "ts_min": "1990-01-01T00:00:00Z"},
        "label": "value >= 4",
        "split": {"valid_days": VALID_DAYS},
        "features": [
            {"op": "categorify", "columns": ["user_id", "item_id"], "freq_threshold": 1},
            {"op": "count_encode", "columns": ["user_id", "item_id"]},
            {"op": "target_encode", "columns": ["item_id"], "folds": 5, "smoothing": 20},
            {"op": "lag_features", "windows": ["1h", "24h", "7d"]},
            {"op": "cyclic_time"},
            {"op": "history", "k": 10}],
        "output": {"path": str(output)}}}


def run(epochs: int, patience: int, work: Path) -> dict[str, Any]:
    log = movielens_100k()
    output = work / "output"
    config = work / "featureline.yaml"
    config.write_text(yaml.safe_dump(etl_config(log, output)))
    etl = subprocess.run([str(BIN / "featureline"), "etl", "run", "--config", str(config)],
                         capture_output=True, text=True, cwd=work)
    if etl.returncode != 0:
        raise RuntimeError(f"the ETL failed: {(etl.stdout + etl.stderr)[-3000:]}")
    from featureline.trainer.train import train

    result = train(output, work / "model", epochs=epochs, patience=patience,
                   progress=lambda line: print(line, file=sys.stderr))
    validation = result.validation
    return {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "python": platform.python_version()},
            "data": {"log": str(log), "rows": sum(1 for _ in log.open())},
            "valid_days": VALID_DAYS, "epochs": result.epochs, "best_epoch": result.best_epoch,
            "validation_rows": validation["rows"],
            "positive_rate": round(validation["positive_rate"], 4),
            "model": validation["model"], "popularity": validation["baseline"],
            "gbdt": validation.get("gbdt")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--patience", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="one epoch")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        epochs = 1 if args.smoke else args.epochs
        print(json.dumps(run(epochs, args.patience, Path(tmp)), indent=2))


if __name__ == "__main__":
    main()
