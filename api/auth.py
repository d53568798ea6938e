"""API keys as bearer tokens, with read, write and admin scopes (each includes the ones
before it)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from featureline.api.settings import SCOPES, Scope

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`")
_RANK = {scope: rank for rank, scope in enumerate(SCOPES)}


def _scope_of(keys: dict[str, Scope], presented: str) -> Scope | None:
    # Compare against every key in constant time, so timing says nothing about them.
    found = None
    for key, scope in keys.items():
        if hmac.compare_digest(key.encode(), presented.encode()):
            found = scope
    return found


def require(scope: Scope) -> Callable[..., Awaitable[None]]:
    """A dependency: 401 without a known key, 403 with a key of a lower scope."""

    # async: it does no I/O, and a plain def would hop to the thread pool on every request
    async def check(request: Request,
                    credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)
                    ) -> None:
        services = request.app.state.services
        if not services.config.api.auth.enabled:
            return
        if credentials is None:
            raise HTTPException(401, "missing API key (Authorization: Bearer <key>)",
                                headers={"WWW-Authenticate": "Bearer"})
        granted = _scope_of(services.api_keys, credentials.credentials)
        if granted is None:
            raise HTTPException(401, "unknown API key", headers={"WWW-Authenticate": "Bearer"})
        if _RANK[granted] < _RANK[scope]:
            raise HTTPException(403, f"this key has the {granted} scope; {scope} is needed")

    return check
