"""The model-ready transform of a continuous feature, in NumPy: what serving applies to a
raw value so that it matches the examples a model was trained on.

metadata.json gives each continuous feature's ``transform`` (docs/ARCHITECTURE.md,
"Model-ready features"); the ETL computes the same thing in Spark SQL
(``etl/features/model_ready.py``).
"""

from __future__ import annotations

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
    name = transform["name"]
    if name == NONE:
        return np.nan_to_num(raw, nan=transform.get("fill", 0.0)).astype(np.float32)
    if name not in (LOG1P_STANDARDIZE, STANDARDIZE):
        raise ValueError(f"unknown transform {name!r} (known: {', '.join(TRANSFORMS)})")
    shaped = np.log1p(np.maximum(raw, 0.0)) if name == LOG1P_STANDARDIZE else raw
    shaped = np.where(np.isnan(shaped), transform["mean"], shaped)
    return ((shaped - transform["mean"]) / transform["std"]).astype(np.float32)
