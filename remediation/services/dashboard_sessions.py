"""Dashboard sessions, kept in the database so that every API replica shares them.

A login makes a random id (256 bits) that only the browser holds, in an HttpOnly cookie. The row keeps
the id's HMAC-SHA-256 under the server's key (``api.session_key``): a copy of the table opens no
session, and without the key its rows cannot even be matched against a stolen cookie. It also keeps
the SHA-256 of the token that logged in, and an expiry. A session ends four ways: it expires, the user
logs out (the row is deleted), its token is no longer configured (the caller checks the token's
SHA-256 against the configuration on every request, so rotating a token out ends every session made
with it, on every replica, at its restart), or the key changes (no row matches any more). Expired rows
are removed at each login.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from remediation.db.models import DashboardSession


def sha256(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def session_digest(key: bytes, session_id: str) -> str:
    """What the row keeps of a session id: its HMAC-SHA-256 under the server key, never the id."""
    return hmac.new(key, session_id.encode(), hashlib.sha256).hexdigest()


def open_session(s: Session, token: str, now: datetime, *, ttl: timedelta, key: bytes) -> str:
    """A new session for ``token`` (already authenticated); returns the id the cookie carries."""
    s.execute(delete(DashboardSession).where(DashboardSession.expires_at <= now))
    session_id = secrets.token_urlsafe(32)
    s.add(
        DashboardSession(
            id_hmac=session_digest(key, session_id), token_sha256=sha256(token), created_at=now,
            expires_at=now + ttl,
        )
    )
    return session_id


def session_token(s: Session, session_id: str, now: datetime, *, key: bytes) -> str | None:
    """The SHA-256 of the token a live session was made with; None for an unknown or expired one."""
    found: str | None = s.scalar(
        select(DashboardSession.token_sha256).where(
            DashboardSession.id_hmac == session_digest(key, session_id), DashboardSession.expires_at > now
        )
    )
    return found


def end_session(s: Session, session_id: str, key: bytes) -> None:
    s.execute(delete(DashboardSession).where(DashboardSession.id_hmac == session_digest(key, session_id)))
