"""``featureline consistency``: what the API served (its feature log) against what the ETL
output says at the same instants — training/serving skew, measured (docs/ARCHITECTURE.md,
"Online/offline consistency").

Each logged row is joined point-in-time with its entity's table of the ETL output: the
latest snapshot at or before the row's request time (DuckDB's ``ASOF`` join), within the
view's ttl — what Feast's offline store gives a training set for that entity and time. Per
feature, over the rows that asked for it:

- ``compared``: present online and offline; ``mismatch`` among them: the values differ
  (numbers beyond a relative 1e-9);
- ``missing``: served, but offline there is no value; ``extra``: offline there is a value,
  but the API answered not_found / outside_ttl;
- ``smape``: the symmetric mean absolute percentage error of the compared numbers;
- ``streamed``: rows whose served value the stream processor wrote after the batch
  (their view timestamp is newer than the snapshot the join found). Given the processor's
  archive (``expected``: stream/expected.py), every row of an entity streamed events
  touched is a streamed row, and is compared with what the
  processor should have served at the request time — the entity table's group over the
  output's events and the archived events applied before it — and counted like any other
  row; ``unsettled``: the streamed
  rows not compared (no archive given, or it cannot settle them);
- ``top``: the entities with the most differing rows.

The aggregations the log holds (``<group>:<feature>``, of every group: a row's key is its
columns' values) — and the entity views' features their tables' groups define
(``user_events_7d`` …: the API serves them at the request time too) — are compared with
their definition at each row's request time, recomputed event by event from the output's
accepted events and the archive's pushed events applied by then (:func:`_aggregations`);
the snapshot join above compares the views' other features (the encoded ids).

``mismatch_ratio`` = (mismatch + missing + extra) / (compared + missing + extra); the job
fails (exit status 1) when a feature's ratio exceeds ``max_mismatch``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import duckdb
import orjson
import pyarrow as pa

from featureline.core.aggregations import (
    PushedEvent,
    accepted_events,
    applied_events,
    event_filter,
    pushed_by_key,
    value_at,
)
from featureline.core.metadata import Metadata, read_metadata
from featureline.feature_store.definitions import build, view_name
from featureline.feature_store.feature_log import (
    STATUS_SUFFIX,
    TIMESTAMP_SUFFIX,
    FeatureLogError,
    literal,
    open_log,
    quoted,
)
from featureline.feature_store.settings import FeatureStoreConfig

RELATIVE_TOLERANCE = 1e-9
METRIC_PREFIX = "featureline_consistency"


class StreamExpectation(Protocol):
    """What the stream processor should have served (stream/expected.py)."""

    def pushed_events(self) -> Sequence[PushedEvent]:
        """Every archived event once."""

    def keys(self, entity: str) -> set[str]:
        """The entity's ids (as logged) that streamed events touched."""

    def expected(self, entity: str, keys: Sequence[str], times: Sequence[datetime]
                 ) -> list[dict[str, Any] | None]:
        """Per row (an id and its request time): the features the processor should have
        served then, or None where that cannot be settled."""


@dataclass
class FeatureConsistency:
    feature: str
    entity: str
    compared: int
    mismatch: int
    missing: int
    extra: int
    streamed: int
    unsettled: int
    smape: float | None
    top: list[dict[str, Any]] = field(default_factory=list)

    @property
    def checked(self) -> int:
        return self.compared + self.missing + self.extra

    @property
    def mismatch_ratio(self) -> float:
        return (self.mismatch + self.missing + self.extra) / self.checked if self.checked else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "mismatch_ratio": round(self.mismatch_ratio, 6),
                "smape": None if self.smape is None else round(self.smape, 6)}


@dataclass
class ConsistencyReport:
    log: str
    output: str
    dataset_version: str
    rows: int  # logged rows read
    features: list[FeatureConsistency]
    max_mismatch: float

    @property
    def passed(self) -> bool:
        return all(f.mismatch_ratio <= self.max_mismatch for f in self.features)

    def to_json(self) -> dict[str, Any]:
        return {"log": self.log, "output": self.output, "dataset_version": self.dataset_version,
                "rows": self.rows, "max_mismatch": self.max_mismatch, "passed": self.passed,
                "features": [f.to_json() for f in self.features]}

    def lines(self) -> list[str]:
        """One summary line per feature, for people."""
        out = [f"{self.rows:,} logged rows against {self.output} (dataset "
               f"{self.dataset_version})"]
        for f in self.features:
            smape = "-" if f.smape is None else f"{f.smape:.4f}"
            worst = ", ".join(f"{t['entity']} ({t['rows']})" for t in f.top)
            out.append(f"{f.feature}: compared {f.compared:,}, mismatch {f.mismatch:,}, missing "
                       f"{f.missing:,}, extra {f.extra:,}, streamed {f.streamed:,} "
                       f"({f.unsettled:,} unsettled), smape "
                       f"{smape}, ratio {f.mismatch_ratio:.4%}" + (f"; worst: {worst}" if worst
                                                                  else ""))
        failed = [f.feature for f in self.features if f.mismatch_ratio > self.max_mismatch]
        out.append(f"FAILED: mismatch ratio above {self.max_mismatch:.4%} for "
                   f"{', '.join(failed)}" if failed else
                   f"PASSED: every mismatch ratio <= {self.max_mismatch:.4%}")
        return out

    def prometheus(self) -> str:
        """The report in Prometheus' text format (for node_exporter's textfile collector or
        a Pushgateway)."""
        lines = []
        kinds = ("compared", "mismatch", "missing", "extra", "streamed", "unsettled")
        lines.append(f"# HELP {METRIC_PREFIX}_mismatch_ratio (mismatch + missing + extra) / "
                     "checked rows, per feature, of the last consistency run")
        lines.append(f"# TYPE {METRIC_PREFIX}_mismatch_ratio gauge")
        for f in self.features:
            lines.append(f'{METRIC_PREFIX}_mismatch_ratio{{feature="{f.feature}"}} '
                         f"{f.mismatch_ratio:.9g}")
        lines.append(f"# HELP {METRIC_PREFIX}_rows Rows of the last consistency run, per "
                     "feature and kind")
        lines.append(f"# TYPE {METRIC_PREFIX}_rows gauge")
        for f in self.features:
            for kind in kinds:
                lines.append(f'{METRIC_PREFIX}_rows{{feature="{f.feature}",kind="{kind}"}} '
                             f"{getattr(f, kind)}")
        lines.append(f"# HELP {METRIC_PREFIX}_passed 1 when every feature's mismatch ratio "
                     "was within the threshold")
        lines.append(f"# TYPE {METRIC_PREFIX}_passed gauge")
        lines.append(f"{METRIC_PREFIX}_passed {int(self.passed)}")
        return "\n".join(lines) + "\n"


# More rows to compare (the model inputs the API logged: api/inputs_consistency.py): given the
# connection whose ``log`` view holds the log, and the log's columns.
MoreRows = Callable[[duckdb.DuckDBPyConnection, set[str]], list["FeatureConsistency"]]


def check_consistency(log: str | Path, output: str | Path, settings: FeatureStoreConfig, *,
                      max_mismatch: float = 0.0, top: int = 5,
                      expected: StreamExpectation | None = None,
                      more: MoreRows | None = None) -> ConsistencyReport:
    """Compare the feature log ``log`` with the ETL output ``output`` (and the rows the
    stream processor wrote with what ``expected`` says it should have served, and what
    ``more`` compares)."""
    metadata = read_metadata(output)
    definitions = build(output, settings)
    folder = Path(output)
    connection = duckdb.connect()
    columns = set(open_log(connection, log))
    rows = int(connection.execute("SELECT count(*) FROM log").fetchone()[0])  # type: ignore[index]
    reports = []
    # The entity views' features their group defines: compared as the aggregations are.
    defined = {f.output for group in metadata.tile_groups() if group.name in metadata.entities
               for f in group.outputs()}
    for entity, view in definitions.views.items():
        table = metadata.entities[entity]
        key, stamp = table.join_key, table.timestamp_field
        names = [f.name for f in view.features if f.name in columns
                 and f"{f.name}{STATUS_SUFFIX}" in columns and f.name not in defined]
        if not names or key not in columns:
            continue
        ttl = view.ttl.total_seconds() if view.ttl else None
        served_stamp = f"{view.name}{TIMESTAMP_SUFFIX}"
        files = literal(str(folder / table.path / "**" / "*.parquet"))
        connection.execute(
            f"CREATE OR REPLACE TEMP VIEW snapshots AS SELECT CAST({key} AS VARCHAR) AS __key, "
            f"CAST({stamp} AS TIMESTAMPTZ) AS __at, {', '.join(quoted(n) for n in names)} "
            f"FROM read_parquet({files})")
        asked = " OR ".join(f"{quoted(n + STATUS_SUFFIX)} IS NOT NULL" for n in names)
        in_ttl = "TRUE" if ttl is None else f"l.request_time - s.__at <= INTERVAL {int(ttl)} SECOND"
        streamed = (f"(l.{quoted(served_stamp)} IS NOT NULL AND (s.__at IS NULL OR "
                    f"l.{quoted(served_stamp)} > s.__at))" if served_stamp in columns
                    else "FALSE")
        connection.execute(
            f"CREATE OR REPLACE TEMP TABLE joined AS SELECT l.{key} AS __key, "
            "row_number() OVER () AS __row, l.request_time AS __time, FALSE AS __settled, "
            f"s.__at IS NOT NULL AND {in_ttl} AS __offline, {streamed} AS __streamed, "
            + ", ".join(f"l.{quoted(n)} AS {quoted('served:' + n)}, "
                        f"l.{quoted(n + STATUS_SUFFIX)} AS {quoted('status:' + n)}, "
                        f"s.{quoted(n)} AS {quoted('offline:' + n)}" for n in names)
            + f" FROM (SELECT * FROM log WHERE {key} IS NOT NULL AND ({asked})) l "
            "ASOF LEFT JOIN snapshots s ON l." + key + " = s.__key AND l.request_time >= s.__at")
        if expected is not None:
            _settle(connection, entity, names, expected)
        types = {f.name: f.dtype.to_value_type().name for f in view.features}
        for name in names:
            numeric = types[name] in ("INT32", "INT64", "FLOAT", "DOUBLE")
            reports.append(feature_consistency(connection, entity, name, numeric, top))
    reports += _aggregations(connection, metadata, columns, expected, top)
    if more is not None:
        reports += more(connection, columns)
    if not reports:
        raise FeatureLogError(str(log), "its rows hold none of the output's features")
    return ConsistencyReport(str(log), str(output), metadata.dataset_version, rows, reports,
                             max_mismatch)


def _aggregations(connection: duckdb.DuckDBPyConnection, metadata: Metadata,
                  columns: set[str], expected: StreamExpectation | None, top: int
                  ) -> list[FeatureConsistency]:
    """The logged aggregations (``<group>:<feature>``; a row's key: its group's key columns)
    and the entity views' features their tables' groups define (``user_events_7d`` …),
    against the rule of time at each row's request time, read event by event from the
    output's accepted events and, given the archive, the pushed events from
    the output's cut that the processor had applied by then (a row is unsettled while one of
    its key's was being applied). A key without events has a value (0, or none for a mean):
    it is compared as any other. Rows before the cut were served from an earlier output and
    are left out."""
    info = metadata.tiles
    if info is None or metadata.events is None:
        return []
    reports = []
    for group in metadata.tile_groups():
        keys = list(group.keys)
        # Each output's name in the log: <group>:<feature>, an entity view's own name.
        logged_as = {f.output: f.output if group.name in metadata.entities else f.qualified
                     for f in group.outputs()}
        outputs = [f for f in group.outputs() if logged_as[f.output] in columns
                   and f"{logged_as[f.output]}{STATUS_SUFFIX}" in columns]
        if not outputs or not all(key in columns for key in keys):
            continue
        names = [logged_as[f.output] for f in outputs]
        asked = " OR ".join(f"{quoted(name + STATUS_SUFFIX)} IS NOT NULL" for name in names)
        # An entity's row the processor wrote says so by its timestamp (newer than its
        # table's latest snapshot): without the archive, its rows are streamed, unsettled.
        entity = group.name in metadata.entities
        stamp = f"{view_name(group.name)}{TIMESTAMP_SUFFIX}"
        by_stamp = entity and expected is None and stamp in columns
        logged = connection.execute(
            "SELECT " + ", ".join(f"{quoted(key)} AS __key{i}" for i, key in enumerate(keys))
            + ", row_number() OVER () AS __row, epoch_us(request_time) AS __time, "
            + (f"epoch_us({quoted(stamp)}) AS __stamp, " if by_stamp else "")
            + ", ".join(f"{quoted(name)} AS {quoted('served:' + name)}, "
                        f"{quoted(name + STATUS_SUFFIX)} AS {quoted('status:' + name)}"
                        for name in names)
            + " FROM log WHERE " + " AND ".join(f"{quoted(key)} IS NOT NULL" for key in keys)
            + f" AND ({asked}) AND epoch_us(request_time) >= {info.cut_us}").fetch_arrow_table()
        row_keys = list(zip(*(logged[f"__key{i}"].to_pylist() for i in range(len(keys))),
                            strict=True))
        wanted = set(row_keys)
        if not wanted:  # no row asked for the group (a log of model inputs alone)
            continue
        batch = accepted_events(metadata.events_folder(), group, wanted)
        pushed = pushed_by_key(group, expected.pushed_events() if expected is not None else (),
                               info.cut_us)
        keeps = {f.output: event_filter(f.spec, metadata.events) for f in outputs}
        offline: dict[str, list[Any]] = {name: [] for name in names}
        settled, streamed = [], []
        stamps = (logged["__stamp"].to_pylist() if by_stamp
                  else [None] * logged.num_rows)
        snapshots = _latest_snapshots(connection, metadata, group.name) if by_stamp else {}
        for own_key, t, written in zip(row_keys, logged["__time"].to_pylist(), stamps,
                                       strict=True):
            applied = applied_events(pushed.get(own_key, ()), t / 1_000_000)
            by_stream = written is not None and written > snapshots.get(own_key[0], -1)
            unsettled = applied is None or by_stream
            events = [*batch.get(own_key, ()), *(applied or ())]
            streamed.append(own_key in pushed or by_stream)
            settled.append(not unsettled)
            for feature in outputs:
                # An entity without events has no row: nothing served, nothing expected.
                offline[logged_as[feature.output]].append(
                    None if unsettled or (entity and not events)
                    else value_at(feature, events, t, keeps[feature.output]))
        # A row's key as the report names it: the one value, or the values as a JSON list.
        named = [own[0] if len(own) == 1 else orjson.dumps(list(own)).decode()
                 for own in row_keys]
        table = logged.append_column("__key", pa.array(named, pa.string())).append_column(
            "__settled", pa.array(settled)).append_column(
            "__streamed", pa.array(streamed)).append_column(
            "__offline", pa.array(settled))
        served = {name: logged.schema.field(f"served:{name}").type for name in names}
        for name, kind in served.items():
            table = table.append_column(f"offline:{name}", pa.array(offline[name], kind))
        connection.register("__aggregations", table)
        connection.execute("CREATE OR REPLACE TEMP TABLE joined AS SELECT * FROM __aggregations")
        connection.unregister("__aggregations")
        for name, kind in served.items():
            numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind)
            reports.append(feature_consistency(connection, group.name, name, numeric, top,
                                               defined=True))
    return reports


def _latest_snapshots(connection: duckdb.DuckDBPyConnection, metadata: Metadata,
                      entity: str) -> dict[str, int]:
    """Each id's latest snapshot in the entity's table (µs)."""
    table = metadata.entities[entity]
    files = literal(str(Path(metadata.folder or ".") / table.path / "**" / "*.parquet"))
    rows = connection.execute(
        f"SELECT CAST({quoted(table.join_key)} AS VARCHAR), "
        f"epoch_us(max(CAST({quoted(table.timestamp_field)} AS TIMESTAMPTZ))) "
        f"FROM read_parquet({files}) GROUP BY 1").fetchall()
    return dict(rows)


def _settle(connection: duckdb.DuckDBPyConnection, entity: str, names: list[str],
            expected: StreamExpectation) -> None:
    """The rows of ``joined`` whose entity streamed events touched are streamed rows (also
    those served before the stream's write of them); those ``expected`` settles get its
    values as their offline ones."""
    touched = sorted(expected.keys(entity))
    if touched:
        connection.register("__touched", pa.table({"key": touched}))
        connection.execute("UPDATE joined SET __streamed = TRUE WHERE __key IN "
                           "(SELECT key FROM __touched)")
        connection.unregister("__touched")
    rows = connection.execute("SELECT __row, __key, __time FROM joined WHERE __streamed "
                              "ORDER BY __row").fetchall()
    if not rows:
        return
    values = expected.expected(entity, [key for _, key, _ in rows], [at for _, _, at in rows])
    settled = [(row, value) for (row, _, _), value in zip(rows, values, strict=True)
               if value is not None and all(n in value for n in names)]
    if not settled:
        return
    connection.register("__expected", pa.table(
        {"__row": [row for row, _ in settled],
         **{f"expected:{n}": [value[n] for _, value in settled] for n in names}}))
    connection.execute(
        "UPDATE joined SET __settled = TRUE, __offline = TRUE, "
        + ", ".join(f"{quoted('offline:' + n)} = e.{quoted('expected:' + n)}" for n in names)
        + " FROM __expected e WHERE joined.__row = e.__row")
    connection.unregister("__expected")


def feature_consistency(connection: duckdb.DuckDBPyConnection, entity: str, name: str,
                        numeric: bool, top: int, defined: bool = False
                        ) -> FeatureConsistency:
    """``defined``: every key has a value (an aggregation: a key without events reads the
    value of none, served ``not_found``), so a row is compared whatever its status, a
    missing value equal to a missing one."""
    served, status, offline = (quoted(f"{part}:{name}") for part in ("served", "status",
                                                                      "offline"))
    present = f"{status} = 'present'"
    expected = f"(__offline AND {offline} IS NOT NULL)"
    differs = (f"abs({served} - {offline}) > {RELATIVE_TOLERANCE} * greatest(1, abs({offline}))"
               if numeric else f"{served} IS DISTINCT FROM {offline}")
    if defined:
        present, expected = f"{status} IS NOT NULL", "__offline"
        if numeric:
            differs = (f"({served} IS NULL) <> ({offline} IS NULL) OR coalesce({differs}, "
                       "FALSE)")
    kind = (f"CASE WHEN {status} IS NULL THEN NULL WHEN __streamed AND NOT __settled "
            "THEN 'unsettled' "
            f"WHEN {present} AND {expected} THEN (CASE WHEN {differs} THEN 'mismatch' "
            f"ELSE 'equal' END) WHEN {present} THEN 'missing' WHEN {expected} THEN 'extra' "
            "END")
    error = (f"CASE WHEN abs({served}) + abs({offline}) = 0 THEN 0 ELSE 2 * abs({served} - "
             f"{offline}) / (abs({served}) + abs({offline})) END" if numeric else "NULL")
    connection.execute(f"CREATE OR REPLACE TEMP VIEW kinds AS SELECT __key, __streamed, "
                       f"{status} IS NOT NULL AS asked, {kind} AS kind, "
                       f"CASE WHEN ({kind}) IN ('equal', 'mismatch') THEN {error} END AS error, "
                       f"{served} AS served, {offline} AS offline FROM joined")
    # Per kind (None: asked, but absent online and offline), and the streamed rows among them.
    rows = connection.execute("SELECT kind, count(*), count(*) FILTER (WHERE __streamed) FROM "
                              "kinds WHERE asked GROUP BY kind").fetchall()
    counts = {kind: n for kind, n, _ in rows}
    streamed = sum(n for _, _, n in rows)
    smape = connection.execute("SELECT avg(error) FROM kinds").fetchone()[0]  # type: ignore[index]
    worst = connection.execute(
        "SELECT __key, count(*), any_value(served), any_value(offline) FROM kinds WHERE kind IN "
        "('mismatch', 'missing', 'extra') GROUP BY __key ORDER BY count(*) DESC, __key LIMIT ?",
        [top]).fetchall()
    return FeatureConsistency(
        name, entity, compared=counts.get("equal", 0) + counts.get("mismatch", 0),
        mismatch=counts.get("mismatch", 0), missing=counts.get("missing", 0),
        extra=counts.get("extra", 0), streamed=int(streamed),
        unsettled=counts.get("unsettled", 0),
        smape=None if smape is None else float(smape),
        top=[{"entity": key, "rows": n, "served": s, "offline": o} for key, n, s, o in worst])
