"""The model-ready transform of a continuous feature, in NumPy: what serving applies to a
raw value so that it matches the examples a model was trained on.

metadata.json gives each continuous feature's ``transform`` (docs/ARCHITECTURE.md,
"Model-ready features"); the ETL computes the same thing in Spark SQL
(``etl/features/model_ready.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

LOG1P_STANDARDIZE = "log1p_standardize"
STANDARDIZE = "standardize"
NONE = "none"
TRANSFORMS = (LOG1P_STANDARDIZE, STANDARDIZE, NONE)
Transform = Literal["log1p_standardize", "standardize", "none"]


def missing_indicator(feature: str) -> str:
    """The 0/1 feature that says ``feature`` had no value (e.g. no earlier event)."""
    return f"{feature}_missing"


def apply(values: Any, transform: dict[str, Any]) -> np.ndarray:
    """``transform`` (a feature's entry in metadata.json) applied to raw values; NaN or None
    is a missing value. float32, as the examples hold them."""
    raw = np.asarray(values, dtype=np.float64)
    return apply_rows(raw.reshape(1, -1), [transform])[0].reshape(raw.shape)


def apply_rows(rows: np.ndarray, transforms: Sequence[dict[str, Any]]) -> np.ndarray:
    """Each row's transform applied to a [features, n] float64 matrix, one NumPy pass per
    kind of transform; float32."""
    out = np.empty(rows.shape, dtype=np.float32)
    for name in dict.fromkeys(t["name"] for t in transforms):
        at = [i for i, t in enumerate(transforms) if t["name"] == name]
        chosen = [transforms[i] for i in at]
        raw = rows[at]
        if name == NONE:
            fill = np.array([[t.get("fill", 0.0)] for t in chosen])
            out[at] = np.where(np.isnan(raw), fill, raw)
            continue
        if name not in (LOG1P_STANDARDIZE, STANDARDIZE):
            raise ValueError(f"unknown transform {name!r} (known: {', '.join(TRANSFORMS)})")
        mean = np.array([[t["mean"]] for t in chosen])
        std = np.array([[t["std"]] for t in chosen])
        shaped = np.log1p(np.maximum(raw, 0.0)) if name == LOG1P_STANDARDIZE else raw
        out[at] = (np.where(np.isnan(shaped), mean, shaped) - mean) / std
    return out
