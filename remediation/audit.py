"""The audit log: one row per lever pulled, by a human or by the service, with actor and reason."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from remediation.db.models import AuditLog


def audit(
    session: Session,
    at: datetime,
    actor: str,
    action: str,
    target: str = "",
    reason: str = "",
    detail: dict[str, Any] | None = None,
) -> None:
    session.add(AuditLog(at=at, actor=actor, action=action, target=target, reason=reason, detail=detail or {}))
