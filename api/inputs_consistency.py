"""The model inputs the API served (``input:<feature>`` rows of the feature log), against
their definition recomputed at each row's request time (``featureline consistency``;
docs/ARCHITECTURE.md, "Online/offline consistency").

A logged row's request — its user, candidate, request columns and request time — is answered
again by the code that served it (:class:`ServedInputs`), over the engine's outputs read
event by event instead of from the tiles: the output's accepted events and, given the stream
archive, the pushed events the processor had applied when the row was answered
(:class:`ReplayedReader`), each counted by the rule of time at the request time. Per feature, the
served value against that one. A row is unsettled (not compared) while one of its keys' pushed
events was being applied; rows before the output's cut were served from an earlier output.
The fit and vocabularies are the output's: check the log of the output that served it (the
ids a newer output numbered were out of vocabulary when served).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from featureline.api.model_inputs import ServedInputs
from featureline.api.vocabulary import Vocabularies
from featureline.core.aggregations import (
    GroupSpec,
    PushedEvent,
    accepted_events,
    applied_events,
    event_filter,
    pushed_by_key,
    value_at,
)
from featureline.core.metadata import Metadata, read_metadata
from featureline.feature_store.consistency import (
    FeatureConsistency,
    StreamExpectation,
    feature_consistency,
)
from featureline.feature_store.feature_log import INPUT_PREFIX, INPUTS_CONTEXT, quoted

# How the report names the model inputs' rows (where the others name an entity).
ENTITY = "model-inputs"


class Unsettled(Exception):
    """A key's pushed event was being applied at the request time."""


class ReplayedReader:
    """What :class:`OnlineReader` reads from the tiles — each group's outputs at a moment —
    read event by event: the rule of time itself (``value_at``)."""

    def __init__(self, metadata: Metadata, wanted: Mapping[str, set[tuple[str, ...]]],
                 pushed: Sequence[PushedEvent]) -> None:
        assert metadata.tiles is not None and metadata.events is not None
        self.groups: dict[str, GroupSpec] = {g.name: g for g in metadata.tiles.groups}
        self.folder = metadata.events_folder()
        self.batch = {name: accepted_events(self.folder, self.groups[name], keys)
                      for name, keys in wanted.items() if keys}
        self.loaded = {name: set(keys) for name, keys in wanted.items()}
        self.pushed = {name: pushed_by_key(group, pushed, metadata.tiles.cut_us)
                       for name, group in self.groups.items()}
        self.outputs = {name: {f.output: f for f in group.outputs()}
                        for name, group in self.groups.items()}
        self.keeps = {name: {f.output: event_filter(f.spec, metadata.events)
                             for f in group.outputs()} for name, group in self.groups.items()}
        self.touched = False  # whether a read met a key that pushed events changed

    # When the row was answered (Unix seconds): the pushed events applied by then count.
    served_at = 0.0

    def read(self, references: list[tuple[str, str]], entities: Mapping[str, Sequence[Any]],
             at_us: int) -> Any:
        values: dict[str, list[Any]] = {}
        for name, output in references:
            group = self.groups[name]
            column = []
            for own in zip(*(entities[key] for key in group.keys), strict=True):
                if own not in self.loaded.setdefault(name, set()):  # keyed by an attribute
                    self.batch.setdefault(name, {}).update(
                        accepted_events(self.folder, group, {own}))
                    self.loaded[name].add(own)
                pushed = self.pushed.get(name, {}).get(own, ())
                applied = applied_events(pushed, self.served_at)
                if applied is None:
                    raise Unsettled()
                self.touched |= bool(pushed)
                events = [*self.batch.get(name, {}).get(own, ()), *applied]
                column.append(value_at(self.outputs[name][output], events, at_us,
                                       self.keeps[name][output]))
            values[f"{name}:{output}"] = column
        return _Read(values)


class _Read:
    def __init__(self, values: dict[str, list[Any]]) -> None:
        self.values, self.names = values, list(values)


def compare_inputs(connection: duckdb.DuckDBPyConnection, columns: set[str], *,
                   output: str | Path, expected: StreamExpectation | None = None,
                   top: int = 5) -> list[FeatureConsistency]:
    """Per model input the log holds (the ``log`` view of ``connection``), the served values
    against the recomputed ones; none when the log holds no model inputs."""
    metadata = read_metadata(output)
    served = ServedInputs.of(output, metadata)
    names = [f["name"] for f in served.features] if served is not None else []
    names = [n for n in names if f"{INPUT_PREFIX}{n}" in columns]
    if served is None or not names or INPUTS_CONTEXT not in columns:
        return []
    logged = connection.execute(
        "SELECT user_id, item_id, epoch_us(request_time) AS __time, "
        f"{INPUTS_CONTEXT}, " + ", ".join(quoted(f"{INPUT_PREFIX}{n}") for n in names)
        + f" FROM log WHERE {quoted(INPUTS_CONTEXT)} IS NOT NULL "
        f"AND epoch_us(request_time) >= {served.cut_us}").fetch_arrow_table()
    rows = logged.to_pylist()
    requests = [orjson.loads(row[INPUTS_CONTEXT]) for row in rows]
    reader = ReplayedReader(metadata, _wanted(metadata, rows, requests),
                            expected.pushed_events() if expected is not None else ())
    vocabularies = Vocabularies.from_output(output)
    offline: dict[str, list[Any]] = {name: [] for name in names}
    settled, streamed = [], []
    for row, request in zip(rows, requests, strict=True):
        reader.touched, reader.served_at = False, request["served_at"]
        try:
            features, _ = served.answer(
                reader, vocabularies, row["user_id"], [row["item_id"]], request["context"],
                {c: [v] for c, v in request["item_context"].items()}, row["__time"])
        except Unsettled:
            features = None
        settled.append(features is not None)
        streamed.append(reader.touched or features is None)
        for name in names:
            offline[name].append(None if features is None else features[name].tolist()[0])
    table = pa.table({
        "__key": [f"{r['user_id']}|{r['item_id']}" for r in rows],
        "__row": list(range(len(rows))), "__settled": settled, "__streamed": streamed,
        "__offline": settled})
    for name in names:  # named as the log names them: input:<feature>
        column = f"{INPUT_PREFIX}{name}"
        kind = logged.schema.field(column).type
        table = table.append_column(f"served:{column}", logged[column])
        table = table.append_column(f"status:{column}", pa.array(["present"] * len(rows)))
        table = table.append_column(f"offline:{column}", pa.array(offline[name], kind))
    connection.register("__inputs", table)
    connection.execute("CREATE OR REPLACE TEMP TABLE joined AS SELECT * FROM __inputs")
    connection.unregister("__inputs")
    reports = []
    for name in names:
        column = f"{INPUT_PREFIX}{name}"
        kind = logged.schema.field(column).type
        numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind)
        reports.append(feature_consistency(connection, ENTITY, column, numeric, top))
    return reports


def _wanted(metadata: Metadata, rows: list[dict[str, Any]], requests: list[dict[str, Any]]
            ) -> dict[str, set[tuple[str, ...]]]:
    """Per group, the keys the logged requests read: its key columns' values from the
    request's ids and columns (a group keyed by an attribute the request did not send reads
    each key's events when it first meets it)."""
    assert metadata.tiles is not None
    wanted: dict[str, set[tuple[str, ...]]] = {}
    for group in metadata.tiles.groups:
        keys: set[tuple[str, ...]] = set()
        for row, request in zip(rows, requests, strict=True):
            given = {"user_id": row["user_id"], "item_id": row["item_id"],
                     **request["context"], **request["item_context"]}
            if all(key in given for key in group.keys):
                keys.add(tuple(str(given[key]) for key in group.keys))
        wanted[group.name] = keys
    return wanted
