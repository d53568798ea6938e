"""``POST /v1/push``: raw events into the event log, validated as the ETL validates a log row
(docs/ARCHITECTURE.md, "Fresh features"). The API only appends; ``featureline stream``
turns the logged events into online features."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from featureline.api.auth import require
from featureline.api.models import PushRequest, PushResponse, Rejected, error_responses
from featureline.api.responses import FastJSONResponse
from featureline.api.services import Services, get_services

router = APIRouter(prefix="/v1", tags=["push"], dependencies=[Depends(require("write"))])
ERRORS = error_responses(401, 403, 413, 422, 503)


@router.post("/push", response_model=PushResponse, status_code=202, responses=ERRORS)
def push(body: PushRequest, services: Services = Depends(get_services)) -> FastJSONResponse:
    """Accepted events are in the log when this answers (202); rejected ones, with the ETL's
    reason code and field, changed nothing. 503 (Retry-After): the log did not take them,
    and pushing them again is safe (an exact duplicate counts once)."""
    services.check_limit("events", len(body.events), services.config.api.limits.max_events)
    accepted, rejected = services.pusher().push(body.events)
    answer = PushResponse(accepted=accepted, rejected=[
        Rejected(index=index, reason=rejection.reason, field=rejection.field)
        for index, rejection in rejected])
    return FastJSONResponse(answer.model_dump(), status_code=202)
