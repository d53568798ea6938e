"""``POST /v1/model-inputs``' work: the published output's recipe for every example feature
(``core.model_inputs``), its fit's encodings, and the request's candidates turned into the
model's input (docs/ARCHITECTURE.md, "Model inputs")."""

from __future__ import annotations

import functools
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow.parquet as pq

from featureline.api.vocabulary import Vocabularies
from featureline.core.derive import parsed, references
from featureline.core.errors import NotFoundError, UnavailableError, UnprocessableError
from featureline.core.metadata import Metadata
from featureline.core.model_inputs import (
    ITEM_INPUTS,
    USER_INPUTS,
    Candidates,
    Fitted,
    ModelInputs,
    attribute_name,
    model_inputs,
    tfrecord_groups,
)

ARTIFACTS = "artifacts"


class ModelInputsError(UnprocessableError):
    """A model-inputs request the published output cannot answer as asked."""


def check_request_time(at_us: int, cut_us: int) -> None:
    """A request time before the published output's cut (its latest event) is a 422: its
    tiles hold later events."""
    if at_us < cut_us:
        cut = datetime.fromtimestamp(cut_us / 1_000_000, timezone.utc).isoformat()
        raise ModelInputsError("at", f"at: before the published output's latest event ({cut}):"
                                     " its tiles hold later events")


class NoModelInputsError(NotFoundError):
    """The served output records no model inputs (an ETL output written before them)."""

    def __init__(self) -> None:
        super().__init__("the served ETL output records no model inputs (metadata.json "
                         "'inputs'): run the ETL again and publish it")


def _table(output: Path, name: str, column: str) -> dict[str, float]:
    """An encoding's artifact table (``count_encode/<column>``…): value → number."""
    table = pq.read_table(output / ARTIFACTS / name, columns=["value", column])
    return {str(value): float(number) for value, number in zip(
        table["value"].to_pylist(), table[column].to_pylist(), strict=True)}


class EngineReader(Protocol):
    """Where the engine's outputs at a moment come from: the online store's tiles
    (``OnlineReader``), or events read one by one (``api.inputs_consistency``)."""

    @property
    def groups(self) -> Mapping[str, Any]:
        """Each group by name (its ``keys`` are read)."""

    def read(self, references: list[tuple[str, str]], entities: Mapping[str, Sequence[Any]],
             at_us: int) -> Any: ...


class AsyncEngineReader(EngineReader, Protocol):
    """An :class:`EngineReader` whose reads can be awaited (the online store's)."""

    async def read_async(self, references: list[tuple[str, str]],
                         entities: Mapping[str, Sequence[Any]], at_us: int) -> Any: ...


@dataclass(frozen=True)
class ServedInputs:
    """What the API reads of a published output to serve the model's input."""

    inputs: ModelInputs
    # metadata.json's features, in order, and its TFRecord groups.
    features: list[dict[str, Any]]
    groups: dict[str, dict[str, Any]]
    # Each raw column's role (request, user, item, outcome).
    roles: Mapping[str, str]
    # After the output's latest event (µs): the earliest request time served.
    cut_us: int
    counts: dict[str, dict[str, float]]
    targets: dict[str, dict[str, float]]
    prior: float

    @classmethod
    def of(cls, output: str | Path, metadata: Metadata) -> ServedInputs | None:
        """None where the output records no inputs (written before they were served)."""
        if metadata.inputs is None or metadata.tiles is None or metadata.tfrecord is None:
            return None
        output = Path(output)
        sources = metadata.inputs.features.values()
        counts = {s.column: _table(output, f"count_encode/{s.column}", "count")
                  for s in sources if s.kind == "count" and s.column}
        targets = {s.column: _table(output, f"target_encode/{s.column}", "encoding")
                   for s in sources if s.kind == "target" and s.column}
        prior = float(metadata.artifacts.get("target_encode", {}).get("prior", 0.0))
        roles = dict(metadata.events.roles) if metadata.events else {}
        return cls(metadata.inputs, [f.model_dump(mode="json", exclude_none=True)
                                     for f in metadata.features],
                   {name: group.model_dump(mode="json")
                    for name, group in metadata.tfrecord.groups.items()},
                   roles, metadata.tiles.cut_us, counts, targets, prior)

    def columns_with(self, role: str) -> list[str]:
        return self._by_role.get(role, [])

    @functools.cached_property
    def _by_role(self) -> dict[str, list[str]]:
        by_role: dict[str, list[str]] = {}
        for column, role in self.roles.items():
            by_role.setdefault(role, []).append(column)
        return by_role

    @functools.cached_property
    def _required_context(self) -> list[str]:
        """The request columns the sources read: every request sends them."""
        read = {s.column for s in self.inputs.features.values()
                if s.kind in ("id", "count", "target", "normalize") and s.column}
        read |= {c for s in self.inputs.features.values() for c in s.columns}
        read |= set(self._derived_references)
        return sorted(read & set(self.columns_with("request")))

    @functools.cached_property
    def _derived_references(self) -> list[str]:
        """What the derived features read: features, raw columns, ``group:output``."""
        return sorted({name for s in self.inputs.features.values() if s.kind == "derive"
                       for name in references(parsed(s.expr or ""))})

    def answer(self, reader: EngineReader, vocabularies: Vocabularies, user: str,
               items: list[str], context: Mapping[str, Any],
               item_context: Mapping[str, Sequence[Any]], at_us: int
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The features per candidate and the TFRecord groups' rows (arrays with a row
        per candidate)."""
        steps = self._answering(reader.groups, vocabularies, user, items, context,
                                item_context, at_us)
        try:
            wanted = next(steps)
            while True:
                wanted = steps.send(_outputs(reader.read(*wanted, at_us)))
        except StopIteration as done:
            return done.value

    async def answer_async(self, reader: AsyncEngineReader, vocabularies: Vocabularies,
                           user: str, items: list[str], context: Mapping[str, Any],
                           item_context: Mapping[str, Sequence[Any]], at_us: int
                           ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """:meth:`answer` for a caller on an event loop: the engine's reads are awaited."""
        steps = self._answering(reader.groups, vocabularies, user, items, context,
                                item_context, at_us)
        try:
            wanted = next(steps)
            while True:
                wanted = steps.send(_outputs(await reader.read_async(*wanted, at_us)))
        except StopIteration as done:
            return done.value

    def _answering(self, groups: Mapping[str, Any], vocabularies: Vocabularies, user: str,
                   items: list[str], context: Mapping[str, Any],
                   item_context: Mapping[str, Sequence[Any]], at_us: int
                   ) -> Generator[Wanted, dict[str, list[Any]],
                                  tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
        """:meth:`answer` without its reads: yields the engine outputs wanted and the
        entities keying them, is sent their values. One implementation for both drivers."""
        self._check(items, context, item_context, at_us)
        n = len(items)
        raw: dict[str, list[Any]] = {"user_id": [user] * n, "item_id": list(items)}
        raw.update({column: [value] * n for column, value in context.items()})
        now, later = self._references(groups, raw)
        engine = yield now, _entities(groups, now, raw)
        for column in self.columns_with("user"):
            if column not in context:
                raw[column] = engine.get(f"{USER_INPUTS}:{attribute_name(column)}", [None] * n)
        for column in self.columns_with("item"):
            raw[column] = (list(item_context[column]) if column in item_context else
                           engine.get(f"{ITEM_INPUTS}:{attribute_name(column)}", [None] * n))
        if later:  # keyed by attributes: read once those are known
            engine.update((yield later, _entities(groups, later, raw)))
        fitted = Fitted(self.counts, self.targets, self.prior, vocabularies.encode)
        values = model_inputs(self.inputs, self.features, Candidates(at_us, raw, engine), fitted)
        return values, tfrecord_groups(self.groups, values)

    def _check(self, items: list[str], context: Mapping[str, Any],
               item_context: Mapping[str, Sequence[Any]], at_us: int) -> None:
        check_request_time(at_us, self.cut_us)
        allowed = {*self.columns_with("request"), *self.columns_with("user")}
        for column in context:
            if column not in allowed:
                raise ModelInputsError(f"context.{column}", f"context.{column}: not a request "
                                       f"column or user attribute (known: {sorted(allowed)})")
        for column, values in item_context.items():
            if column not in self.columns_with("item"):
                raise ModelInputsError(f"item_context.{column}", f"item_context.{column}: not "
                                       f"an item attribute (known: "
                                       f"{sorted(self.columns_with('item'))})")
            if len(values) != len(items):
                raise ModelInputsError(f"item_context.{column}", f"item_context.{column}: "
                                       f"{len(values)} values for {len(items)} candidates")
        for column in self._required_context:
            if column not in context:
                raise ModelInputsError(f"context.{column}", f"context.{column}: a request "
                                       f"column the model's features read; send it")

    @functools.cached_property
    def _input_references(self) -> list[tuple[str, str]]:
        """Every output of the input groups."""
        return [(group.name, output.output) for group in self.inputs.groups
                for output in group.outputs()]

    @functools.cached_property
    def _aggregation_references(self) -> list[tuple[str, str]]:
        """The aggregation groups' outputs the features read."""
        inputs = {group.name for group in self.inputs.groups}
        read = [(s.group, s.output) for s in self.inputs.features.values()
                if s.group is not None and s.output is not None]
        read += [(group, output) for group, _, output in
                 (name.partition(":") for name in self._derived_references) if output]
        return list(dict.fromkeys(
            (group, output) for group, output in read if group not in inputs))

    def _references(self, groups: Mapping[str, Any], raw: Mapping[str, list[Any]]
                    ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """The engine outputs of every group keyed by columns the request gives (the input
        groups, aggregations keyed by the ids or request columns: one round trip; the user's
        keys read once), and the aggregations left, keyed by attributes."""
        for group, _ in self._aggregation_references:
            if group not in groups:
                raise UnavailableError(f"the online store serves no group {group!r}: publish "
                                       f"the output again")
        now: list[tuple[str, str]] = list(self._input_references)
        later: list[tuple[str, str]] = []
        for reference in self._aggregation_references:
            keys = groups[reference[0]].keys
            (now if all(key in raw for key in keys) else later).append(reference)
        return now, later


# An engine read: the outputs wanted (group, output) and the entities keying them.
Wanted = tuple[list[tuple[str, str]], dict[str, list[Any]]]


def _entities(groups: Mapping[str, Any], references: list[tuple[str, str]],
              raw: Mapping[str, list[Any]]) -> dict[str, list[Any]]:
    keys = {key for group, _ in references for key in groups[group].keys}
    return {key: [None if v is None else str(v) for v in raw[key]] for key in keys}


def _outputs(result: Any) -> dict[str, list[Any]]:
    """An engine read's values by ``<group>:<output>``."""
    return {name: result.values[name] for name in result.names}
