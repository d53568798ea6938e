"""``featureline training-set``: point-in-time correct features joined onto entity rows.

Each row of the input (its join keys, ``event_timestamp``, and anything else such as a
label) comes back once, in input order, with every feature of the service as of that
timestamp: the latest snapshot at or before it and within the view's ttl, else null.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from feast import FeatureService
from feast.errors import FeatureServiceNotFoundException
from feast.type_map import feast_value_type_to_pa

from featureline.core.metadata import EVENT_TIMESTAMP
from featureline.feature_store.errors import (
    EntityRowsError,
    FeatureStoreError,
    UnknownFeatureServiceError,
)
from featureline.feature_store.repo import FeatureRepo

ROW = "__featureline_row"


@dataclass
class TrainingSetSummary:
    path: Path
    rows: int
    features: list[str]
    # Share of rows with a value, per feature: how many joins found a snapshot in time.
    coverage: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "rows": self.rows, "features": self.features,
                "coverage": {k: round(v, 4) for k, v in self.coverage.items()}}


def feature_service(repo: FeatureRepo, name: str) -> FeatureService:
    """The service as registered (what Feast queries), by a name the definitions hold."""
    if name not in repo.definitions.services:
        raise UnknownFeatureServiceError(name, sorted(repo.definitions.services))
    try:
        return repo.store.get_feature_service(name)
    except FeatureServiceNotFoundException:
        raise FeatureStoreError(f"feature service {name!r} is not registered yet; run "
                                "`featureline publish` first") from None


def _entity_rows(repo: FeatureRepo, service: FeatureService, path: Path) -> pd.DataFrame:
    if not path.exists():
        raise EntityRowsError(str(path), "no such file or folder")
    rows = pq.read_table(path).to_pandas()
    views = {p.name for p in service.feature_view_projections}
    keys = [view.entities[0] for view in repo.definitions.views.values() if view.name in views]
    join_keys = [repo.definitions.entities[name].join_key for name in keys]
    missing = [c for c in (*join_keys, EVENT_TIMESTAMP) if c not in rows.columns]
    if missing:
        raise EntityRowsError(str(path), f"missing column(s) {', '.join(missing)} "
                              f"(columns: {', '.join(rows.columns)})")
    try:
        rows[EVENT_TIMESTAMP] = pd.to_datetime(rows[EVENT_TIMESTAMP], utc=True)
    except (ValueError, TypeError) as exc:
        raise EntityRowsError(str(path), f"column {EVENT_TIMESTAMP}: {exc}") from None
    if rows[EVENT_TIMESTAMP].isna().any():
        raise EntityRowsError(str(path), f"column {EVENT_TIMESTAMP} has nulls "
                              f"(row {int(rows[EVENT_TIMESTAMP].isna().to_numpy().argmax())})")
    rows[ROW] = range(len(rows))
    return rows


def _schema(service: FeatureService, rows: pd.DataFrame) -> pa.Schema:
    fields = list(pa.Schema.from_pandas(rows.drop(columns=[ROW]), preserve_index=False))
    for projection in service.feature_view_projections:
        fields += [pa.field(f.name, feast_value_type_to_pa(f.dtype.to_value_type()))
                   for f in projection.features]
    return pa.schema(fields)


def training_set(repo: FeatureRepo, entity_rows: str | Path, service: str,
                 out: str | Path) -> TrainingSetSummary:
    """Join ``service``'s features onto the rows of the Parquet ``entity_rows``; write ``out``.

    ``out`` appears only once complete (written next to it, then renamed).
    """
    out = Path(out)
    features = feature_service(repo, service)
    rows = _entity_rows(repo, features, Path(entity_rows))
    joined = repo.store.get_historical_features(entity_df=rows, features=features).to_df()
    if len(joined) != len(rows):
        raise FeatureStoreError(f"the offline store returned {len(joined)} rows for "
                                f"{len(rows)} entity rows")
    joined = joined.sort_values(ROW).drop(columns=[ROW]).reset_index(drop=True)
    schema = _schema(features, rows)
    table = pa.Table.from_pandas(joined[schema.names], schema=schema, preserve_index=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    try:
        pq.write_table(table, partial)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    names = [f.name for p in features.feature_view_projections for f in p.features]
    coverage = {name: 1 - table[name].null_count / max(len(table), 1) for name in names}
    return TrainingSetSummary(out, len(table), names, coverage)
