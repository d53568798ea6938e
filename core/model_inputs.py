"""The model's input at a request time: each example feature's Python half, over the published
output (docs/ARCHITECTURE.md, "Model inputs").

The ETL writes every example feature with Spark. For each one, its op also records in
metadata.json (``inputs``) how the same value is computed for a candidate at a request time
— a :class:`Source`:

- ``id``, ``count``, ``target``: the raw value's id, count or target encoding from the fit's
  artifacts (an unseen value: out of vocabulary, 0, the prior);
- ``value``, ``since``, ``ids``: an output of the aggregation engine at the request time,
  from the tiles the ETL wrote and the stream keeps — as is, as seconds since the time it
  holds, or as ids (a last item, the last K items);
- ``cyclic``, ``cross``, ``normalize``: the request time's hour and weekday, a hashed cross of
  raw values, a continuous raw value filled and standardised;
- ``derive``: an expression (``core.derive``) over the features before it, engine outputs
  and raw numbers, evaluated over the candidates.

The engine groups below hold what those read of a user's, a pair's and an item's earlier
events; the ETL writes their tiles with the others. Then each continuous feature gets its
model-ready transform (``core.transforms``), and the rows are laid out as the TFRecords hold
them. An op that records no source is named under ``unserved``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

import numpy as np
from pydantic import Field

from featureline.core.aggregations import INPUTS_PREFIX, LABEL, FeatureSpec, GroupSpec
from featureline.core.derive import NumpyBackend, evaluate, parsed, references
from featureline.core.errors import UnprocessableError
from featureline.core.ids import FIRST_ID, OOV_ID, PADDING_ID
from featureline.core.operations import XXHASH_SEED
from featureline.core.settings import Settings
from featureline.core.time_rule import MICROS
from featureline.core.transforms import TRANSFORMS, apply_rows

# The engine groups of the features of earlier events, by their keys.
USER_INPUTS = f"{INPUTS_PREFIX}user"
PAIR_INPUTS = f"{INPUTS_PREFIX}pair"
ITEM_INPUTS = f"{INPUTS_PREFIX}item"
INPUT_GROUP_KEYS = {USER_INPUTS: ("user_id",), PAIR_INPUTS: ("user_id", "item_id"),
                    ITEM_INPUTS: ("item_id",)}

# cyclic_time's periods: the hour of the day and the day of the week (Monday 0), UTC, and
# how many of each make a circle.
Period = Literal["hour", "dow"]
PERIODS: dict[Period, int] = {"hour": 24, "dow": 7}
SourceKind = Literal["id", "count", "target", "value", "since", "ids", "cyclic", "cross",
                     "normalize", "derive"]
# The most ids a multi-valued column's feature holds: later values are left out.
MAX_LIST_WIDTH = 64


class Source(Settings):
    """How one example feature is computed at a request time."""

    kind: SourceKind
    # The raw column read (id, count, target, normalize; ids: the vocabulary's column).
    column: str | None = None
    # The engine output read (value, since, ids): its group and name.
    group: str | None = None
    output: str | None = None
    # cross: the raw columns hashed, and into how many buckets.
    columns: list[str] = Field(default_factory=list)
    buckets: int | None = None
    # cyclic: which period, and which function of its angle.
    period: Period | None = None
    fn: Literal["sin", "cos"] | None = None
    # ids: how many (a last item: 1, unpadded); id of a multi-valued column: how many.
    width: int | None = None
    # id: a multi-valued column's separator (its feature the ids of its values, padded).
    separator: str | None = None
    # derive: the expression (core.derive), over the features before it, the candidates' raw
    # columns and the engine's outputs.
    expr: str | None = None

    @property
    def reference(self) -> str | None:
        """``<group>:<output>``, as the online reader names an engine output."""
        return None if self.group is None else f"{self.group}:{self.output}"


@dataclass
class Served:
    """What one op serves: a source per feature, and the engine features it reads per input
    group."""

    features: dict[str, Source] = field(default_factory=dict)
    groups: dict[str, list[FeatureSpec]] = field(default_factory=dict)


class ModelInputs(Settings):
    """metadata.json's ``inputs``: the input groups, every served feature's source, and the
    features no op can serve."""

    groups: list[GroupSpec] = Field(default_factory=list)
    features: dict[str, Source] = Field(default_factory=dict)
    unserved: list[str] = Field(default_factory=list)


def combined(served: Sequence[Served], unserved: Sequence[str] = ()) -> ModelInputs:
    """The ops' sources, and their engine features grouped by input group (each listed
    once)."""
    features: dict[str, Source] = {}
    by_group: dict[str, dict[str, FeatureSpec]] = {}
    for one in served:
        features.update(one.features)
        for group, specs in one.groups.items():
            for spec in specs:
                by_group.setdefault(group, {})[spec.model_dump_json()] = spec
    groups = [GroupSpec(name=name, keys=list(INPUT_GROUP_KEYS[name]),
                        features=list(by_group[name].values()))
              for name in INPUT_GROUP_KEYS if by_group.get(name)]
    return ModelInputs(groups=groups, features=features, unserved=list(unserved))


def attribute_sources(roles: Mapping[str, str]) -> Served:
    """The user and item attributes (``etl.source.roles``) as the last value their entity's
    earlier events carried: what a request does not override is served from these."""
    groups: dict[str, list[FeatureSpec]] = {}
    for column, role in roles.items():
        group = {"user": USER_INPUTS, "item": ITEM_INPUTS}.get(role)
        if group is not None:
            groups.setdefault(group, []).append(
                FeatureSpec(op="last", column=column, name=attribute_name(column)))
    return Served(groups=groups)


def attribute_name(column: str) -> str:
    """The input group's output holding an attribute's latest value."""
    return f"attr_{column}"


# --- the Python halves --------------------------------------------------------------------


@dataclass
class Candidates:
    """One request's candidates: the request time (µs), each raw column's value per candidate
    (ids, request columns, attributes) and each engine output's value per candidate."""

    at_us: int
    raw: dict[str, list[Any]]
    engine: dict[str, list[Any]]

    @property
    def size(self) -> int:
        return len(self.raw["item_id"])


@dataclass
class Fitted:
    """What the published output's fit serves: per column the encodings' tables (value →
    count, value → target encoding), the target encoding's prior, and an encoder of raw
    values to ids (the served vocabularies)."""

    counts: dict[str, dict[str, float]]
    targets: dict[str, dict[str, float]]
    prior: float
    encode: Callable[[str, list[Any]], list[int]]


def _ids(fitted: Fitted, column: str, values: list[Any], missing: int = PADDING_ID
         ) -> list[int]:
    """Ids of raw values (None: ``missing``), each distinct value encoded once (the user's
    id, a request column: once per request)."""
    distinct = [v for v in dict.fromkeys(values) if v is not None]
    encoded = dict(zip(distinct, fitted.encode(column, [str(v) for v in distinct]),
                       strict=True))
    return [missing if v is None else encoded[v] for v in values]


def _id_lists(fitted: Fitted, column: str, lists: list[tuple[Any, ...]], width: int,
              missing: int = PADDING_ID) -> list[list[int]]:
    """The ids of each list's values (None: ``missing``), its first ``width``, padded; each
    distinct list encoded once (a user's history is every candidate's)."""
    distinct = list(dict.fromkeys(lists))
    flat = _ids(fitted, column, [x for one in distinct for x in one], missing)
    padded, at = {}, 0
    for one in distinct:
        ids = flat[at:at + len(one)][:width]
        at += len(one)
        padded[one] = ids + [PADDING_ID] * (width - len(ids))
    return [padded[one] for one in lists]


def list_values(text: str, separator: str) -> list[str]:
    """A multi-valued column's values: the texts between its separators, spaces trimmed,
    empty ones left out (as ``etl.features.categorify.list_values`` reads the events)."""
    return [one for one in (part.strip(" ") for part in text.split(separator)) if one]


@functools.lru_cache(maxsize=65_536)
def xxhash64_spark(values: tuple[Any, ...]) -> int:
    """Spark's ``xxhash64`` of text values (seed 42, each value's UTF-8 bytes hashed with the
    running hash as seed; nulls skipped), as a signed 64-bit integer."""
    import xxhash

    hashed = XXHASH_SEED
    for value in values:
        if value is not None:
            hashed = xxhash.xxh64_intdigest(str(value).encode(), seed=hashed & (2**64 - 1))
            hashed = hashed - 2**64 if hashed >= 2**63 else hashed
    return hashed


def _angle(at_us: int, period: Period) -> float:
    moment = datetime.fromtimestamp(at_us / MICROS, timezone.utc)
    position = moment.hour if period == "hour" else moment.weekday()
    return position * (2 * math.pi / PERIODS[period])


def raw_value(source: Source, candidates: Candidates, fitted: Fitted,
              transform: Mapping[str, Any] | None) -> Any:
    """One feature's value per candidate before the model-ready transform: a list, or an
    array (the engine's values and the seconds since them: float64, NaN where missing)."""
    n, raw, engine = candidates.size, candidates.raw, candidates.engine
    kind = source.kind
    if kind == "id" and source.separator is not None:  # a list: its values' ids, padded
        return _id_lists(fitted, source.column or "", [
            () if v is None else tuple(list_values(str(v), source.separator))
            for v in raw[source.column or ""]], source.width or 1, OOV_ID)
    if kind == "id":  # categorify: a missing value is out of vocabulary
        return _ids(fitted, source.column or "", raw[source.column or ""], OOV_ID)
    if kind in ("count", "target"):
        table = (fitted.counts if kind == "count" else fitted.targets)[source.column or ""]
        default = 0.0 if kind == "count" else fitted.prior
        return [table.get(str(v), default) if v is not None else default
                for v in raw[source.column or ""]]
    if kind == "value":  # float64, NaN where the engine has no value
        return np.array(engine[source.reference or ""], dtype=np.float64)
    if kind == "since":
        held = np.array(engine[source.reference or ""], dtype=np.float64)  # µs: exact
        return (candidates.at_us - held) / MICROS
    if kind == "ids":
        values = engine[source.reference or ""]
        if source.width is None:  # one id
            return _ids(fitted, source.column or "", values)
        return _id_lists(fitted, source.column or "", [tuple(v or ()) for v in values],
                         source.width)
    if kind == "cyclic":
        angle = _angle(candidates.at_us, source.period or "hour")
        return [math.sin(angle) if source.fn == "sin" else math.cos(angle)] * n
    if kind == "cross":
        buckets = source.buckets or 1
        return [xxhash64_spark(values) % buckets + FIRST_ID
                for values in zip(*(raw[c] for c in source.columns), strict=True)]
    assert kind == "normalize" and transform is not None
    filled = [transform["fill"] if v is None else float(v) for v in raw[source.column or ""]]
    shaped = np.asarray(filled, dtype=np.float64)
    if transform.get("log1p"):
        shaped = np.log1p(np.maximum(shaped, 0.0))
    return ((shaped - transform["mean"]) / transform["std"]).astype(np.float32)


def derived_value(expr: str, candidates: Candidates, features: Mapping[str, Any]
                  ) -> np.ndarray:
    """A derived feature per candidate (float64, NaN where missing): its expression over the
    ``features`` computed before it (their values before the model-ready step), the engine's
    outputs (``group:output``) and the candidates' raw columns."""
    tree = parsed(expr)
    values = {}
    for name in references(tree):
        found = (features[name] if name in features else
                 candidates.engine[name] if ":" in name else candidates.raw[name])
        try:
            values[name] = np.array(found, dtype=np.float64)  # None: NaN
        except (TypeError, ValueError):
            raise UnprocessableError(name, f"{name}: a derived feature reads it as a number, "
                                           f"not {found!r}") from None
    value = evaluate(tree, NumpyBackend(values, candidates.at_us))
    return np.broadcast_to(value, (candidates.size,)).astype(np.float64)


def model_inputs(inputs: ModelInputs, features: Sequence[Mapping[str, Any]],
                 candidates: Candidates, fitted: Fitted) -> dict[str, np.ndarray]:
    """Every served feature per candidate, as the examples hold it after the model-ready
    step (``features``: metadata.json's, in their order): an array with a row per candidate
    — int64 ids ([n], or [n, k] for a list), float32 values. A missing indicator follows its
    feature's raw value. The continuous features' transforms run on one matrix."""
    raw: dict[str, Any] = {}
    out: dict[str, np.ndarray] = {}
    shaped: list[tuple[str, np.ndarray, dict[str, Any]]] = []  # transformed together
    for feature in features:
        name = feature["name"]
        transform = feature.get("transform") or {}
        if transform.get("name") == "missing_indicator":
            out[name] = _missing(raw[transform["of"]])
            continue
        source = inputs.features.get(name)
        if source is None:
            continue
        if source.kind == "derive":  # reads the features before it
            values = raw[name] = derived_value(source.expr or "", candidates, raw)
        else:
            values = raw[name] = raw_value(source, candidates, fitted, transform)
        if feature["kind"] != "continuous":
            out[name] = np.asarray(values, dtype=np.int64)
        elif source.kind == "normalize":
            out[name] = np.asarray(values, dtype=np.float32)
        else:
            out[name] = np.empty(0, dtype=np.float32)  # its place in the order, filled below
            shaped.append((name, np.asarray(values, dtype=np.float64), transform))
    known = [s for s in shaped if s[2].get("name") in TRANSFORMS]
    if known:
        rows = apply_rows(np.vstack([values for _, values, _ in known]),
                          [transform for _, _, transform in known])
        out.update((name, row) for (name, _, _), row in zip(known, rows, strict=True))
    out.update((name, values.astype(np.float32)) for name, values, transform in shaped
               if transform.get("name") not in TRANSFORMS)
    return out


def _missing(values: Any) -> np.ndarray:
    """The 0/1 missing indicator of a feature's raw values (None, or NaN in an array)."""
    if isinstance(values, np.ndarray) and values.dtype.kind == "f":
        return np.isnan(values).astype(np.float32)
    return np.array([v is None for v in values], dtype=np.float32)


def tfrecord_groups(groups: Mapping[str, Mapping[str, Any]], values: Mapping[str, np.ndarray]
                    ) -> dict[str, np.ndarray]:
    """The rows laid out as the TFRecords' groups (metadata.json ``tfrecord.groups``): per
    group, a row per candidate of its columns' values in order (a list feature's all of
    them); the label's group is left out."""
    laid_out = {}
    for name, group in groups.items():
        columns = group["columns"]
        if LABEL in columns or any(c not in values for c in columns):
            continue
        laid_out[name] = np.hstack([values[c].reshape(len(values[c]), -1) for c in columns])
    return laid_out
