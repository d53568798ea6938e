"""Which TFRecord features hold which columns: the ``"groups"`` of metadata.json.

Grouped (the default), all categorical ids share one int64 feature (P × n_categorical,
row-major), all continuous values one float feature, the label its own, and the multi-hot
lists of equal length one int64 feature (P × n_lists × K). Ungrouped, each column is its own
feature. Names are the 1–3 character short names, or the long ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Group:
    name: str
    dtype: str  # "int64" | "float32"
    columns: tuple[str, ...]
    # Values per row, all columns together; each column has width / len(columns).
    width: int

    @property
    def column_width(self) -> int:
        return self.width // len(self.columns)

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "columns": list(self.columns), "width": self.width}

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> Group:
        return cls(name, data["dtype"], tuple(data["columns"]), int(data["width"]))


_GROUP_NAMES = {"categorical": "c", "continuous": "f", "label": "y", "multi_hot": "h"}


def build_layout(features: list[dict[str, Any]], label: dict[str, Any], *, group_types: bool,
                 short_names: bool) -> list[Group]:
    """The groups for the features and label of metadata.json."""
    if not group_types:
        columns = [*features, {**label, "kind": "label", "width": 1}]
        return [Group(c["short_name"] if short_names else c["name"], c["dtype"], (c["name"],),
                      int(c.get("width", 1))) for c in columns]

    def name(kind: str, index: int = 0) -> str:
        base = _GROUP_NAMES[kind] if short_names else kind
        return f"{base}{index}" if index else base

    groups = []
    for kind, dtype in (("categorical", "int64"), ("continuous", "float32")):
        members = tuple(f["name"] for f in features if f["kind"] == kind)
        if members:
            groups.append(Group(name(kind), dtype, members, len(members)))
    widths = sorted({int(f["width"]) for f in features if f["kind"] == "multi_hot"})
    for index, k in enumerate(widths):
        members = tuple(f["name"] for f in features if f["kind"] == "multi_hot"
                        and int(f["width"]) == k)
        groups.append(Group(name("multi_hot", index), "int64", members, k * len(members)))
    groups.append(Group(name("label"), label["dtype"], (label["name"],), 1))
    return groups
