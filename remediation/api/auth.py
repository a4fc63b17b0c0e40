"""Authentication for the API and the dashboard: bearer tokens from settings, two roles.

- A ``read`` token may read everything; an ``admin`` token may also pull levers. Every write needs admin.
- Tokens have names. ``api.tokens`` lists named ones (``{name, role, token_file}``): a lever pulled with
  one is audited with the token's name as the actor, whatever the request claims. The unnamed lists
  ``admin_tokens`` and ``read_tokens`` stay accepted; their names are derived from the token's
  fingerprint (``admin-1a2b3c4d``), and, as before, a request may add a human name, recorded with the
  fingerprint (``alice (token 1a2b3c4d)``).
- The JSON API takes ``Authorization: Bearer <token>`` only. It never reads the cookie, so a browser
  cannot be tricked into pulling a lever through it (no CSRF surface).
- The dashboard takes the token once in a login form and keeps it in an HttpOnly, SameSite=Strict
  cookie (Secure over https). Its forms also carry a CSRF value derived from the token (HMAC), which a
  third-party page cannot compute.
- Tokens are compared with :func:`hmac.compare_digest` against every configured token (no early exit
  that would time-leak which list matched). They are never logged or echoed: the audit log records a
  short SHA-256 fingerprint so two admins' actions can be told apart without storing the secret.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from remediation.settings import ApiSettings

COOKIE = "remediation_session"
USER_COOKIE = "remediation_user"
bearer = HTTPBearer(auto_error=False, description="An admin or read-only token from settings.api.")


@dataclass(frozen=True)
class Principal:
    role: Literal["admin", "read"]
    fingerprint: str  # first 8 hex digits of sha256(token): identifies, never reveals
    token: str  # kept in memory only to derive the CSRF value
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
        return hmac.new(self.token.encode(), b"remediation-csrf", hashlib.sha256).hexdigest()[:32]


def identify(token: str | None, cfg: ApiSettings) -> Principal | None:
    if not token:
        return None
    given = token.encode()
    admin = read = False
    named: tuple[str, Literal["admin", "read"]] | None = None
    for entry in cfg.tokens:  # every entry is compared: no early exit that would time-leak the match
        if hmac.compare_digest(given, entry.secret().encode()):
            named = named or (entry.name, entry.role)
    for secret in cfg.admin_tokens:
        admin |= hmac.compare_digest(given, secret.get_secret_value().encode())
    for secret in cfg.read_tokens:
        read |= hmac.compare_digest(given, secret.get_secret_value().encode())
    fp = hashlib.sha256(given).hexdigest()[:8]
    if named is not None:
        return Principal(named[1], fp, token, named[0], named=True)
    if not (admin or read):
        return None
    role: Literal["admin", "read"] = "admin" if admin else "read"
    return Principal(role, fp, token, f"{role}-{fp}")


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


def api_reader(request: Request, creds: HTTPAuthorizationCredentials | None) -> Principal:
    if creds is None:
        raise _unauthorized("missing bearer token")
    who = identify(creds.credentials, request.app.state.settings.api)
    if who is None:
        raise _unauthorized("invalid token")
    return who


def require_admin(who: Principal) -> Principal:
    if not who.admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this token is read-only; levers need an admin token")
    return who


def browser_principal(request: Request) -> Principal | None:
    return identify(request.cookies.get(COOKIE), request.app.state.settings.api)


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
