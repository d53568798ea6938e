"""Liveness, readiness and Prometheus metrics (no authentication: probes and scrapers)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from featureline.api.models import Health
from featureline.api.services import Services, get_services
from featureline.api.versions import check

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, response_model_exclude_none=True)
def healthz() -> Health:
    """The process answers."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(services: Services = Depends(get_services)) -> Health | JSONResponse:
    """Redis answers and holds a published dataset, the parameter server (when configured) is
    loaded, and the online store and the embedding tables encode ids as the API does
    (``versions.problems`` says what disagrees, or that the store is empty)."""
    checks = {"redis": services.reader.ping()}
    tiers = None
    if services.config.api.hps:
        checks["hps"] = services.hps is not None
        if services.hps is not None:
            tiers = services.hps.health()
            checks["hps_l3"] = tiers["l3"]
    versions = check(services) if checks["redis"] else None
    if versions is not None and versions.online_store is not None:
        # Anyone may probe: the output's path on disk is for callers with a key
        # (/v1/embeddings/models).
        versions = versions.model_copy(update={"online_store": {
            key: value for key, value in versions.online_store.items() if key != "output"}})
    if versions is not None:
        # Published: the store holds a dataset (an empty one would answer not_found to all).
        checks["published"] = versions.online_store is not None
        checks["versions"] = not versions.problems
        if versions.problems and checks["published"]:
            services.metrics.version_skew.inc()
    health = Health(status="ok" if all(checks.values()) else "unavailable", checks=checks,
                    tiers=tiers, versions=versions)
    if health.status == "ok":
        return health
    return JSONResponse(health.model_dump(), status_code=503,
                        headers={"Retry-After": str(services.config.api.retry_after_s)})


@router.get("/metrics", response_class=Response)
def metrics(services: Services = Depends(get_services)) -> Response:
    """Prometheus text format."""
    return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)
