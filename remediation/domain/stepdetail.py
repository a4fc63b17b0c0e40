"""The keys of a step row's ``detail`` that the engine and the step bodies decide on, typed.

Most of ``detail`` is a free-form record for people; the few keys a later run of the same step reads
back are declared here, each group with the module that owns it, read tolerantly (missing or
malformed reads as "nothing recorded") and merged into the rest on write.

Why: docs/architecture.md#typed-records-kept-as-json
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

#: A step row's ``detail`` as stored: JSON, whoever wrote it.
Stored = Mapping[str, object]
#: What a record adds to a row's ``detail`` (JSON values).
Json = dict[str, object]


def read_time(value: object) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) and value else None
    except ValueError:
        return None


def read_number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_text(value: object) -> str:
    return value if isinstance(value, str) else ""


def read_strs(value: object) -> tuple[str, ...] | None:
    """A stored list of ids (jobs, pods) as strings; None when there is no list."""
    return tuple(str(v) for v in value) if isinstance(value, list | tuple) else None


@dataclass(frozen=True)
class RetryState:
    """The engine's bookkeeping of transient errors on one attempt (services.workflow)."""

    streak: int = 0  # errors in a row since the step's call last answered; 0: none
    failing_since: datetime | None = None  # the first error of the streak
    retry_after: float | None = None  # the server's Retry-After of the last error, seconds
    retry_at: datetime | None = None  # the retry is due then; a delivery before it is dropped

    @classmethod
    def load(cls, detail: Stored | None) -> RetryState:
        detail = detail or {}
        streak = read_number(detail.get("streak"))
        return cls(int(streak or 0), read_time(detail.get("failing_since")), read_number(detail.get("retry_after")),
                   read_time(detail.get("retry_at")))

    def dump(self) -> Json:
        return {
            "streak": self.streak,
            "failing_since": self.failing_since.isoformat() if self.failing_since else None,
            "retry_after": self.retry_after,
            "retry_at": self.retry_at.isoformat() if self.retry_at else None,
        }

    @classmethod
    def cleared(cls, detail: Stored | None, keep_retry_record: bool = False) -> Json:
        """``detail`` without the streak (a success ended it, or a hold took over). The retry's own
        record (the last Retry-After and when the retry was due) stays unless a hold replaces it."""
        gone = ("streak", "failing_since") if keep_retry_record else ("streak", "failing_since", "retry_at")
        return {k: v for k, v in (detail or {}).items() if k not in gone}


class HoldScope(StrEnum):
    """Whose error held an attempt: the system's (automation paused), or nobody's yet (unmapped)."""

    SYSTEM = "system"
    UNMAPPED = "unmapped"


@dataclass(frozen=True)
class ErrorHold:
    """An error that is not the node's held the attempt (services.holds), and since when."""

    scope: HoldScope
    held_at: datetime

    @classmethod
    def load(cls, detail: Stored | None) -> ErrorHold | None:
        detail = detail or {}
        scope, at = detail.get("scope"), read_time(detail.get("held_at"))
        if at is None or scope not in (HoldScope.SYSTEM.value, HoldScope.UNMAPPED.value):
            return None
        return cls(HoldScope(str(scope)), at)

    def dump(self) -> Json:
        return {"scope": self.scope.value, "held_at": self.held_at.isoformat()}


_NONCE = re.compile(r"[0-9a-f]{8,32}")


@dataclass(frozen=True)
class JobNonce:
    """The random part of the names of a job a step runs on the node (the GPU check, a GPU reset).

    The engine writes it when it makes the step row, committed before the step body runs, so it is
    recorded before any job is submitted and every later run of the attempt reads the same one. A job
    is ours because we recorded its id and this part of its name: a job that merely bears a name we
    would use (the remediation id and attempt are easy to guess, and come round again after a database
    restore) is someone else's. A row made before the nonce was recorded reads as none."""

    value: str = ""

    @classmethod
    def new(cls) -> JobNonce:
        return cls(secrets.token_hex(5))

    @classmethod
    def load(cls, detail: Stored | None) -> JobNonce:
        value = (detail or {}).get("nonce")
        return cls(value) if isinstance(value, str) and _NONCE.fullmatch(value) else cls()

    def dump(self) -> Json:
        return {"nonce": self.value} if self.value else {}


@dataclass(frozen=True)
class HeldTime:
    """Time an attempt spent held (services.workflow): a pause, a breaker or another admission refusal,
    or a system error's hold. A step's timeout counts its own time only, never what it did not have:
    ``elapsed`` takes ``held_s`` off, and a hold still under way (``held_since``) is added when it ends."""

    held_s: float = 0.0  # holds that ended, in seconds
    held_since: datetime | None = None  # the hold under way began then; None: not held

    @classmethod
    def load(cls, detail: Stored | None) -> HeldTime:
        detail = detail or {}
        return cls(read_number(detail.get("held_s")) or 0.0, read_time(detail.get("held_since")))

    def dump(self) -> Json:
        return {"held_s": round(self.held_s, 3),
                "held_since": self.held_since.isoformat() if self.held_since else None}

    def holding(self, now: datetime) -> HeldTime:
        """Held from ``now`` on, unless a hold is already under way (it began earlier)."""
        return self if self.held_since is not None else HeldTime(self.held_s, now)

    def resumed(self, now: datetime) -> HeldTime:
        """The hold under way (if any) ended at ``now``: its time joins ``held_s``."""
        if self.held_since is None:
            return self
        return HeldTime(self.held_s + max(0.0, (now - self.held_since).total_seconds()), None)
