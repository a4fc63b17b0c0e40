"""The read models' rows: what every on-call surface (CLI, JSON API, dashboard) is handed.

Plain dataclasses, no ORM objects, so nothing lazy-loads after the session closes, and FastAPI uses
them as its response models, which is what the OpenAPI spec documents. They are kept apart from the
queries that fill them (:mod:`remediation.services.readmodels`, which is also where callers import
them from) so that each module reads as one thing: the shapes here, the questions there.
:func:`jsonable` turns any of them into JSON-ready values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from remediation.domain.episodes import EpisodeRow
from remediation.validation.service import ValidationRow
from remediation.vocabulary import DEFAULT_CLUSTER


class ReadModelError(ValueError):
    """A bad on-call request (unknown filter value...); the message is one readable sentence."""


class RecordNotFound(ReadModelError):
    """The node, remediation or item asked for does not exist."""


@dataclass
class NodeRow:
    name: str
    status: str
    status_reason: str
    updated_at: datetime
    last_event_at: datetime | None
    quarantined_at: datetime | None
    quarantine_reason: str | None
    released_at: datetime | None
    open_remediation: int | None = None
    step: str | None = None
    wait_reason: str | None = None
    lemon_score: float = 0.0  # decayed, class-weighted failures (remediation.domain.lemon)
    lemon: str = ""  # the score's explanation
    profile: str | None = None  # the profile that governs it now (None: the base policy)
    cluster: str = DEFAULT_CLUSTER  # a node is (cluster, name)


@dataclass
class EventRow:
    id: int
    observed_at: datetime
    received_at: datetime
    source: str
    node: str
    kind: str
    state: str
    reason: str
    reason_user: str | None
    decision: str
    decision_reason: str
    remediation_id: int | None
    cluster: str = DEFAULT_CLUSTER


@dataclass
class StepRow:
    id: int
    step: str
    attempt: int
    status: str
    started_at: datetime
    finished_at: datetime | None
    duration_s: float | None
    checks: int
    retries: int
    outcome: str | None
    error: str | None
    error_kind: str | None
    provider_op: dict[str, Any] | None


@dataclass
class RemediationRow:
    id: int
    node: str
    status: str
    step: str
    cause: str
    source: str
    ladder: int
    opened_at: datetime
    updated_at: datetime
    closed_at: datetime | None
    next_run_at: datetime | None
    duration_s: float | None
    wait_reason: str | None
    outcome: str | None
    fault_class: str | None = None  # the cause's class, why, and the action its ladder chose
    fault_evidence: str | None = None
    action: str | None = None
    profile: str | None = None  # the profile it opened under (None: the base policy)
    dry_run: bool = False  # opened in dry-run or in a shadow profile: it only records what it would do
    cluster: str = DEFAULT_CLUSTER


@dataclass
class EvidenceItemRow:
    """One item of collected evidence, without its content (see ``remediation remediations evidence``)."""

    id: int
    step_id: int
    name: str
    status: str  # remediation.evidence_collection.rules.EvidenceStatus
    exit_code: int | None
    duration_s: float | None
    size_bytes: int  # what is kept (in the row, the directory or the bucket)
    truncated: bool  # the command wrote more than is kept
    sha256: str  # of what is kept
    where: str  # "database", or its location: dir:KEY or s3://BUCKET/KEY
    collected_at: datetime
    head: list[str] = field(default_factory=list)  # an item kept in its row: its first lines


@dataclass
class RemediationDetail(RemediationRow):
    context: dict[str, Any] = field(default_factory=dict)
    policy: dict[str, Any] | None = None  # the effective policy it recorded when it opened, and runs under
    steps: list[StepRow] = field(default_factory=list)
    event: EventRow | None = None
    evidence_items: list[EvidenceItemRow] = field(default_factory=list)  # collected evidence, newest step first
    evidence_note: str | None = None  # no item kept: what its collect_evidence step said ("no evidence: ...")


@dataclass
class AuditRow:
    id: int
    at: datetime
    actor: str
    action: str
    target: str
    reason: str
    detail: dict[str, Any]
    via: str | None = None  # api, db or service (None: written before the door was recorded)
    cluster: str = DEFAULT_CLUSTER


@dataclass
class RejectedRow:
    id: int
    received_at: datetime
    error: str
    payload: str
    cluster: str = DEFAULT_CLUSTER


@dataclass
class TimelineEntry:
    """One line of a node's story, in time order: an event, a remediation opening or closing, a step,
    or a human/automated action from the audit log."""

    at: datetime
    kind: str  # event | remediation | step | audit
    title: str
    detail: str
    remediation_id: int | None = None
    duration_s: float | None = None
    error: str | None = None
    status: str | None = None


@dataclass
class CheckpointRow:
    """The checkpoint request the drain waits on (:mod:`remediation.domain.checkpoint`), as recorded
    on its step row; ``text`` is rendered from these fields, never the other way round."""

    jobs: list[str]
    signal: str
    scope: str
    asked_at: datetime
    wait_s: int
    sent: bool | None  # True: scancel answered; False/None: a worker stopped while sending (not resent)
    dry_run: bool  # recorded by the dry-run twin: nothing was sent
    text: str  # "asked job 123 to checkpoint (USR1) 40 s ago; waiting up to 300 s"
    target: str = "jobs"  # jobs (Slurm, signalled; ``jobs`` holds their ids) or pods (annotated; ns/name)


@dataclass
class NvlinkRow:
    """A node's NVLink domain as each source names it (:mod:`remediation.domain.nvlink`), and how the
    sources disagree (empty: they agree, or only one speaks)."""

    block: str | None = None  # Slurm's topology/block block: what Slurm actions follow
    label: str | None = None  # the Node's nvidia.com/gpu.clique label
    gpus: str | None = None  # the clique its GPUs named in the latest GPU check
    checked_at: datetime | None = None  # when that check ended
    disagreements: list[str] = field(default_factory=list)
    block_size: int | None = None  # the block's smallest block size (Slurm's BlockSizes), when known
    block_healthy: int | None = None  # how many of the block's nodes are healthy
    partial: bool = False  # fewer than block_size: no job of the block's size fits there now
    health: str | None = None  # the last three, in words
    repair: str | None = None  # the latest domain repair of its domain, in words (id, status, step)


@dataclass
class NodeDetail:
    node: NodeRow
    remediations: list[RemediationDetail]
    events: list[EventRow]
    quarantine_history: list[AuditRow]
    audit: list[AuditRow]
    timeline: list[TimelineEntry]
    episodes: list[EpisodeRow] = field(default_factory=list)  # what the repeat-offender rule counts
    validations: list[ValidationRow] = field(default_factory=list)  # the validation's latest checks
    checkpoint: CheckpointRow | None = None  # the request the drain waits on, while it waits
    nvlink: NvlinkRow | None = None  # its NVLink domain, when any source names one


@dataclass
class ClusterState:
    """One cluster as on-call sees it first: can automation act there, and how much is wrong."""

    name: str
    nodes: int = 0
    unhealthy: int = 0  # unhealthy or remediating
    quarantined: int = 0
    open_remediations: int = 0
    paused: bool = False
    paused_detail: dict[str, Any] = field(default_factory=dict)  # by whom, why, since when
    breaker_open: bool = False
    breaker_detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Overview:
    nodes_by_status: dict[str, int]
    remediations_by_status: dict[str, int]
    in_flight: int
    quarantined: int
    paused: bool
    paused_detail: dict[str, Any]
    breaker_open: bool
    breaker_detail: dict[str, Any]
    last_event_at: datetime | None
    queue_depth: dict[str, int] | None = None
    validation: dict[str, Any] = field(default_factory=dict)  # the validation's summary (services.validation)
    gate: dict[str, Any] = field(default_factory=dict)  # validation's old name in the API, kept for scrapers
    clusters: list[ClusterState] = field(default_factory=list)  # every cluster the view covers, with its state


def jsonable(obj: Any) -> Any:
    """Dataclasses, datetimes and containers to JSON-ready values (ISO 8601 times, UTC)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, datetime | date):
        return obj.isoformat()
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    return obj
