"""The ``control`` rows the engine decides on, typed: the pause, the storm breaker's latch and the
last machine action. Each row is one JSON value; these records declare its keys (read tolerantly and
written in the same shape: :class:`remediation.domain.record.JsonRecord`). The API and the CLI show
the stored JSON as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from remediation.domain.record import JsonRecord


def _when(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


@dataclass(frozen=True)
class PauseState(JsonRecord):
    """Row ``paused``: all automation stops while ``paused`` (a human's lever, or a fault in our own
    plumbing: services.holds)."""

    paused: bool | None = None
    by: str | None = None  # the human, or "system"
    reason: str | None = None  # for people
    at: str | None = None  # ISO time of the pause or the resume
    # -- a pause the system took on a fault (services.holds.pause)
    error_kind: str | None = None
    self_healing: bool | None = None  # the health probe may resume it (a dependency that heals by itself)
    component: str | None = None  # what the probe asks: "slurm" or "kubernetes"
    node: str | None = None  # the node whose step met the fault (the probe asks about it)
    remediation: int | None = None
    probe_ok: int | None = None  # answers in a row since the last failed probe
    probe_error: str | None = None  # the last failed probe's error, for people
    probed_at: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def why(self) -> str:
        """Who paused and why, for admission's verdict."""
        return ": ".join(x for x in (self.by, self.reason) if x) if self.paused else ""


@dataclass(frozen=True)
class BreakerLatch(JsonRecord):
    """Row ``breaker``: the storm breaker's latch (services.breaker)."""

    open: bool | None = None
    reason: str | None = None  # why it opened, for people
    at: str | None = None  # ISO time it opened
    failed: int | None = None  # failures in the window when it opened
    pool: int | None = None  # nodes in the pool then
    closed_at: str | None = None  # ISO time of the last close: the window counts from there
    closed_by: str | None = None
    close_reason: str | None = None
    opened_at: str | None = None  # kept on a closed latch: when it had opened
    open_reason: str | None = None  # and why
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def closed(self) -> datetime | None:
        """When it was last closed, while it is closed."""
        return None if self.open else _when(self.closed_at)


@dataclass(frozen=True)
class LastMachineAction(JsonRecord):
    """Row ``last_vm_action``: the minimum gap between machine actions counts from it."""

    at: str | None = None  # ISO time the last machine action was admitted
    remediation: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def when(self) -> datetime | None:
        return _when(self.at)
