"""``POST /v1/features``: online features for rows of entity ids."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from featureline.api.auth import require
from featureline.api.model_inputs import check_request_time
from featureline.api.models import FeaturesRequest, FeaturesResponse, error_responses
from featureline.api.responses import FastJSONResponse
from featureline.api.services import Services, get_services
from featureline.core.events import micros_of, utc

router = APIRouter(prefix="/v1", tags=["features"], dependencies=[Depends(require("read"))])
ERRORS = error_responses(401, 403, 404, 413, 422, 503)


@router.post("/features", response_model=FeaturesResponse, responses=ERRORS)
async def read_features(body: FeaturesRequest,
                        services: Services = Depends(get_services)) -> FastJSONResponse:
    """Each feature's value and status (present / not_found / outside_ttl) per row.

    ``async``: the online store is read with an asyncio client, so the request stays on the
    event loop (a plain def would hop to a worker thread, the larger part of its CPU time:
    docs/ARCHITECTURE.md, "Processes that serve")."""
    rows = len(next(iter(body.entities.values())))
    services.check_limit("entities", rows, services.config.api.limits.max_entities)
    references = services.reader.references(body.service, body.features)
    entities = services.raw_entities(body.entities)
    at_us = None if body.at is None else micros_of(utc(body.at))
    if at_us is not None and services.inputs is not None:
        check_request_time(at_us, services.inputs.cut_us)
    result = await services.reader.read_async(references, entities, at_us)
    if services.feature_log is not None:
        services.feature_log.log(body.service, entities, result)
    # Built as FeaturesResponse describes it, without re-validating every value.
    return FastJSONResponse({"names": result.names, "values": result.values,
                         "status": result.status})
