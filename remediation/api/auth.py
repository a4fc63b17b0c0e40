"""Authentication for the API and the dashboard: bearer tokens from settings, three roles.

``read`` tokens read, ``admin`` tokens also pull levers, ``repair`` tokens (the repair system's) call
the repair request callback and nothing else: no read, no lever, no dashboard. Named tokens (``api.tokens``) audit levers under
their name; unnamed ones under their fingerprint. The JSON API takes ``Authorization: Bearer`` only; the
dashboard holds a server-side session (:mod:`remediation.services.dashboard_sessions`) whose forms carry a
CSRF value. Tokens are compared in constant time and never logged.

Why: docs/running.md#the-api-and-the-dashboard
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from remediation.services.dashboard_sessions import session_token, sha256
from remediation.settings import ApiSettings

COOKIE = "remediation_session"
USER_COOKIE = "remediation_user"
bearer = HTTPBearer(auto_error=False, description="An admin or read-only token from settings.api.")


@dataclass(frozen=True)
class Principal:
    role: Literal["admin", "read", "repair"]
    fingerprint: str  # first 8 hex digits of sha256(token): identifies, never reveals
    csrf_key: str  # kept in memory only to derive the CSRF value: the session id, or the bearer token
    name: str = ""  # the token's name from api.tokens; derived (admin-<fingerprint>) for the unnamed lists
    named: bool = False  # from api.tokens: the name is the actor, nothing the request says replaces it

    @property
    def admin(self) -> bool:
        return self.role == "admin"

    def actor(self, name: str | None) -> str:
        if self.named:
            return self.name
        who = (name or "").strip() or "api"
        return f"{who} (token {self.fingerprint})"[:128]

    @property
    def csrf(self) -> str:
        return hmac.new(self.csrf_key.encode(), b"remediation-csrf", hashlib.sha256).hexdigest()[:32]


def identify(token: str | None, cfg: ApiSettings) -> Principal | None:
    if not token:
        return None
    given = token.encode()
    return _match(cfg, lambda secret: hmac.compare_digest(given, secret.encode()), sha256(token),
                  csrf_key=token)


def identify_sha256(digest: str, cfg: ApiSettings, csrf_key: str) -> Principal | None:
    """The principal whose configured token has this SHA-256 (a session's), or None once it is gone."""
    return _match(cfg, lambda secret: hmac.compare_digest(digest.encode(), sha256(secret).encode()), digest,
                  csrf_key=csrf_key)


def _match(cfg: ApiSettings, same: Callable[[str], bool], digest: str, *, csrf_key: str) -> Principal | None:
    admin = read = False
    named: tuple[str, Literal["admin", "read", "repair"]] | None = None
    for entry in cfg.tokens:  # every entry is compared: no early exit that would time-leak the match
        if same(entry.secret()):
            named = named or (entry.name, entry.role)
    for secret in cfg.admin_tokens:
        admin |= same(secret.get_secret_value())
    for secret in cfg.read_tokens:
        read |= same(secret.get_secret_value())
    fp = digest[:8]
    if named is not None:
        return Principal(named[1], fp, csrf_key, named[0], named=True)
    if not (admin or read):
        return None
    role: Literal["admin", "read"] = "admin" if admin else "read"
    return Principal(role, fp, csrf_key, f"{role}-{fp}")


def header_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer`` header, for a route outside the bearer dependency."""
    header = request.headers.get("authorization", "")
    return header[7:] if header.lower().startswith("bearer ") else None


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


def api_reader(request: Request, creds: HTTPAuthorizationCredentials | None) -> Principal:
    if creds is None:
        raise _unauthorized("missing bearer token")
    who = identify(creds.credentials, request.app.state.settings.api)
    if who is None:
        raise _unauthorized("invalid token")
    if who.role == "repair":
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this token's role is repair: it may only call "
                            "POST /api/v1/repair-requests/ID/callback")
    return who


def repair_caller(request: Request, creds: HTTPAuthorizationCredentials | None) -> Principal:
    """The caller of the repair callback: a repair token (the repair system's) or an admin token."""
    if creds is None:
        raise _unauthorized("missing bearer token")
    who = identify(creds.credentials, request.app.state.settings.api)
    if who is None:
        raise _unauthorized("invalid token")
    if who.role not in ("repair", "admin"):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "the repair callback needs a repair or admin token")
    return who


def require_admin(who: Principal) -> Principal:
    if not who.admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this token is read-only; levers need an admin token")
    return who


def browser_principal(request: Request) -> Principal | None:
    """The dashboard session's principal: a live session whose token is still configured."""
    session_id = request.cookies.get(COOKIE)
    if not session_id or len(session_id) > 128:
        return None
    st = request.app.state
    with st.sessions() as s:
        digest = session_token(s, session_id, st.clock.now(), key=st.session_key)
    who = None if digest is None else identify_sha256(digest, st.settings.api, session_id)
    return None if who is None or who.role == "repair" else who  # a repair token has no dashboard


def check_csrf(who: Principal, value: str | None) -> None:
    if not value or not hmac.compare_digest(value.encode(), who.csrf.encode()):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "stale or missing form token: reload the page")


class ErrorBody(BaseModel):
    """Every refusal of the JSON API: ``{"detail": "what was wrong"}`` (a request that fails validation
    gets FastAPI's list of the fields at fault instead)."""

    detail: str | list[dict[str, Any]]


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


#: The refusals every ``/api/v1`` operation can answer, documented in the OpenAPI spec so that a client
#: (and the schemathesis conformance run) knows every status it may see and the body that comes with it.
API_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("A body that is not JSON"),
    401: _error("No bearer token, or one the service does not know"),
    403: _error("A read-only token on a lever (levers need an admin token)"),
    404: _error("No such record"),
    409: _error("The lever or incident action was refused in the record's current state"),
    413: _error("A body larger than api.max_body_bytes (refused before it is read)"),
    422: _error("A parameter or body the service cannot use"),
    503: _error("The database is unreachable"),
}
