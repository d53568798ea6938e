"""Whether features help (``featureline lift``): the reference model and the gradient-boosted
trees trained with and without them, on the same split and seeds, and the differences of
their validation AUC and log-loss with the spread over the seeds.

Without a feature, the model keeps its shape: the feature is held blank in every row, train
and validation (``model.Blank``), so nothing can be learned from it. The trees leave its
column out, once: LightGBM's trees here do not depend on the seed. Each seed trains the
model's two sides from the same initial weights and shuffles."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from featureline.core.errors import ConfigError
from featureline.core.metadata import Metadata
from featureline.trainer.gbdt import gbdt_baseline
from featureline.trainer.model import LABEL_KIND, Blank
from featureline.trainer.quality import evaluate
from featureline.trainer.train import fit_model, scores, trainable

OPTION = "--without"
METRICS = ("auc", "log_loss")
SIDES = ("with", "without")


def feature_names(metadata: Metadata, names: Sequence[str]) -> tuple[str, ...]:
    """The examples' columns ``names`` stand for: metadata.json's feature names, or an
    aggregation's ``group:output`` as the API names it, each with its missing indicator. A
    :class:`ConfigError` names any other."""
    known = [f.name for f in metadata.features if f.kind != LABEL_KIND]
    found = []
    for name in names:
        column = name.replace(":", "__", 1) if ":" in name else name
        if column not in known:
            raise ConfigError(OPTION, f"{name!r} is not a feature of this output (its "
                                      f"features: {', '.join(known)})")
        found.append(column)
    if not found:
        raise ConfigError(OPTION, "name at least one feature to leave out")
    found += [f.name for f in metadata.features
              if (f.transform or {}).get("of") in found]  # their missing indicators
    return tuple(dict.fromkeys(found))


def spread(deltas: Sequence[float]) -> dict[str, Any]:
    """The mean of the seeds' differences, their sample standard deviation (0 for one seed),
    the smallest and the largest, and each seed's."""
    values = np.asarray(deltas, dtype=np.float64)
    return {"mean": float(values.mean()),
            "sd": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
            "min": float(values.min()), "max": float(values.max()),
            "per_seed": [float(v) for v in values]}


@dataclass(frozen=True)
class LiftResult:
    data: str
    without: list[str]
    seeds: list[int]
    rows: int  # validation rows each side is scored on
    # "model" / "gbdt" → "with" / "without" → the scores per seed (auc, log_loss).
    runs: dict[str, dict[str, list[dict[str, float]]]]

    def lift(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Per model and metric, the difference with − without: :func:`spread`."""
        return {model: {metric: spread([w[metric] - wo[metric] for w, wo in
                                        zip(sides["with"], sides["without"], strict=True)])
                        for metric in METRICS}
                for model, sides in self.runs.items() if sides["with"]}

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "lift": self.lift()}

    def summary(self) -> str:
        lines = [f"lift of {', '.join(self.without)} ({len(self.seeds)} seeds, "
                 f"{self.rows:,} validation rows; with − without):"]
        for model, metrics in self.lift().items():
            sides = self.runs[model]
            mean = {side: {m: float(np.mean([r[m] for r in sides[side]])) for m in METRICS}
                    for side in SIDES}
            parts = [f"{'AUC' if metric == 'auc' else 'log-loss'} {d['mean']:+.4f} "
                     f"(sd {d['sd']:.4f}, {d['min']:+.4f} to {d['max']:+.4f})"
                     for metric, d in metrics.items()]
            once = " (one run: the trees do not depend on the seed)" * (model == "gbdt")
            lines.append(f"  {'model' if model == 'model' else 'GBDT'}: {', '.join(parts)}; "
                         f"AUC {mean['with']['auc']:.4f} with, "
                         f"{mean['without']['auc']:.4f} without{once}")
        return "\n".join(lines)


def lift(data: str | Path, without: Sequence[str], *, seeds: Sequence[int] = (0, 1, 2),
         epochs: int = 10, patience: int = 2, batch_size: int = 2048,
         learning_rate: float = 1e-3, gbdt: bool = True,
         progress: Callable[[str], None] = print) -> LiftResult:
    """Train the reference model (and, where ``gbdt`` and LightGBM is installed, the trees)
    on ``data`` with and without the features ``without`` names, once per seed, and score
    each on the validation split."""
    metadata = trainable(data)
    names = feature_names(metadata, without)
    blank = Blank(metadata, names)
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        model: {side: [] for side in SIDES} for model in ("model", "gbdt")}
    rows = 0
    for seed in seeds:
        for side in SIDES:
            held = blank if side == "without" else None
            fitted = fit_model(metadata, seed=seed, epochs=epochs, patience=patience,
                               batch_size=batch_size, learning_rate=learning_rate,
                               progress=lambda _: None, blank=held)
            labels, predicted, _ = scores(fitted.model, metadata, batch_size, held)
            rows = len(labels)
            runs["model"][side].append(evaluate(labels, predicted))
            if gbdt and seed == seeds[0]:  # the trees do not depend on the seed: once
                trees = gbdt_baseline(metadata, seed, without=names if held else ())
                if "auc" in trees:
                    runs["gbdt"][side].append({m: trees[m] for m in METRICS})
        done = {"model": [runs["model"][side][-1]["auc"] for side in SIDES]}
        if runs["gbdt"]["with"] and seed == seeds[0]:
            done["gbdt"] = [runs["gbdt"][side][-1]["auc"] for side in SIDES]
        progress(f"seed {seed}: " + "; ".join(
            f"{model} AUC {auc[0]:.4f} with, {auc[1]:.4f} without"
            for model, auc in done.items()))
    return LiftResult(str(data), list(names), list(seeds), rows, runs)
