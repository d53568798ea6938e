"""Administration: reload a model's embedding tables from their sources."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from featureline.api.auth import require
from featureline.api.models import ReloadResponse, error_responses
from featureline.api.services import Services, get_services

router = APIRouter(prefix="/v1/admin", tags=["admin"], dependencies=[Depends(require("admin"))])
ERRORS = error_responses(401, 403, 404, 422, 500, 503)


@router.post("/models/{name}/reload", response_model=ReloadResponse, responses=ERRORS)
def reload_model(name: str, services: Services = Depends(get_services)) -> ReloadResponse:
    """Read the model's tables (``api.hps``) and their sources again and apply them (L3, L2,
    refreshed L1), and the served output's vocabularies, here and in every other API process
    (announced on Redis; ``workers``: the processes that heard it)."""
    rows, workers = services.reload(name)
    return ReloadResponse(model=name, rows=rows, workers=workers,
                          held_ms=round(services.swap.held_s * 1000, 3))
