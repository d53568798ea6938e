"""``featureline consistency`` against ``featureline training-set`` over the same rows, same
machine, interleaved: the consistency job reads a feature log of ``--rows`` served rows (user
and item features of the ``ranking`` service, at request times spread over a day) and joins
each row point in time with the entity tables; the training-set query joins the same (user,
item, time) rows through Feast's offline store (DuckDB). Entity tables as in
``bench_feast.py``.

    python benchmarks/bench_consistency.py --rows 1000000
    python benchmarks/bench_consistency.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_feast import SNAPSHOT, _project, write_output

from featureline.feature_store.consistency import check_consistency
from featureline.feature_store.definitions import build
from featureline.feature_store.feature_log import STATUS_SUFFIX, feature_types, log_schema
from featureline.feature_store.redis_server import EmbeddedRedis
from featureline.feature_store.repo import open_repo
from featureline.feature_store.training_set import training_set


def write_log(output: Path, log: Path, rows: int, features: list[str], schema: pa.Schema
              ) -> pa.Table:
    """``rows`` served rows (the values the snapshots hold, all present), as the API logs
    them; the (user, item, time) rows."""
    connection = duckdb.connect()
    connection.execute("SET TimeZone = 'UTC'")
    for entity in ("user", "item"):
        connection.execute(f"CREATE TABLE {entity}s AS SELECT row_number() OVER () - 1 AS idx, "
                           f"* FROM read_parquet('{output}/entities/{entity}/**/*.parquet')")
    counts = {e: connection.execute(f"SELECT count(*) FROM {e}s").fetchone()[0]  # type: ignore[index]
              for e in ("user", "item")}
    values = ", ".join(f"{'u' if name.startswith('user') else 'i'}.{name}" for name in features)
    table = connection.execute(
        f"SELECT 'r' || n AS request_id, TIMESTAMPTZ '{SNAPSHOT.isoformat()}' + "
        f"to_seconds(n % 86400) AS request_time, 'features' AS endpoint, 'ranking' AS service, "
        f"u.user_id, i.item_id, {values} FROM range({rows}) t(n) "
        f"JOIN users u ON u.idx = hash(n) % {counts['user']} "
        f"JOIN items i ON i.idx = hash(n + {rows}) % {counts['item']} ORDER BY n").arrow()
    if isinstance(table, pa.RecordBatchReader):
        table = table.read_all()
    columns = []
    for field in schema:
        if field.name in table.column_names:
            columns.append(table[field.name].cast(field.type))
        elif field.name.endswith(STATUS_SUFFIX) and field.name[:-len(STATUS_SUFFIX)] in features:
            columns.append(pa.array(["present"] * rows, pa.string()))
        else:
            columns.append(pa.nulls(rows, field.type))
    logged = pa.Table.from_arrays(columns, schema=schema)
    folder = log / "date=2026-01-10"
    folder.mkdir(parents=True)
    pq.write_table(logged, folder / "features-bench.parquet")
    return logged


def run(rows: int, entities: int, repeats: int = 2) -> dict[str, Any]:
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                          "python": platform.python_version()},
                              "rows": rows, "entities": entities, "runs": []}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp) / "redis") as redis:
        root = Path(tmp)
        output = write_output(root, entities)
        config = _project(root)
        repo = open_repo(config.feature_store, output, url=redis.url)
        repo.store.apply(repo.definitions.objects())
        definitions = build(output, config.feature_store)
        types = feature_types(definitions.views)
        service = repo.store.get_feature_service("ranking")
        features = [f.name for p in service.feature_view_projections for f in p.features]
        logged = write_log(output, root / "log", rows, features, log_schema(types))
        entity_rows = root / "entity_rows.parquet"
        pq.write_table(pa.table({"user_id": logged["user_id"], "item_id": logged["item_id"],
                                 "event_timestamp": logged["request_time"]}), entity_rows)
        for _ in range(repeats):  # interleaved: A, B, A, B
            start = time.perf_counter()
            consistency = check_consistency(root / "log", output, config.feature_store)
            a = time.perf_counter() - start
            start = time.perf_counter()
            summary = training_set(repo, entity_rows, "ranking", root / "train.parquet")
            b = time.perf_counter() - start
            assert summary.rows == rows
            mismatches = sum(f.mismatch + f.missing + f.extra for f in consistency.features)
            compared = {f.feature: f.compared for f in consistency.features}
            report["runs"].append({"consistency_s": round(a, 2), "training_set_s": round(b, 2),
                                   "ratio": round(a / b, 3), "mismatches": mismatches,
                                   "compared": compared})
    ratios = [r["ratio"] for r in report["runs"]]
    report["consistency_vs_training_set"] = round(max(ratios), 3)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check it runs")
    args = parser.parse_args()
    report = (run(2_000, 200, 1) if args.smoke
              else run(args.rows, args.entities, args.repeats))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
