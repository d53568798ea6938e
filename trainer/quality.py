"""How good a model is, and whether a new one may replace the served one (``featureline
promote``): the AUC and log-loss of the validation split, the popularity baseline, and the
quality gate (docs/ARCHITECTURE.md, "Scoring"). NumPy alone, no TensorFlow.

The gate scores the candidate and the served model on the same validation day with the runtime
``/v1/rank`` uses (``trainer.score``). The candidate replaces the served model when its AUC is
at most ``max_auc_drop`` lower and its log-loss at most ``max_log_loss_rise`` higher. A served
model trained on another fit cannot read the day's examples; the candidate is then held to the
popularity baseline's AUC instead. The served model is a link to the folder `featureline train`
wrote; promoting points the link at the candidate's folder in one rename, and the API's reload
reads it there."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as ds
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from featureline.core.errors import ConfigError
from featureline.core.metadata import Metadata, encoded_name, present, read_metadata
from featureline.core.scoring import (
    DENSE_LAYOUT,
    GATE_METRICS,
    ModelFileError,
    ModelNotExportedError,
    Ranker,
    load_rankers,
)
from featureline.etl.tfrecord.reader import read_numpy
from featureline.trainer.settings import GateConfig

# Rows of prior weight in the baseline's per-item click rate.
BASELINE_SMOOTHING = 20.0
# The log-loss's bound on a predicted probability's distance from 0 and 1 (Keras' epsilon).
EPSILON = 1e-7
VERDICT_FILE = "gate.json"


def evaluate(labels: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """The exact AUC (ties count half) and the mean log-loss of ``predicted`` probabilities."""
    labels = np.asarray(labels, dtype=np.float64).reshape(-1)
    predicted = np.asarray(predicted, dtype=np.float64).reshape(-1)
    order = np.argsort(predicted, kind="stable")
    ranked = predicted[order]
    _, first, ties = np.unique(ranked, return_index=True, return_counts=True)
    ranks = np.repeat(first + (ties + 1) / 2.0, ties)  # 1-based, a tie's mean rank
    positive = labels[order] == 1
    positives = int(positive.sum())
    negatives = len(labels) - positives
    auc = (float("nan") if positives == 0 or negatives == 0 else
           float((ranks[positive].sum() - positives * (positives + 1) / 2)
                 / (positives * negatives)))
    p = np.clip(predicted, EPSILON, 1 - EPSILON)
    loss = -(labels * np.log(p) + (1 - labels) * np.log(1 - p))
    return {"auc": auc, "log_loss": float(loss.mean()) if len(loss) else float("nan")}


def popularity(metadata: Metadata, train: dict[str, np.ndarray] | None = None
               ) -> tuple[np.ndarray, float]:
    """The baseline: each item's training click rate, smoothed toward the overall rate
    (item id → score), from the training TFRecords (``train``: their columns, already
    read); and the overall rate."""
    item = encoded_name("item_id")
    if train is None:
        train = read_numpy(metadata, "train")
    label = present(metadata.label, metadata, "label").name
    items, labels = train[item], train[label].astype(np.float64)
    rows = present(metadata.embedding_plan, metadata, "embedding_plan").features[item].cardinality
    prior = float(labels.mean()) if len(labels) else 0.0
    events = np.bincount(items, minlength=rows)
    positives = np.bincount(items, weights=labels, minlength=rows)
    return ((positives + BASELINE_SMOOTHING * prior) / (events + BASELINE_SMOOTHING), prior)


def popularity_scores(metadata: Metadata, split: str = "valid") -> dict[str, float]:
    """The popularity baseline's AUC and log-loss on ``split``'s Parquet examples."""
    rate, _ = popularity(metadata)
    label = present(metadata.label, metadata, "label").name
    examples = ds.dataset(Path(metadata.folder or ".") / "examples", format="parquet",
                          partitioning="hive")
    rows = examples.to_table(columns=[label, encoded_name("item_id")],
                             filter=pc.field("split") == split)
    items = rows.column(1).to_numpy()
    return evaluate(rows.column(0).to_numpy(), rate[np.minimum(items, len(rate) - 1)])


@dataclass(frozen=True)
class Verdict:
    """What the gate decided of one model, on which rows, against what."""

    model: str
    promoted: bool
    reason: str
    candidate: dict[str, Any]  # path, version, auc, log_loss
    # The served model's (or, when it cannot read the day, popularity's) scores; None:
    # nothing was served.
    reference: dict[str, Any] | None
    rows: int
    dataset_version: str
    thresholds: dict[str, float]
    decided_at: float
    forced: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        scores = f"candidate AUC {self.candidate['auc']:.4f}, log-loss " \
                 f"{self.candidate['log_loss']:.4f}"
        if self.reference is not None:
            scores += (f"; {self.reference['name']} AUC {self.reference['auc']:.4f}"
                       + (f", log-loss {self.reference['log_loss']:.4f}"
                          if "log_loss" in self.reference else ""))
        word = ("REFUSED" if not self.promoted else
                f"promoted (forced: {self.forced})" if self.forced else "promoted")
        return f"{word}: {self.model} {self.reason} ({self.rows:,} validation rows: {scores})"


def _scored(data: Path, model: Path, label: str, name: str) -> dict[str, Any]:
    """The examples' labels and the scores of the model ``name`` exported in ``model``,
    validation split."""
    from featureline.trainer.score import SCORE, score

    table = score(data, model, name=name)
    return {"labels": table.column(label).to_numpy(), "scores": table.column(SCORE).to_numpy()}


def judge(data: str | Path, candidate: str | Path, served: str | Path | None,
          gate: GateConfig) -> list[Verdict]:
    """Score every model exported in ``candidate`` (the dense part, the trees) and the
    served model of its name on ``data``'s validation split, and decide whether each may
    replace it."""
    data, candidate = Path(data), Path(candidate)
    models = load_rankers(candidate)
    if not models:
        raise ModelNotExportedError(candidate)
    metadata = read_metadata(data)
    baseline = functools.cache(lambda: popularity_scores(metadata))  # read once, if needed
    return [_judged(data, metadata, baseline, candidate, served, gate, name, model)
            for name, model in models.items()]


def _judged(data: Path, metadata: Metadata, baseline_scores: Callable[[], dict[str, float]],
            candidate: Path, served: str | Path | None, gate: GateConfig, name: str,
            model: Ranker) -> Verdict:
    fit = metadata.fit.version if metadata.fit else None
    if model.versions.get("fit") != fit:
        raise ConfigError("--data", f"{candidate} was trained on examples of fit "
                          f"{model.versions.get('fit')}; {data} is of fit {fit}")
    label = present(metadata.label, metadata, "label").name
    mine = _scored(data, candidate, label, name)
    ours: dict[str, Any] = {"path": str(candidate.resolve()), "version": model.version,
                            **evaluate(mine["labels"], mine["scores"])}

    def verdict(promoted: bool, reason: str, reference: dict[str, Any] | None) -> Verdict:
        return Verdict(name, promoted, reason, ours, reference, len(mine["labels"]),
                       metadata.dataset_version, gate.model_dump(), time.time())

    if served is None or not Path(served).exists():
        return verdict(True, "is the first served", None)
    served = Path(served)
    if served.resolve() == candidate.resolve():
        return verdict(True, "is the served model", None)
    try:
        current = load_rankers(served).get(name)
        unread = ("is not served yet" if current is None else
                  None if current.versions.get("fit") == fit else
                  f"is served of fit {current.versions.get('fit')}, the day's examples of "
                  f"{fit}")
    except ModelFileError as exc:
        current, unread = None, f"cannot be read where served ({exc})"
    if current is not None and unread is None:
        theirs = _scored(data, served, label, name)
        reference: dict[str, Any] = {"name": "served model", "path": str(served.resolve()),
                                     "version": current.version,
                                     **evaluate(theirs["labels"], theirs["scores"])}
        worse = []
        if ours["auc"] < reference["auc"] - gate.max_auc_drop:
            worse.append(f"AUC {ours['auc']:.4f} < {reference['auc']:.4f} - "
                         f"{gate.max_auc_drop:g}")
        if ours["log_loss"] > reference["log_loss"] + gate.max_log_loss_rise:
            worse.append(f"log-loss {ours['log_loss']:.4f} > {reference['log_loss']:.4f} + "
                         f"{gate.max_log_loss_rise:g}")
        reason = ("is worse than the served model: " + "; ".join(worse) if worse else
                  "is not worse than the served model")
        return verdict(not worse, reason, reference)
    baseline: dict[str, Any] = {"name": "popularity", **baseline_scores()}
    del baseline["log_loss"]  # the model is held to the baseline's ranking, not its calibration
    note = f"{unread}: held to popularity's AUC"
    if ours["auc"] < baseline["auc"] - gate.max_auc_drop:
        return verdict(False, f"{note}; AUC {ours['auc']:.4f} < {baseline['auc']:.4f} - "
                       f"{gate.max_auc_drop:g}", baseline)
    return verdict(True, note, baseline)


def point(link: Path, target: Path) -> None:
    """Make ``link`` a symbolic link to ``target`` in one rename: a reader sees the old
    folder or the new one, never neither."""
    if link.exists() and not link.is_symlink():
        raise ConfigError("--served", f"{link} is a folder, not a link: move it away and "
                          f"point a link there (ln -s {link}-v1 {link} after mv {link} "
                          f"{link}-v1), then promote")
    link.parent.mkdir(parents=True, exist_ok=True)
    staged = link.with_name(f".{link.name}.{os.getpid()}.link")
    staged.unlink(missing_ok=True)
    staged.symlink_to(target.resolve(), target_is_directory=True)
    os.replace(staged, link)


def prometheus(verdicts: list[Verdict]) -> str:
    """The verdicts in Prometheus' text format (the API's /metrics exports the served
    folder's file; the FeaturelineModelRefused alert reads it)."""
    registry = CollectorRegistry()
    refused = Gauge("featureline_model_gate_refused", "1 when the newest candidate of the model "
                    "was refused and the one served before it still serves, else 0",
                    ["model"], registry=registry)
    scores = Gauge("featureline_model_gate_score", "The validation day's scores the gate "
                   "compared", ["model", "role", "metric"], registry=registry)
    for verdict in verdicts:
        refused.labels(verdict.model).set(int(not verdict.promoted))
        for role, values in (("candidate", verdict.candidate),
                             ("reference", verdict.reference)):
            for metric in ("auc", "log_loss"):
                if values is not None and metric in values:
                    scores.labels(verdict.model, role, metric).set(values[metric])
    Gauge("featureline_model_gate_run_timestamp_seconds", "When the gate decided (Unix time)",
          registry=registry).set(max((v.decided_at for v in verdicts), default=time.time()))
    return generate_latest(registry).decode()


def promote(data: str | Path, candidate: str | Path, served: str | Path, gate: GateConfig,
            *, force: str | None = None, keep: int | None = None) -> list[Verdict]:
    """Judge every model in ``candidate`` against the one of its name ``served`` links to;
    when none is worse (or ``force`` gives the reason to serve them all the same), point
    ``served`` at the candidate. The verdicts are written to the candidate's folder
    (``gate.json``) and, in Prometheus' format, to the folder served afterwards
    (``gate.prom``). ``keep``: then delete all but the newest ``keep`` folders beside the
    candidate (the served one always stays)."""
    candidate, served = Path(candidate), Path(served)
    verdicts = judge(data, candidate, served, gate)
    if force and not all(v.promoted for v in verdicts):
        verdicts = [dataclasses.replace(v, promoted=True, forced=force) for v in verdicts]
    promoted = all(v.promoted for v in verdicts)
    (candidate / VERDICT_FILE).write_text(json.dumps(
        {"promoted": promoted, "models": [v.to_json() for v in verdicts]}, indent=2))
    if promoted:
        point(served, candidate)
    if served.exists():
        staged = served / f".{GATE_METRICS}.{os.getpid()}"
        staged.write_text(prometheus(verdicts))
        os.replace(staged, served / GATE_METRICS)
    if keep is not None:
        prune(candidate.parent, keep, served.resolve())
    return verdicts


def prune(folder: Path, keep: int, served: Path) -> list[Path]:
    """Delete the model folders in ``folder`` (those holding an exported dense part) but the
    newest ``keep`` and ``served``; the deleted ones. Any other folder there stays."""
    models = sorted((p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()
                     and (p / DENSE_LAYOUT).is_file()),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    gone = [p for p in models[keep:] if p.resolve() != served]
    for path in gone:
        shutil.rmtree(path)
    return gone
