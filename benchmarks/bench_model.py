"""The reference model on real data: MovieLens 100K (943 users, 1,682 movies, 100,000
ratings from 1997–98; GroupLens, fetched from the RecBole package on PyPI into the cache —
``featureline.tools.movielens_100k``), label ``value >= 4``, the last 30 days as the
validation split, everything else as a new user would leave it. Runs the ETL (Spark
local[2]), then ``featureline train`` once per seed (0, 1, 2: the model's scores are the
medians), and prints the validation AUC and log-loss of the model, of the popularity
baseline and of gradient-boosted trees (LightGBM) on the same examples, with the epoch
history.

    python benchmarks/bench_model.py
    python benchmarks/bench_model.py --epochs 10 --patience 2
    python benchmarks/bench_model.py --smoke      # one epoch (tests/test_benchmarks.py)
    python benchmarks/bench_model.py --fit-age 7  # a 7-day-old fit vs a fresh one

``--fit-age N``: what a daily run that keeps its fit between refits trades (docs/daily.md).
The same examples — the whole log, the same split — transformed twice: with a fresh fit
(the full run's own) and with the fit of a full run over the log as it was N days earlier
(``etl.fit.from_output``: its encodings and statistics as they were, its vocabularies
extended with the new ids); the model trained on each, both validation AUCs and their
difference.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from featureline.tools import movielens_100k

BIN = Path(sys.executable).parent
VALID_DAYS = 30
# The model is trained once per seed; its scores are the runs' medians (one run's order of
# the records moves the validation log-loss by ±0.01 on this log).
SEEDS = (0, 1, 2)


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


def _etl(settings: dict[str, Any], work: Path) -> None:
    """``featureline etl run`` with ``settings`` as its featureline.yaml, in ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "featureline.yaml"
    config.write_text(yaml.safe_dump(settings))
    etl = subprocess.run([str(BIN / "featureline"), "etl", "run", "--config", str(config)],
                         capture_output=True, text=True, cwd=work)
    if etl.returncode != 0:
        raise RuntimeError(f"the ETL failed: {(etl.stdout + etl.stderr)[-3000:]}")


def _train(output: Path, model: Path, epochs: int, patience: int, seed: int = 0,
           gbdt: bool = True) -> Any:
    from featureline.trainer.train import train

    return train(output, model, epochs=epochs, patience=patience, seed=seed, gbdt=gbdt,
                 progress=lambda line: print(line, file=sys.stderr))


def _machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version()}


def run(epochs: int, patience: int, work: Path, seeds: tuple[int, ...] = SEEDS
        ) -> dict[str, Any]:
    """The model trained once per seed on the same examples (the seed sets its initial
    weights and the order it reads the records in); ``model`` is the median run's scores
    (AUC and log-loss each their median), ``seeds`` every run's."""
    log = movielens_100k()
    output = work / "output"
    _etl(etl_config(log, output), work)
    results = [_train(output, work / f"model-{seed}", epochs, patience, seed,
                      gbdt=seed == seeds[0]) for seed in seeds]
    validation = results[0].validation
    runs = [{"seed": seed, **result.validation["model"], "best_epoch": result.best_epoch}
            for seed, result in zip(seeds, results, strict=True)]
    return {"machine": _machine(),
            "data": {"log": str(log), "rows": sum(1 for _ in log.open())},
            "valid_days": VALID_DAYS, "epochs": results[0].epochs,
            "best_epoch": results[0].best_epoch,
            "validation_rows": validation["rows"],
            "positive_rate": round(validation["positive_rate"], 4),
            "model": {key: statistics.median(run[key] for run in runs)
                      for key in ("auc", "log_loss")},
            "seeds": runs, "popularity": validation["baseline"],
            "gbdt": validation.get("gbdt")}


def fit_age(days: int, epochs: int, patience: int, work: Path) -> dict[str, Any]:
    """The model trained on the whole log's examples transformed with a fresh fit and with the
    fit of ``days`` days earlier (module docstring)."""
    log = movielens_100k()
    lines = log.read_text().splitlines()
    times = [json.loads(line)["ts"] for line in lines]
    cut = max(times) - days * 86_400
    earlier = work / "earlier.jsonl"
    earlier.write_text("".join(f"{line}\n" for line, ts in zip(lines, times, strict=True)
                               if ts < cut))
    _etl(etl_config(earlier, work / "earlier" / "output"), work / "earlier")
    scores, fits = {}, {}
    for name, fit in (("fresh", None), ("stale", work / "earlier" / "output")):
        settings = etl_config(log, work / name / "output")
        if fit is not None:
            settings["etl"]["fit"] = {"from_output": str(fit)}
        _etl(settings, work / name)
        fits[name] = json.loads((work / name / "output" / "metadata.json").read_text())["fit"]
        result = _train(work / name / "output", work / name / "model", epochs, patience)
        scores[name] = {"auc": result.validation["model"]["auc"],
                        "log_loss": result.validation["model"]["log_loss"],
                        "best_epoch": result.best_epoch}
    # The training events the stale fit never saw: between the two fits' training splits.
    since, until = (datetime.fromisoformat(fits[name]["trained_until"]).timestamp()
                    for name in ("stale", "fresh"))
    unseen = sum(1 for ts in times if since <= ts < until)
    return {"machine": _machine(), "fit_age_days": days, "valid_days": VALID_DAYS,
            "fits": {name: {k: fit[k] for k in ("version", "trained_until", "from")}
                     for name, fit in fits.items()},
            "training_events_after_the_stale_fit": unseen,
            "fresh": scores["fresh"], "stale": scores["stale"],
            "auc_difference": round(scores["stale"]["auc"] - scores["fresh"]["auc"], 6)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--patience", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="one epoch")
    parser.add_argument("--fit-age", type=int, metavar="DAYS",
                        help="a fit DAYS days old vs a fresh one, on the same examples")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        epochs = 1 if args.smoke else args.epochs
        if args.fit_age:
            report = fit_age(args.fit_age, epochs, args.patience, Path(tmp))
        else:
            report = run(epochs, args.patience, Path(tmp))
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
