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
    dry_run: bool = False,
) -> None:
    """Append one row. A row written in dry-run says so twice: ``dry_run`` is set, and the reason
    reads "would ..." (see :func:`would`), so nobody mistakes it for something that happened."""
    session.add(AuditLog(at=at, actor=actor, action=action, target=target,
                         reason=would(reason) if dry_run else reason, detail=detail or {}, dry_run=dry_run))


def would(text: str) -> str:
    """How a dry-run row reads: "would (dry-run): drained; no jobs running"."""
    return text if text.startswith("would") else f"would (dry-run): {text}"
