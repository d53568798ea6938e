"""Typed errors → HTTP status and a JSON body that says what to fix."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from api.vocabulary import AmbiguousIdError
from etl.errors import FeaturelineError, NotFoundError
from feature_store.errors import OnlineStoreUnavailableError
from feature_store.online import MissingEntityError


class LimitExceededError(FeaturelineError):
    """A request over one of ``api.limits``."""

    def __init__(self, field: str, limit: int, got: int) -> None:
        self.field = field
        self.limit = limit
        super().__init__(f"{field}: {got} exceeds the limit of {limit}")


class UnavailableError(FeaturelineError):
    """A part the request needs is not configured (e.g. no parameter server)."""


class UnknownEntityKeyError(FeaturelineError):
    """An entity key that is neither a join key nor an encoded id, or ids of the wrong kind."""

    def __init__(self, key: str, known: list[str], problem: str | None = None) -> None:
        self.join_key = f"entities.{key}"
        super().__init__(f"entities.{key}: " + (problem or "not a join key or encoded id "
                                                f"(known: {', '.join(known)})"))


UNPROCESSABLE = (MissingEntityError, AmbiguousIdError, UnknownEntityKeyError)


def _body(kind: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": kind, "message": message, **{k: v for k, v in extra.items() if v is not None}}


def install(app: FastAPI, retry_after_s: int, count_error: Any) -> None:
    """Register the handlers; ``count_error(kind)`` feeds the errors-by-kind metric."""

    @app.exception_handler(FeaturelineError)
    async def featureline_error(_: Request, exc: FeaturelineError) -> JSONResponse:
        kind = type(exc).__name__
        count_error(kind)
        message = str(exc)
        if isinstance(exc, LimitExceededError):
            return JSONResponse(_body(kind, message, field=exc.field, limit=exc.limit), 413)
        if isinstance(exc, NotFoundError):
            return JSONResponse(_body(kind, message), 404)
        if isinstance(exc, UNPROCESSABLE):
            return JSONResponse(_body(kind, message, field=getattr(exc, "join_key", None)), 422)
        if isinstance(exc, OnlineStoreUnavailableError):
            return JSONResponse(_body(kind, message), 503,
                                headers={"Retry-After": str(retry_after_s)})
        if isinstance(exc, UnavailableError):
            return JSONResponse(_body(kind, message), 503)
        return JSONResponse(_body(kind, message), 500)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        count_error("RequestValidationError")
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if p != "body")
        return JSONResponse(_body("RequestValidationError",
                                  f"{field or 'body'}: {first['msg']}", field=field or None)
                            | {"detail": _jsonable(exc.errors())}, 422)


def _jsonable(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in errors]
