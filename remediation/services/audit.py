"""The audit log: one row per lever pulled, by a human or by the service, with actor and reason.

Each row also says which door the lever came through (``via``): the lever service marks its sessions
with :func:`through` (``api`` for the API and the dashboard, ``db`` for the CLI in direct database
mode); a row written in a session nobody marked is the service's own (``service``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from sqlalchemy.orm import Session

from remediation.db.models import AuditLog

VIA = "audit_via"  # the key in Session.info
Via = Literal["api", "db", "service"]


def through(session: Session, via: Via) -> Session:
    """Mark ``session`` so every audit row written in it records ``via``."""
    session.info[VIA] = via
    return session


def audit(
    session: Session,
    at: datetime,
    actor: str,
    *,
    action: str,
    target: str = "",
    reason: str = "",
    detail: dict[str, Any] | None = None,
    dry_run: bool = False,
) -> AuditLog:
    """Append one row (returned, for a caller that hands its id on). A row written in dry-run says so
    twice: ``dry_run`` is set, and the reason reads "would ..." (see :func:`would`), so nobody mistakes
    it for something that happened."""
    row = AuditLog(at=at, actor=actor, action=action, target=target,
                   reason=would(reason) if dry_run else reason, detail=detail or {}, dry_run=dry_run,
                   via=session.info.get(VIA, "service"))
    session.add(row)
    return row


def would(text: str) -> str:
    """How a dry-run row reads: "would (dry-run): drained; no jobs running"."""
    return text if text.startswith("would") else f"would (dry-run): {text}"
