"""Dashboard sessions, kept in the database so that every API replica shares them.

A login makes a random id held only in the browser's HttpOnly cookie; the row keeps the id's
HMAC-SHA-256 under ``api.session_key``, the SHA-256 of the token that logged in, and an expiry. A
session ends when it expires, at logout, when its token is no longer configured, or when the key
changes. Expired rows are removed at each login.

Why: docs/architecture.md#dashboard-sessions-a-stolen-table-opens-nothing
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
