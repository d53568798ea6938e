"""Request and response bodies: the OpenAPI document built from them is the API's contract."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Status = Literal["present", "not_found", "outside_ttl"]
EntityId = str | int
INT64 = Field(ge=-(2**63), le=2**63 - 1)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FeaturesRequest(_Body):
    """A feature service or a list of ``view:feature`` references, for rows of entity ids."""

    service: str | None = Field(default=None, examples=["ranking"])
    features: list[str] | None = Field(default=None, min_length=1,
                                       examples=[["user_features:user_events"]])
    # Join key (``user_id``) → raw ids, or encoded-id feature (``user_id_cat``) → encoded ids;
    # every list has one id per row.
    entities: dict[str, list[EntityId]] = Field(
        min_length=1, examples=[{"user_id": ["u1", "u2"], "item_id": ["i7", "i9"]}])

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
    names: list[str]
    # Feature name → one value per row (null when not found).
    values: dict[str, list[Any]]
    status: dict[str, list[Status]]


class LookupRequest(_Body):
    model: str = Field(examples=["ranker"])
    table: str = Field(examples=["item"])
    keys: list[int] = Field(min_length=1, examples=[[2, 3, 2]])

    @model_validator(mode="after")
    def _keys_are_int64(self) -> LookupRequest:
        for index, key in enumerate(self.keys):
            if not -(2**63) <= key < 2**63:
                raise ValueError(f"keys[{index}]: {key} is outside int64")
        return self


class LookupResponse(BaseModel):
    model: str
    table: str
    dim: int
    vectors: list[list[float]]


class RankingInputsRequest(_Body):
    user_id: EntityId = Field(examples=["u1"])
    item_ids: list[EntityId] = Field(min_length=1, examples=[["i7", "i9"]])


class EntityFeatures(BaseModel):
    ids: list[EntityId]
    # Encoded with the ETL's vocabulary (1: out of vocabulary).
    encoded_ids: list[int]
    values: dict[str, list[Any]]
    status: dict[str, list[Status]]


class Embeddings(BaseModel):
    table: str
    dim: int
    vectors: list[list[float]]


class RankingInputsResponse(BaseModel):
    user: EntityFeatures
    items: EntityFeatures
    # Encoded-id feature (``user_id_cat``) → its vectors, one per id, from the HPS.
    embeddings: dict[str, Embeddings]


class TableInfo(BaseModel):
    name: str
    dim: int
    keys: int
    # The vocabulary version whose ids key the table (None: not declared).
    vocabulary_version: str | None = None
    # The fit of the examples it was trained on (None: not declared).
    fit_version: str | None = None
    cache: dict[str, Any]
    stats: dict[str, Any]


class ModelInfo(BaseModel):
    name: str
    tables: list[TableInfo]


class Versions(BaseModel):
    """Which data each part serves: the API's vocabularies, what the online store was last
    published with, what the embedding tables were built for."""

    dataset_version: str
    vocabularies: dict[str, str]
    online_store: dict[str, Any] | None
    embeddings: dict[str, str | None]
    # The fit of the API's data, and the fit each embedding table was trained on.
    fit: str | None = None
    embedding_fits: dict[str, str | None] = {}
    # What disagrees; empty when every part encodes ids alike.
    problems: list[str] = []


class ModelsResponse(BaseModel):
    models: list[ModelInfo]
    versions: Versions


class ReloadResponse(BaseModel):
    model: str
    rows: dict[str, int]
    # API processes (every worker of every pod) that heard the reload, this one included.
    workers: int


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, bool] = {}
    # The parameter server's lower tiers: L3 down is not ready; L2 down is served from L1/L3.
    tiers: dict[str, bool] | None = None
    versions: Versions | None = None


class ErrorBody(BaseModel):
    error: str
    message: str
    field: str | None = None
    limit: int | None = None


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of a route that answers ``statuses`` with an ErrorBody."""
    return {status: {"model": ErrorBody} for status in statuses}


class PushRequest(_Body):
    """Raw events in the raw log's schema (``user_id``, ``item_id``, ``event_type``, ``ts``,
    ``value``, context columns); each is validated as the ETL validates a log row."""

    events: list[Any] = Field(min_length=1, examples=[[
        {"user_id": "u1", "item_id": "i7", "event_type": "click",
         "ts": "2026-01-05T10:00:00Z", "value": 1.0, "category": "c3", "device": "mobile",
         "price": 9.5}]])


class Rejected(BaseModel):
    index: int
    # The ETL's quarantine reason code (malformed_record, missing_user_id, bad_timestamp, …).
    reason: str
    field: str | None = None


class PushResponse(BaseModel):
    accepted: int
    rejected: list[Rejected]
