"""The FastAPI application: ``create_app(config)``; ``featureline serve`` runs it in uvicorn
(through the launcher, which reads the configuration file)."""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from threadpoolctl import threadpool_limits

from featureline.api import errors
from featureline.api.routes import admin, embeddings, features, health, push, ranking
from featureline.api.services import Services, open_services
from featureline.api.settings import ServingConfig
from featureline.core import __version__


async def _read_within(receive: Receive, limit: int) -> bytes | None:
    """Read a body of unknown length (chunked), stopping as soon as it passes ``limit``:
    the body, or None when it is too large."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            return None
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the route the body read already, then the client's own."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


# Every response names the dataset whose vocabularies encoded its ids.
DATASET_VERSION_HEADER = "X-Featureline-Dataset-Version"
_VERSION_HEADER = DATASET_VERSION_HEADER.lower().encode()


class ServingMiddleware:
    """The body limit, the dataset version header and the latency histogram, as a plain ASGI
    middleware: Starlette's ``@app.middleware("http")`` runs every request through extra
    tasks and memory streams, a cost each ranking call pays (docs/ARCHITECTURE.md,
    "Processes that serve")."""

    def __init__(self, app: ASGIApp, owner: FastAPI, max_body_bytes: int,
                 count_error: Callable[[str], None]) -> None:
        self.app = app
        self.owner = owner
        self.max_body_bytes = max_body_bytes
        self.count_error = count_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        limit = self.max_body_bytes
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        too_large = length is not None and length.isdigit() and int(length) > limit
        if length is None and scope["method"] in {"POST", "PUT", "PATCH"}:
            body = await _read_within(receive, limit)
            too_large = body is None
            receive = _replay(body or b"", receive)
        services: Services | None = getattr(self.owner.state, "services", None)
        status = 500

        async def send_with_version(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            if message["type"] == "http.response.start" and services is not None:
                message["headers"] = [*message.get("headers", ()),
                                      (_VERSION_HEADER, services.dataset_version.encode())]
            await send(message)

        if services is None:  # not started yet, or stopped
            await self._answer(scope, receive, send_with_version, too_large, limit)
            return
        services.activity.started()
        try:
            await self._answer(scope, receive, send_with_version, too_large, limit)
        finally:
            services.activity.finished()
        route = scope.get("route")
        services.metrics.latency.labels(
            route=getattr(route, "path", "unmatched"), method=scope["method"],
            status=str(status)).observe(time.perf_counter() - started)

    async def _answer(self, scope: Scope, receive: Receive, send: Send, too_large: bool,
                      limit: int) -> None:
        if too_large:
            self.count_error("LimitExceededError")
            response = JSONResponse(
                {"error": "LimitExceededError", "field": "body", "limit": limit,
                 "message": f"body: larger than the limit of {limit} bytes"}, 413)
            await response(scope, receive, send)
        else:
            await self.app(scope, receive, send)


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
        # One BLAS thread: /v1/rank's forward pass is a small product, and OpenBLAS's other
        # threads would spin beside it (1.8x a request's CPU; benchmarks/README.md).
        threadpool_limits(1, user_api="blas")
        try:
            yield
        finally:
            services.close()
            await services.reader.store.close_async()
            app.state.services = None

    # /docs and /redoc load their JavaScript and CSS from this process (FastAPI's way of
    # self-hosting them, packaged): they work air-gapped.
    app = FastAPIOffline(title="Featureline ranking API", version=__version__,
                         lifespan=lifespan,
                         description="Online features, embedding lookups, and both in one "
                                     "call.")
    for module in (features, embeddings, ranking, push, admin, health):
        app.include_router(module.router)
    limits = config.api.limits

    def count_error(kind: str) -> None:
        services: Services | None = getattr(app.state, "services", None)
        if services is not None:
            services.metrics.count_error(kind)

    errors.install(app, config.api.retry_after_s, count_error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # FastAPI's: a body it could not parse
            count_error("RequestValidationError")
            return JSONResponse({"error": "RequestValidationError", "field": "body",
                                 "message": "body: not a JSON document this API reads (UTF-8 "
                                            "text, nested at most a few hundred levels)"}, 422)
        kind = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
                405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
        count_error(kind)
        return JSONResponse({"error": kind, "message": str(exc.detail)}, exc.status_code,
                            headers=exc.headers)

    app.add_middleware(ServingMiddleware, owner=app, max_body_bytes=limits.max_body_bytes,
                       count_error=count_error)
    return app
