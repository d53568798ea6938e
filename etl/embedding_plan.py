"""The embedding plan: per categorical (or list) feature its table size and vector width.

Widths follow the fastai rule of thumb, ``1.6 * cardinality ** 0.56``, clipped to the
configured range and padded so a float32 row is a multiple of 16 bytes. Features of equal
width can be fused into one table; each gets a row offset into it. Features that reuse
another feature's ids (the previous item, the item history) read the owner's rows.
"""

from __future__ import annotations

from typing import Any

from featureline.etl.config import EmbeddingPlanConfig
from featureline.etl.features.base import FeatureSpec

ALIGNMENT_BYTES = 16
FLOAT32_BYTES = 4


def embedding_width(cardinality: int, config: EmbeddingPlanConfig) -> int:
    raw = round(1.6 * cardinality**0.56)
    width = min(config.max_width, max(config.min_width, raw))
    per_row = ALIGNMENT_BYTES // FLOAT32_BYTES
    return -(-width // per_row) * per_row


def fused_table_name(width: int) -> str:
    return f"fused_w{width}"


def embedding_plan(features: list[FeatureSpec], config: EmbeddingPlanConfig) -> dict[str, Any]:
    owners = [f for f in features if f.kind in ("categorical", "multi_hot") and f.shares is None]
    plan: dict[str, Any] = {}
    tables: dict[str, dict[str, Any]] = {}
    for feature in owners:
        assert feature.cardinality is not None, feature.name
        width = embedding_width(feature.cardinality, config)
        table = tables.setdefault(fused_table_name(width),
                                  {"width": width, "rows": 0, "features": []})
        plan[feature.name] = {"cardinality": feature.cardinality, "width": width,
                              "fused_table": fused_table_name(width), "row_offset": table["rows"]}
        table["features"].append({"name": feature.name, "row_offset": table["rows"],
                                  "rows": feature.cardinality})
        table["rows"] += feature.cardinality
    for feature in features:
        if feature.shares is not None:
            plan[feature.name] = {**plan[feature.shares], "shares": feature.shares}
    return {"dtype": "float32", "alignment_bytes": ALIGNMENT_BYTES, "features": plan,
            "fused_tables": tables}
