"""Embedding lookups and the tables the parameter server holds."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from featureline.api.auth import require
from featureline.api.models import (
    LookupRequest,
    LookupResponse,
    ModelInfo,
    ModelsResponse,
    TableInfo,
    error_responses,
)
from featureline.api.responses import FastJSONResponse
from featureline.api.services import Services, get_services
from featureline.api.versions import check

router = APIRouter(prefix="/v1/embeddings", tags=["embeddings"],
                   dependencies=[Depends(require("read"))])
ERRORS = error_responses(401, 403, 404, 413, 422, 503)
OCTET_STREAM = "application/octet-stream"


@router.post("/lookup", response_model=LookupResponse, responses={
    **ERRORS, 200: {"content": {OCTET_STREAM: {}},
                    "description": "JSON; or with Accept: application/octet-stream, "
                                   "little-endian float32 [n × dim], shape in X-Shape"}})
def lookup(body: LookupRequest, request: Request,
           services: Services = Depends(get_services)) -> Response:
    """Vectors of ``keys`` in request order; unknown keys get the table's default vector."""
    limits = services.config.api.limits
    services.check_limit("keys", len(body.keys), limits.max_keys)
    server = services.parameter_server()
    dim = server.table(body.model, body.table).config.dim
    services.check_limit("keys × dim", len(body.keys) * dim, limits.max_response_values)
    vectors = server.lookup(body.model, body.table, body.keys)
    if OCTET_STREAM in request.headers.get("accept", ""):
        return Response(vectors.astype("<f4", copy=False).tobytes(), media_type=OCTET_STREAM,
                        headers={"X-Shape": f"{vectors.shape[0]},{vectors.shape[1]}",
                                 "X-Dtype": "float32-le"})
    return FastJSONResponse({"model": body.model, "table": body.table, "dim": vectors.shape[1],
                             "vectors": vectors})


@router.get("/models", response_model=ModelsResponse, responses=ERRORS)
def models(services: Services = Depends(get_services)) -> ModelsResponse:
    """Models and tables: dims, sizes, cache occupancy and hit statistics."""
    stats = services.hps.stats() if services.hps is not None else {}
    described = {"dim", "keys", "cache", "vocabulary_version"}
    return ModelsResponse(models=[
        ModelInfo(name=model, tables=[
            TableInfo(name=name, dim=entry["dim"], keys=entry["keys"], cache=entry["cache"],
                      vocabulary_version=entry["vocabulary_version"],
                      stats={k: v for k, v in entry.items() if k not in described})
            for name, entry in tables.items()])
        for model, tables in stats.items()], versions=check(services))
