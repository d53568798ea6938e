"""``POST /v1/features``: online features for rows of entity ids."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from featureline.api.auth import require
from featureline.api.model_inputs import check_request_time
from featureline.api.models import FeaturesRequest, FeaturesResponse, error_responses
from featureline.api.responses import FastJSONResponse
from featureline.api.services import Services, get_services
from featureline.core.events import micros_of, utc
from featureline.core.model_inputs import ITEM_INPUTS, USER_INPUTS, attribute_name

router = APIRouter(prefix="/v1", tags=["features"], dependencies=[Depends(require("read"))])
ERRORS = error_responses(401, 403, 404, 413, 422, 503)
# An attribute's role → the input group holding its latest value, and the id keying it.
ATTRIBUTE_GROUPS = {"user": (USER_INPUTS, "user_id"), "item": (ITEM_INPUTS, "item_id")}


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
    entities = await _with_attributes(services, references, entities, at_us)
    result = await services.reader.read_async(references, entities, at_us)
    if services.feature_log is not None:
        services.feature_log.log(body.service, entities, result)
    # Built as FeaturesResponse describes it, without re-validating every value.
    return FastJSONResponse({"names": result.names, "values": result.values,
                         "status": result.status})


async def _with_attributes(services: Services, references: list[tuple[str, str]],
                           entities: dict[str, list[Any]], at_us: int | None
                           ) -> dict[str, list[Any]]:
    """``entities`` with each attribute a group's keys name and the request does not send
    read by its user's or item's id, as the online tiles hold it at the request time (a
    rating's film's release year, from its file even before its first rating)."""
    inputs, groups = services.inputs, services.reader.groups
    if inputs is None:
        return entities
    missing = {key for group, _ in references if group in groups
               for key in groups[group].keys if key not in entities}
    wanted: dict[tuple[str, str], list[str]] = {}  # (input group, id column) → attributes
    for column in sorted(missing):
        role = inputs.roles.get(column)
        if role in ATTRIBUTE_GROUPS:
            group, key = ATTRIBUTE_GROUPS[role]
            if group in groups and key in entities:
                wanted.setdefault((group, key), []).append(column)
    filled = dict(entities)
    for (group, key), columns in wanted.items():
        read = await services.reader.read_async(
            [(group, attribute_name(c)) for c in columns], {key: entities[key]}, at_us)
        for column in columns:
            filled[column] = read.values[f"{group}:{attribute_name(column)}"]
    return filled
