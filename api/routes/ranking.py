"""The ranking calls: `/v1/ranking-inputs` (raw entity values and embeddings), `/v1/model-inputs`
(the model's input per candidate) and `/v1/rank` (the candidates scored by the model)."""

from __future__ import annotations

import functools
from datetime import datetime, timezone
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends

from featureline.api.auth import require
from featureline.api.model_inputs import NoModelInputsError, ServedInputs
from featureline.api.models import (
    ModelInputsRequest,
    ModelInputsResponse,
    RankingInputsRequest,
    RankingInputsResponse,
    RankRequest,
    RankResponse,
    error_responses,
)
from featureline.api.responses import FastJSONResponse
from featureline.api.services import Services, get_services
from featureline.core.aggregations import INPUTS_PREFIX
from featureline.core.events import micros_of, utc
from featureline.core.scoring import Ranker
from featureline.feature_store.online import OnlineFeatures

router = APIRouter(prefix="/v1", tags=["ranking"], dependencies=[Depends(require("read"))])
ERRORS = error_responses(401, 403, 404, 413, 422, 503)
SERVICE = "ranking"


def _section(result: OnlineFeatures, names: list[str], ids: list, encoded: list[int]
             ) -> dict[str, Any]:
    """An :class:`EntityFeatures`, as plain JSON."""
    return {"ids": ids, "encoded_ids": encoded, "values": {n: result.values[n] for n in names},
            "status": {n: result.status[n] for n in names}}


@router.post("/ranking-inputs", response_model=RankingInputsResponse, responses=ERRORS)
def ranking_inputs(body: RankingInputsRequest,
                   services: Services = Depends(get_services)) -> FastJSONResponse:
    """The user's and each candidate's features (the ``ranking`` service, and the
    aggregations of the groups keyed by ``user_id`` or by ``item_id`` at the request time),
    their ids encoded with the ETL's vocabularies, and those ids' embeddings from the
    parameter server."""
    settings = services.config.api
    services.check_limit("item_ids", len(body.item_ids), settings.limits.max_entities)
    user, items = str(body.user_id), [str(i) for i in body.item_ids]
    reader = services.reader
    references = reader.references(SERVICE)
    # The aggregations' groups; the model inputs' are /v1/model-inputs' own.
    groups = {key: [(group, name) for group, name in reader.group_references([key])
                    if not group.startswith(INPUTS_PREFIX)] for key in ("user_id", "item_id")}
    result = reader.read([*references, *groups["user_id"], *groups["item_id"]],
                         {"user_id": [user], "item_id": items})
    encoded = {"user_id": services.vocabularies.encode("user_id", [user]),
               "item_id": services.vocabularies.encode("item_id", items)}
    names = {key: [name for view, name in references if reader.views[view].join_key == key]
             + [f"{group}:{name}" for group, name in groups[key]]
             for key in encoded}
    if services.feature_log is not None:
        services.feature_log.log_ranking(user, items, result)
    embeddings = {}
    if services.hps is not None:  # without a parameter server: features and ids only
        server = services.hps
        for feature, table in settings.ranking.tables.items():
            column = services.vocabularies.column_of(feature)
            if column not in encoded:
                continue
            vectors = server.lookup(settings.ranking.model, table, encoded[column])
            embeddings[feature] = {"table": table, "dim": vectors.shape[1],
                                   "vectors": vectors}
    # Built as RankingInputsResponse describes it, without re-validating every float.
    return FastJSONResponse({
        "user": _section(result, names["user_id"], [user], encoded["user_id"]),
        "items": _section(result, names["item_id"], items, encoded["item_id"]),
        "embeddings": embeddings})


def _micros(at: datetime) -> int:
    """µs since the epoch, exactly (a time without a zone is UTC)."""
    return micros_of(utc(at))


@router.post("/model-inputs", response_model=ModelInputsResponse, responses=ERRORS)
async def model_inputs(body: ModelInputsRequest,
                       services: Services = Depends(get_services)) -> FastJSONResponse:
    """Each candidate's row of the model's input at the request time: every example feature
    computed from the same definitions as the ETL's (ids and encodings with the published
    fit, windows and histories from the engine's tiles, the model-ready transforms), in the
    TFRecords' names and layout. On the event loop: the engine's reads are awaited."""
    served, at_us = _request(body, services)
    features, groups = await served.answer_async(
        services.reader, services.vocabularies, str(body.user_id),
        [str(i) for i in body.item_ids], body.context, body.item_context, at_us)
    _log(services, "model-inputs", body, at_us, features)
    return FastJSONResponse({
        "features": features, "groups": groups, "unserved": served.inputs.unserved,
        **_stamp(services, at_us)})


@router.post("/rank", response_model=RankResponse, responses=ERRORS)
def rank(body: RankRequest, services: Services = Depends(get_services)) -> FastJSONResponse:
    """The candidates sorted by the model's score: their inputs as ``/v1/model-inputs``
    computes them, the embeddings looked up once per table through the parameter server's
    tiers, one forward pass of the dense part for every candidate."""
    server = services.parameter_server()

    def ranked() -> tuple[Ranker, dict[str, np.ndarray], dict[str, np.ndarray], int,
                          np.ndarray]:
        model = services.ranker(body.model)
        features, groups, at_us = _inputs(body, services)
        lookup = functools.partial(server.lookup, body.model)
        return model, features, groups, at_us, model.rank(features, groups, lookup)

    model, features, groups, at_us, scores = services.swap.read(ranked)
    _log(services, "rank", body, at_us, features)
    order = np.argsort(-scores, kind="stable")[:body.top_k]
    answer: dict[str, Any] = {
        "items": [{"item_id": body.item_ids[i], "score": float(scores[i])} for i in order],
        "model": body.model, "model_version": model.version, **_stamp(services, at_us)}
    if body.return_inputs:
        answer["groups"] = {name: rows[order] for name, rows in groups.items()}
    return FastJSONResponse(answer)


def _log(services: Services, endpoint: str, body: ModelInputsRequest, at_us: int,
         features: dict[str, np.ndarray]) -> None:
    """The rows served, to the feature log (``api.feature_logging``) when it is on."""
    if services.feature_log is not None:
        services.feature_log.log_inputs(endpoint, str(body.user_id),
                                        [str(i) for i in body.item_ids], body.context,
                                        body.item_context, at_us, features)


def _served(services: Services) -> ServedInputs:
    if services.inputs is None:
        raise NoModelInputsError()
    return services.inputs


def _request(body: ModelInputsRequest, services: Services) -> tuple[ServedInputs, int]:
    """What serves the request's inputs, and its request time (µs)."""
    services.check_limit("item_ids", len(body.item_ids), services.config.api.limits.max_entities)
    served = _served(services)
    return served, services.reader.clock() if body.at is None else _micros(body.at)


def _inputs(body: ModelInputsRequest, services: Services
            ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
    """The candidates' features and TFRecord groups, and the request time (µs)."""
    served, at_us = _request(body, services)
    features, groups = served.answer(services.reader, services.vocabularies, str(body.user_id),
                                     [str(i) for i in body.item_ids], body.context,
                                     body.item_context, at_us)
    return features, groups, at_us


def _stamp(services: Services, at_us: int) -> dict[str, Any]:
    """What an answer's values were computed from."""
    return {"at": datetime.fromtimestamp(at_us / 1_000_000, timezone.utc).isoformat(),
            "dataset_version": services.dataset_version, "fit_version": services.fit_version}
