"""Typed errors → HTTP status and a JSON body that says what to fix.

Each error carries its status (``http_status``, core/errors.py); the handler asks it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from featureline.core.errors import FeaturelineError, UnprocessableError

logger = logging.getLogger("featureline.api")


class LimitExceededError(FeaturelineError):
    """A request over one of ``api.limits``."""

    http_status = 413

    def __init__(self, field: str, limit: int, got: int) -> None:
        self.field = field
        self.limit = limit
        super().__init__(f"{field}: {got} exceeds the limit of {limit}")

    def fields(self) -> dict[str, Any]:
        return {"field": self.field, "limit": self.limit}


class UnknownEntityKeyError(UnprocessableError):
    """An entity key that is neither a join key nor an encoded id, or ids of the wrong kind."""

    def __init__(self, key: str, known: list[str], problem: str | None = None) -> None:
        super().__init__(f"entities.{key}", f"entities.{key}: " + (
            problem or f"not a join key or encoded id (known: {', '.join(known)})"))


def _body(kind: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": kind, "message": message, **{k: v for k, v in extra.items() if v is not None}}


def install(app: FastAPI, retry_after_s: int, count_error: Any) -> None:
    """Register the handlers; ``count_error(kind)`` feeds the errors-by-kind metric."""

    @app.exception_handler(FeaturelineError)
    async def featureline_error(_: Request, exc: FeaturelineError) -> JSONResponse:
        kind = type(exc).__name__
        count_error(kind)
        headers = {"Retry-After": str(retry_after_s)} if exc.retry_after else None
        return JSONResponse(_body(kind, str(exc), **exc.fields()), exc.http_status,
                            headers=headers)

    @app.exception_handler(Exception)
    async def unexpected_error(_: Request, exc: Exception) -> JSONResponse:
        # Not one of ours (a disk error in RocksDB, a bug): logged in full, answered without
        # internals, counted by kind.
        kind = type(exc).__name__
        count_error(kind)
        logger.error("unexpected %s", kind, exc_info=exc)
        return JSONResponse(_body("InternalError", "internal error; the server log has the "
                                  "details"), 500)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        count_error("RequestValidationError")
        first = exc.errors()[0]
        field = ".".join(_text(p) for p in first["loc"] if p != "body")
        return JSONResponse(_body("RequestValidationError",
                                  f"{field or 'body'}: {_text(first['msg'])}",
                                  field=field or None)
                            | {"detail": _jsonable(exc.errors())}, 422)


def _jsonable(errors: Sequence[Any]) -> list[dict[str, Any]]:
    return [{"loc": [p if isinstance(p, int) else _text(p) for p in e["loc"]],
             "msg": _text(e["msg"]), "type": e["type"]} for e in errors]


def _text(value: Any) -> str:
    """A request's text as a response can hold it: a lone surrogate escaped (``\\ud800``)."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")
