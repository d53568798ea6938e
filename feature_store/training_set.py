"""``featureline training-set``: point-in-time correct features joined onto entity rows, or
(``--from-log``) the very values the API served, labelled from the ETL's examples.

Each row of the input (its join keys, ``event_timestamp``, and anything else such as a
label) comes back once, in input order, with every feature of the service as of that
timestamp: the latest snapshot at or before it and within the view's ttl, else null.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from feast import FeatureService
from feast.errors import FeatureServiceNotFoundException
from feast.type_map import feast_value_type_to_pa

from featureline.core.files import write_whole
from featureline.core.metadata import EVENT_TIMESTAMP, present, read_metadata
from featureline.feature_store.errors import (
    EntityRowsError,
    FeatureStoreError,
    UnknownFeatureServiceError,
)
from featureline.feature_store.feature_log import (
    KEYS,
    STATUS_SUFFIX,
    FeatureLogError,
    literal,
    open_log,
    quoted,
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
    join_keys = list(dict.fromkeys(key for p in service.feature_view_projections
                                   for key in repo.definitions.join_keys(p.name)))
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
    write_whole(out, lambda path: pq.write_table(table, path))
    names = [f.name for p in features.feature_view_projections for f in p.features]
    return TrainingSetSummary(out, len(table), names, _coverage(table, names))


def training_set_from_log(log: str | Path, output: str | Path, out: str | Path,
                          label_window_s: float = 86_400.0) -> TrainingSetSummary:
    """A training set of exactly the logged feature values: each served (user, item) row of
    the feature log (a ranking request's candidates get its user row's values), labelled by
    the first example of that pair in the ETL output at or after the request time and within
    ``label_window_s`` (rows without one are left out); ``out`` appears only once complete."""
    metadata = read_metadata(output)
    label = present(metadata.label, metadata, "label").name
    examples = Path(output) / metadata.outputs.get("examples", "examples")
    connection = duckdb.connect()
    columns = open_log(connection, log)
    names = [c for c in columns if f"{c}{STATUS_SUFFIX}" in columns]
    if not names or not all(key in columns for key in KEYS):
        raise FeatureLogError(str(log), "holds no served features of users and items")
    served = ", ".join(f"coalesce(p.{quoted(n)}, u.{quoted(n)}) AS {quoted(n)}"
                       for n in names)
    connection.execute(
        f"CREATE TEMP TABLE served AS SELECT p.request_id, p.request_time, p.user_id, "
        f"p.item_id, {served} FROM log p LEFT JOIN (SELECT * FROM log WHERE item_id IS NULL) "
        "u ON u.request_id = p.request_id AND u.user_id = p.user_id "
        "WHERE p.user_id IS NOT NULL AND p.item_id IS NOT NULL")
    connection.execute(
        "CREATE TEMP VIEW examples AS SELECT CAST(user_id AS VARCHAR) AS user_id, "
        f"CAST(item_id AS VARCHAR) AS item_id, CAST(ts AS TIMESTAMPTZ) AS ts, {quoted(label)} "
        f"AS label FROM read_parquet({literal(str(examples / '**' / '*.parquet'))}, "
        "hive_partitioning = true)")
    table = connection.execute(
        f"SELECT s.request_id, s.request_time, s.user_id, s.item_id, e.ts AS label_ts, "
        f"e.label AS {quoted(label)}, "
        + ", ".join(f"s.{quoted(n)}" for n in names)
        + " FROM served s ASOF JOIN examples e ON e.user_id = s.user_id AND "
        "e.item_id = s.item_id AND e.ts >= s.request_time "
        f"WHERE e.ts - s.request_time <= INTERVAL {int(label_window_s * 1e6)} MICROSECOND "
        "ORDER BY s.request_time, s.request_id, s.item_id").fetch_arrow_table()
    write_whole(Path(out), lambda path: pq.write_table(table, path))
    return TrainingSetSummary(Path(out), len(table), names, _coverage(table, names))


def _coverage(table: pa.Table, names: list[str]) -> dict[str, float]:
    """Share of rows with a value, per feature."""
    return {name: 1 - table[name].null_count / max(len(table), 1) for name in names}
