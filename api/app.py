"""The FastAPI application: ``create_app(config)``; ``featureline serve`` runs it in uvicorn
(through the launcher, which reads the configuration file)."""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException

from featureline.api import errors
from featureline.api.routes import admin, embeddings, features, health, ranking
from featureline.api.services import Services, open_services
from featureline.api.settings import ServingConfig
from featureline.core import __version__


async def _read_within(request: Request, limit: int) -> bool:
    """Read a body of unknown length (chunked), stopping as soon as it passes ``limit``; the
    body read is kept for the route. False when it is too large."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return False
        chunks.append(chunk)
    request._body = b"".join(chunks)  # Starlette hands a cached body on to the route
    return True


# Every response names the dataset whose vocabularies encoded its ids.
DATASET_VERSION_HEADER = "X-Featureline-Dataset-Version"


def create_app(config: ServingConfig | None = None, *, output: str | Path | None = None,
               redis_url: str | None = None) -> FastAPI:
    """The application; its services (Redis, vocabularies, HPS) open when it starts."""
    config = config or ServingConfig()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if getattr(app.state, "services", None) is not None:  # started already (a test
            yield                                              # harness nesting lifespans)
            return
        services = open_services(config, output=output, redis_url=redis_url)
        app.state.services = services
        # What startup loaded (Feast, vocabularies, tables) stays: keep the collector from
        # walking it on every full collection, a source of tail latency.
        gc.freeze()
        try:
            yield
        finally:
            services.close()
            app.state.services = None

    # /docs and /redoc load their JavaScript and CSS from this process (FastAPI's way of
    # self-hosting them, packaged): they work air-gapped.
    app = FastAPIOffline(title="Featureline ranking API", version=__version__,
                         lifespan=lifespan,
                         description="Online features, embedding lookups, and both in one "
                                     "call.")
    for module in (features, embeddings, ranking, admin, health):
        app.include_router(module.router)
    limits = config.api.limits

    def count_error(kind: str) -> None:
        services: Services | None = getattr(app.state, "services", None)
        if services is not None:
            services.metrics.count_error(kind)

    errors.install(app, config.api.retry_after_s, count_error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
                405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
        count_error(kind)
        return JSONResponse({"error": kind, "message": str(exc.detail)}, exc.status_code,
                            headers=exc.headers)

    @app.middleware("http")
    async def body_limit_and_latency(request: Request,
                                     call_next: Callable[[Request], Awaitable[Response]]
                                     ) -> Response:
        started = time.perf_counter()
        length = request.headers.get("content-length")
        too_large = length is not None and length.isdigit() and int(length) > limits.max_body_bytes
        if length is None and request.method in {"POST", "PUT", "PATCH"}:
            too_large = not await _read_within(request, limits.max_body_bytes)
        if too_large:
            count_error("LimitExceededError")
            response: Response = JSONResponse(
                {"error": "LimitExceededError", "field": "body", "limit": limits.max_body_bytes,
                 "message": f"body: larger than the limit of {limits.max_body_bytes} bytes"},
                413)
        else:
            response = await call_next(request)
        route = request.scope.get("route")
        services: Services | None = getattr(app.state, "services", None)
        if services is not None:
            response.headers[DATASET_VERSION_HEADER] = services.dataset_version
            services.metrics.latency.labels(
                route=getattr(route, "path", "unmatched"), method=request.method,
                status=str(response.status_code)).observe(time.perf_counter() - started)
        return response

    return app
