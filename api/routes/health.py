"""Liveness, readiness and Prometheus metrics (no authentication: probes and scrapers)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.models import Health
from api.services import Services, get_services

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The process answers."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(services: Services = Depends(get_services)) -> Health | JSONResponse:
    """Redis answers and the parameter server (when configured) is loaded."""
    checks = {"redis": services.reader.ping()}
    if services.config.api.hps:
        checks["hps"] = services.hps is not None
    health = Health(status="ok" if all(checks.values()) else "unavailable", checks=checks)
    if health.status == "ok":
        return health
    return JSONResponse(health.model_dump(), status_code=503,
                        headers={"Retry-After": str(services.config.api.retry_after_s)})


@router.get("/metrics", response_class=Response)
def metrics(services: Services = Depends(get_services)) -> Response:
    """Prometheus text format."""
    return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)
