"""Request and response bodies: the OpenAPI document built from them is the API's contract."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictStr,
    WithJsonSchema,
    field_validator,
    model_validator,
)

# The request times the API answers for: from the epoch to before 2100, as the ETL keeps
# events (a time near the year 10000 has no UTC date).
EARLIEST_AT = datetime(1970, 1, 1, tzinfo=timezone.utc)
LATEST_AT = datetime(2100, 1, 1, tzinfo=timezone.utc)
AT_RULE = ("ISO 8601 with a time zone or UTC; from 1970-01-01 to before 2100-01-01, and not "
           "before the published output's latest event (a 422 says which).")


def _is_unicode(text: str) -> bool:
    """Text every store and log can hold: no lone UTF-16 surrogate (``"\\ud800"``, valid
    JSON but not Unicode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _unicode(value: str) -> str:
    if not _is_unicode(value):
        raise ValueError("not valid Unicode text (a lone surrogate)")
    return value


def _in_range(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    try:
        moment = value.astimezone(timezone.utc) if value.tzinfo else value.replace(
            tzinfo=timezone.utc)
    except OverflowError:
        moment = LATEST_AT
    if not EARLIEST_AT <= moment < LATEST_AT:
        raise ValueError("outside the supported times: 1970-01-01 to before 2100-01-01 UTC")
    return value


Status = Literal["present", "not_found", "outside_ttl"]
# Integers of a request: within ±9e18 (inside int64), bounds a JSON number (a double) holds
# exactly, so a client checking them agrees with the server.
INT_MIN, INT_MAX = -9 * 10**18, 9 * 10**18
_INTEGER = {"type": "integer", "minimum": INT_MIN, "maximum": INT_MAX}


def _integer(value: Any, least: int = INT_MIN) -> int:
    """An integer as JSON Schema reads one: a number without a fraction (``2`` or ``2.0``),
    never a bool or a string."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("an integer")
    if not least <= value <= INT_MAX:
        raise ValueError(f"an integer from {least} to {INT_MAX}")
    return value


def _entity_id(value: Any) -> str | int:
    """An id: text (valid Unicode) or an integer; never a bool, nor a fraction."""
    if isinstance(value, str):
        return _unicode(value)
    try:
        return _integer(value)
    except ValueError:
        raise ValueError(f"an id is a string or an integer from {INT_MIN} to {INT_MAX}"
                         ) from None


def _scalar(value: Any) -> Any:
    """A raw column's value: text, an integer, a finite number, a bool, or null."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("a finite number (not NaN or an infinity)")
    if isinstance(value, float) and not value.is_integer():
        return value
    return _entity_id(value)


# Text of a request: valid Unicode, never a number or a bool coerced to one.
Text = Annotated[StrictStr, AfterValidator(_unicode)]
Int64 = Annotated[int, PlainValidator(_integer), WithJsonSchema(_INTEGER)]
Count = Annotated[int, PlainValidator(lambda value: _integer(value, least=1)),
                  WithJsonSchema({**_INTEGER, "minimum": 1})]
EntityId = Annotated[str | int, PlainValidator(_entity_id),
                     WithJsonSchema({"anyOf": [{"type": "string"}, _INTEGER]})]
Scalar = Annotated[Any, PlainValidator(_scalar), WithJsonSchema({"anyOf": [
    {"type": "string"}, _INTEGER, {"type": "number"}, {"type": "boolean"}, {"type": "null"}]})]
RequestTime = Annotated[datetime | None, AfterValidator(_in_range)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FeaturesRequest(_Body):
    """A feature service or a list of ``view:feature`` references, for rows of entity ids."""

    # Exactly one of service and features (the other absent or null), declared.
    model_config = ConfigDict(extra="forbid", json_schema_extra={"oneOf": [
        {"required": ["service"],
         "properties": {"service": {"type": "string"}, "features": {"type": "null"}}},
        {"required": ["features"],
         "properties": {"features": {"type": "array"}, "service": {"type": "null"}}}]})

    service: Text | None = Field(
        default=None, examples=["ranking"],
        description="A Feast feature service whose features to read (or give `features`).")
    features: list[Text] | None = Field(
        default=None, min_length=1, examples=[["user_features:user_events"]],
        description="`view:feature` or `group:feature` references to read (or give "
                    "`service`).")
    entities: dict[Text, list[EntityId]] = Field(
        min_length=1, examples=[{"user_id": ["u1", "u2"], "item_id": ["i7", "i9"]}],
        description="Join key (`user_id`) → raw ids, or encoded-id feature (`user_id_cat`) → "
                    "encoded ids; every list has one id per row.")
    at: RequestTime = Field(
        default=None, examples=["2099-01-05T10:00:00Z"],
        description="The time the values hold at (default: now): the aggregations' request "
                    "time, and the time a view's ttl counts from. " + AT_RULE)

    @model_validator(mode="after")
    def _one_selection_and_equal_rows(self) -> FeaturesRequest:
        if (self.service is None) == (self.features is None):
            raise ValueError("give exactly one of service and features")
        lengths = {key: len(ids) for key, ids in self.entities.items()}
        if len(set(lengths.values())) != 1 or 0 in lengths.values():
            raise ValueError(f"entities: every list needs the same, non-zero length "
                             f"(got {lengths})")
        return self


class FeaturesResponse(BaseModel):
    names: list[str] = Field(description="The features read, in the request's order.")
    values: dict[str, list[Any]] = Field(
        description="Feature name → one value per row (null when not found).")
    status: dict[str, list[Status]] = Field(
        description="Feature name → one status per row: present, not_found, or outside_ttl "
                    "(older than the view's ttl).")


class LookupRequest(_Body):
    model: Text = Field(examples=["ranker"], description="A model the parameter server holds.")
    table: Text = Field(examples=["item"], description="One of the model's embedding tables.")
    keys: list[Int64] = Field(min_length=1, examples=[[2, 3, 2]],
                              description="Encoded ids (int64) to look up; repeats allowed.")


class LookupResponse(BaseModel):
    model: str = Field(description="The model looked up.")
    table: str = Field(description="The table looked up.")
    dim: int = Field(description="The width of each vector.")
    vectors: list[list[float]] = Field(
        description="One float32 vector per key, in the request's order (the table's default "
                    "vector for an unknown key).")


class RankingInputsRequest(_Body):
    user_id: EntityId = Field(examples=["u1"], description="The user's raw id.")
    item_ids: list[EntityId] = Field(min_length=1, examples=[["i7", "i9"]],
                                     description="The candidates' raw ids.")


class ModelInputsRequest(_Body):
    """One user, the candidates, the request's columns: the model's input for each candidate
    at the request time."""

    user_id: EntityId = Field(examples=["u1"], description="The user's raw id.")
    item_ids: list[EntityId] = Field(min_length=1, examples=[["i7", "i9"]],
                                     description="The candidates' raw ids.")
    context: dict[Text, Scalar] = Field(
        default_factory=dict, examples=[{"device": "mobile"}],
        description="Request columns (every one a feature reads), and user attributes that "
                    "override the published ones.")
    item_context: dict[Text, list[Scalar]] = Field(
        default_factory=dict, examples=[{"price": [9.5, 12.0]}],
        description="Item attributes that override the published ones: one value per "
                    "candidate.")
    at: RequestTime = Field(
        default=None, examples=["2099-01-05T10:00:00Z"],
        description="The request time (default: now). " + AT_RULE)


class ModelInputsResponse(BaseModel):
    features: dict[str, list[Any]] = Field(
        description="Feature name (the examples' column) → one value per candidate, as the "
                    "TFRecords hold it: ids as integers (1: out of vocabulary), floats as "
                    "float32 values after the model-ready transform, lists as lists.")
    groups: dict[str, list[list[Any]]] = Field(
        description="TFRecord group (metadata.json `tfrecord.groups`) → one row per "
                    "candidate: its columns' values in the group's order.")
    unserved: list[str] = Field(
        description="Features of ops that cannot be computed at a request time.")
    at: datetime = Field(description="The request time the values hold at.")
    dataset_version: str = Field(description="The published ETL output's version.")
    fit_version: str | None = Field(description="The fit of its statistics.")


class RankRequest(ModelInputsRequest):
    """``/v1/model-inputs``' request, the model to score with and how many to keep."""

    model: Text = Field(examples=["ranker"],
                        description="The model whose tables the parameter server holds.")
    top_k: Count | None = Field(default=None, examples=[10],
                              description="Keep the best this many (default: every one).")
    return_inputs: StrictBool = Field(
        default=False, description="Also return each kept candidate's input row.")


class RankedItem(BaseModel):
    item_id: EntityId = Field(description="The candidate's raw id.")
    score: float = Field(description="The model's score (a probability of the label).")


class RankResponse(BaseModel):
    items: list[RankedItem] = Field(description="The candidates, best first.")
    groups: dict[str, list[list[Any]]] | None = Field(
        default=None, description="With `return_inputs`: each kept candidate's input row, "
                                  "as `/v1/model-inputs`' groups, in the same order.")
    model: str = Field(description="The model scored with.")
    model_version: str = Field(description="Which export of it: a digest of its dense "
                                           "weights and embedding tables.")
    at: datetime = Field(description="The request time the inputs hold at.")
    dataset_version: str = Field(description="The published ETL output's version.")
    fit_version: str | None = Field(description="The fit of its statistics.")


class EntityFeatures(BaseModel):
    ids: list[EntityId] = Field(description="The raw ids, as asked.")
    encoded_ids: list[int] = Field(
        description="Each id encoded with the ETL's vocabulary (1: out of vocabulary).")
    values: dict[str, list[Any]] = Field(
        description="Feature name → one raw value per id: the entity view's features and "
                    "the aggregation groups keyed by this entity alone.")
    status: dict[str, list[Status]] = Field(
        description="Feature name → one status per id: present, not_found, or outside_ttl.")


class Embeddings(BaseModel):
    table: str = Field(description="The embedding table the vectors come from.")
    dim: int = Field(description="The width of each vector.")
    vectors: list[list[float]] = Field(description="One vector per encoded id, in order.")


class RankingInputsResponse(BaseModel):
    user: EntityFeatures = Field(description="The user's features and encoded id.")
    items: EntityFeatures = Field(description="Each candidate's features and encoded id.")
    embeddings: dict[str, Embeddings] = Field(
        description="Encoded-id feature (`user_id_cat`, `item_id_cat`) → its vectors, one per "
                    "id, from the parameter server.")


class TableInfo(BaseModel):
    name: str = Field(description="The table's name.")
    dim: int = Field(description="The width of its vectors.")
    keys: int = Field(description="How many keys it holds.")
    vocabulary_version: str | None = Field(
        default=None, description="The vocabulary version whose ids key the table (null: not "
                                  "declared).")
    fit_version: str | None = Field(
        default=None, description="The fit of the examples it was trained on (null: not "
                                  "declared).")
    cache: dict[str, Any] = Field(description="Its L1 cache: device, capacity, keys held.")
    stats: dict[str, Any] = Field(
        description="Since it loaded: lookups, keys answered by each tier, the L1 hit rate, "
                    "insertions, a latency histogram.")


class ModelInfo(BaseModel):
    name: str = Field(description="The model's name.")
    tables: list[TableInfo] = Field(description="Its embedding tables.")


class Versions(BaseModel):
    """Which data each part serves: the API's vocabularies, what the online store was last
    published with, what the embedding tables were built for."""

    dataset_version: str = Field(description="The ETL output the API serves.")
    vocabularies: dict[str, str] = Field(
        description="Column → the version of the vocabulary the API encodes ids with.")
    online_store: dict[str, Any] | None = Field(
        description="The online store's publication stamp (dataset, time, generation); null: "
                    "not published.")
    embeddings: dict[str, str | None] = Field(
        description="`model/table` → the vocabulary version its ids come from.")
    fit: str | None = Field(default=None, description="The fit of the API's data.")
    embedding_fits: dict[str, str | None] = Field(
        default={}, description="`model/table` → the fit it was trained on.")
    problems: list[str] = Field(
        default=[], description="What disagrees; empty when every part encodes ids alike.")


class ModelsResponse(BaseModel):
    models: list[ModelInfo] = Field(description="Every model the parameter server holds.")
    versions: Versions = Field(description="Which data each part serves.")


class ReloadResponse(BaseModel):
    model: str = Field(description="The model reloaded.")
    rows: dict[str, int] = Field(description="Table → the rows it holds now.")
    workers: int = Field(
        description="API processes (every worker of every pod) that heard the reload, this one "
                    "included.")
    held_ms: float = Field(description="How long this process held /v1/rank while the tables, "
                                       "dense part and vocabularies changed.")


class Health(BaseModel):
    status: Literal["ok", "unavailable"] = Field(description="ok, or unavailable.")
    checks: dict[str, bool] = Field(
        default={}, description="Each readiness check (redis, hps, published, versions, …) and "
                                "whether it passed.")
    tiers: dict[str, bool] | None = Field(
        default=None, description="The parameter server's lower tiers: L3 down is not ready; "
                                  "L2 down is served from L1 and L3.")
    versions: Versions | None = Field(default=None,
                                      description="Which data each part serves.")


class ErrorBody(BaseModel):
    error: str = Field(description="The error's kind: its class name "
                                   "(`UnknownEntityKeyError`, `OnlineStoreEmptyError`, …).")
    message: str = Field(description="What went wrong and what to fix.")
    field: str | None = Field(default=None, description="The request field at fault, if one.")
    limit: int | None = Field(default=None, description="The limit exceeded, if one.")


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of a route that answers ``statuses`` with an ErrorBody."""
    return {status: {"model": ErrorBody} for status in statuses}


class PushRequest(_Body):
    """Raw events in the raw log's schema (``user_id``, ``item_id``, ``event_type``, ``ts``,
    ``value``, context columns); each is validated as the ETL validates a log row."""

    events: list[Any] = Field(min_length=1, examples=[[
        {"user_id": "u1", "item_id": "i7", "event_type": "click",
         "ts": "2026-01-05T10:00:00Z", "value": 1.0, "category": "c3", "device": "mobile",
         "price": 9.5}]], description="The events, each a JSON object; its text valid "
                                       "Unicode (no lone surrogate).")

    @field_validator("events")
    @classmethod
    def _events_are_unicode(cls, events: list[Any]) -> list[Any]:
        for index, event in enumerate(events):
            where = _surrogate_in(event)
            if where is not None:
                raise ValueError(f"events[{index}]{where}: not valid Unicode text (a lone "
                                 f"surrogate)")
        return events


def _surrogate_in(value: Any, where: str = "") -> str | None:
    """Where in a decoded JSON value a text is not valid Unicode (None: nowhere)."""
    if isinstance(value, str):
        return None if _is_unicode(value) else where
    if isinstance(value, dict):
        for key, item in value.items():
            found = _surrogate_in(key, f"{where}.<key>") or _surrogate_in(item, f"{where}.{key}")
            if found is not None:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _surrogate_in(item, f"{where}[{index}]")
            if found is not None:
                return found
    return None


class Rejected(BaseModel):
    index: int = Field(description="The event's place in the request's list.")
    reason: str = Field(
        description="The ETL's quarantine reason code (malformed_record, missing_user_id, "
                    "bad_timestamp, …).")
    field: str | None = Field(default=None, description="The event's field at fault, if one.")


class PushResponse(BaseModel):
    accepted: int = Field(description="How many events were appended to the event log.")
    rejected: list[Rejected] = Field(description="The events refused, with their reasons.")
