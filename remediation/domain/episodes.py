"""A node's fault episodes, with the evidence for each: the read model behind ``nodes show``.

An episode is one remediation and every signal it explains (linked by ``events.remediation_id``),
from its first bad signal to its verified recovery plus ``policy.settle_s``; the repeat-offender rule
counts episodes, not events. Built from rows :func:`remediation.services.readmodels.node_detail`
already read; no query of its own.

Why: docs/policy.md#every-signal-is-explained-before-it-is-counted-no-phantom-faults
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from remediation.domain.events import EventKind
from remediation.domain.policy import DecisionKind
from remediation.domain.statemachine import OPEN_STATUSES, Step
from remediation.domain.states import StepStatus


class _Event(Protocol):
    id: int
    observed_at: datetime
    kind: str
    decision: str
    remediation_id: int | None


class _Step(Protocol):
    step: str
    status: str
    finished_at: datetime | None


class _Remediation(Protocol):
    id: int
    status: str
    cause: str
    outcome: str | None
    opened_at: datetime
    closed_at: datetime | None

    @property
    def steps(self) -> Sequence[_Step]: ...


@dataclass
class EpisodeRow:
    """One fault episode of a node: one remediation and the signals it explains."""

    remediation_id: int
    state: str  # open (the remediation runs), settling (within settle_s of its close) or over
    outcome: str  # the remediation's status: running, succeeded, quarantined...
    cause: str
    started_at: datetime  # its first bad signal
    recovered_at: datetime | None  # the verify that proved the node healthy (None: never)
    settles_at: datetime | None  # recovery or close + settle_s: until then our echoes are its own
    counted: bool  # counts toward the repeat-offender limit now (real, inside the window, after any release)
    signals: int  # the events it explains
    attributed: int  # of which caused by its own actions
    evidence: list[int] = field(default_factory=list)  # those events' ids, oldest first


def episodes(
    rems: Iterable[_Remediation], events: Iterable[_Event], now: datetime, *, settle: timedelta,
    window: timedelta, released_at: datetime | None,
) -> list[EpisodeRow]:
    """The node's episodes, newest first."""
    by_rem: dict[int, list[_Event]] = {}
    for e in sorted(events, key=lambda e: e.observed_at):
        if e.remediation_id is not None:
            by_rem.setdefault(e.remediation_id, []).append(e)
    out = []
    for r in rems:
        linked = by_rem.get(r.id, [])
        bad = [e.observed_at for e in linked if e.kind == EventKind.UNHEALTHY]
        verified = [s.finished_at for s in r.steps if s.step == Step.VERIFY and s.status == StepStatus.DONE and s.finished_at]
        settles = r.closed_at + settle if r.closed_at is not None else None
        state = "open" if r.status in OPEN_STATUSES else ("settling" if settles and now < settles else "over")
        out.append(EpisodeRow(
            remediation_id=r.id, state=state, outcome=r.status, cause=r.cause,
            started_at=min([r.opened_at, *bad]), recovered_at=max(verified, default=None),
            settles_at=settles,
            counted=not getattr(r, "dry_run", False) and r.opened_at > now - window
            and (released_at is None or r.opened_at > released_at),
            signals=len(linked), attributed=sum(e.decision == DecisionKind.ATTRIBUTED for e in linked),
            evidence=[e.id for e in linked],
        ))
    return sorted(out, key=lambda x: x.started_at, reverse=True)
