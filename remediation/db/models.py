"""SQLAlchemy 2 models: the faulty-node database.

Postgres is the real target; SQLite works for the embedded default. Both honour the partial unique
index that allows one *open* remediation per node, which makes opening a remediation safe to race.
Each table's purpose is listed in the docs.

Why: docs/architecture.md#the-faulty-node-database-one-table-per-fact
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Enum,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from remediation.domain.context import RemediationContext
from remediation.domain.events import EventKind, Source
from remediation.domain.statemachine import OPEN_STATUSES, NodeStatus, RemediationStatus, Step
from remediation.domain.states import AuditAction, IncidentStatus, StepStatus, ValidationOutcome
from remediation.domain_repair.rules import DomainRepairStatus, DomainStep
from remediation.evidence_collection.rules import EvidenceStatus
from remediation.repair_requests.rules import OPEN_REPAIRS, DeliveryStatus, RepairStatus
from remediation.vocabulary import DEFAULT_CLUSTER

# BigInteger primary keys autoincrement on SQLite only as INTEGER.
BigId = BigInteger().with_variant(Integer(), "sqlite")
Json = JSON()


def state_type(enum: type[StrEnum], length: int) -> Enum:
    """A column holding one of ``enum``'s values: VARCHAR(``length``) in the database (no type, no
    CHECK, no migration), the enum's member in Python, and a value outside it refused on write."""
    return Enum(enum, native_enum=False, create_constraint=False, length=length, validate_strings=True,
                values_callable=lambda e: [m.value for m in e])


_open_list = ", ".join(f"'{s}'" for s in sorted(OPEN_STATUSES))
OPEN_PREDICATE = text(f"status IN ({_open_list})")
_repairing = ", ".join(f"'{s}'" for s in sorted(OPEN_REPAIRS | {RepairStatus.RECHECKING}))
REPAIR_OPEN = text(f"status IN ({_repairing})")


class Base(DeclarativeBase):
    type_annotation_map = {datetime: DateTime(timezone=True), dict[str, Any]: Json}


def cluster_column(*, primary_key: bool = False) -> Mapped[str]:
    """The cluster a row belongs to: filled from its session's scope (:mod:`remediation.db.scope`), else
    ``default``, the name every row written before clusters had names was given."""
    return mapped_column(String(63), primary_key=primary_key, default=DEFAULT_CLUSTER,
                         server_default=DEFAULT_CLUSTER, index=not primary_key)


class ClusterScoped:
    """A table whose rows each belong to one cluster. A session scoped to a cluster reads, updates and
    deletes only that cluster's rows, and writes its new rows there (:mod:`remediation.db.scope`). A
    table whose key names the cluster declares its own column."""

    cluster: Mapped[str] = cluster_column()


class Node(ClusterScoped, Base):
    __tablename__ = "nodes"

    cluster: Mapped[str] = cluster_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    status: Mapped[NodeStatus] = mapped_column(state_type(NodeStatus, 32), default=NodeStatus.HEALTHY, index=True)
    status_reason: Mapped[str] = mapped_column(Text, default="")
    first_seen_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    last_event_at: Mapped[datetime | None]
    quarantined_at: Mapped[datetime | None]
    quarantine_reason: Mapped[str | None] = mapped_column(Text)
    # A human release restarts the repeat-offender count: failures before it are forgiven.
    released_at: Mapped[datetime | None]
    # What a profile selects on, as the watchers last reported it (NULL: not reported yet).
    partitions: Mapped[list[str] | None] = mapped_column(Json)
    features: Mapped[list[str] | None] = mapped_column(Json)
    labels: Mapped[dict[str, str] | None] = mapped_column(Json)
    # The profile that governs the node now (NULL: the base policy): its pool, for the profile's breaker.
    profile: Mapped[str | None] = mapped_column(String(63), index=True)
    # When a watcher's resync last listed the node (NULL: never): the breaker's pool (services/pool.py).
    confirmed_at: Mapped[datetime | None] = mapped_column(index=True)


class Event(ClusterScoped, Base):
    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_node_observed", "cluster", "node", "observed_at"),
        UniqueConstraint("cluster", "dedupe_key", name="uq_events_cluster_dedupe_key"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = cluster_column()
    dedupe_key: Mapped[str] = mapped_column(String(512))
    source: Mapped[Source] = mapped_column(state_type(Source, 16))
    node: Mapped[str] = mapped_column(String(253))
    kind: Mapped[EventKind] = mapped_column(state_type(EventKind, 16))
    state: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text, default="")
    reason_user: Mapped[str | None] = mapped_column(String(128))
    observed_at: Mapped[datetime] = mapped_column(index=True)
    published_at: Mapped[datetime | None]
    received_at: Mapped[datetime]
    decision: Mapped[str] = mapped_column(String(32), default="")
    decision_reason: Mapped[str] = mapped_column(Text, default="")
    remediation_id: Mapped[int | None] = mapped_column(BigId)


class RejectedEvent(ClusterScoped, Base):
    __tablename__ = "rejected_events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = cluster_column()  # the cluster whose stream the payload was read from
    received_at: Mapped[datetime] = mapped_column(index=True)
    payload: Mapped[str] = mapped_column(Text)
    error: Mapped[str] = mapped_column(Text)


class Remediation(ClusterScoped, Base):
    __tablename__ = "remediations"
    __table_args__ = (
        Index(
            "uq_remediations_one_open_per_node",
            "cluster",
            "node",
            unique=True,
            postgresql_where=OPEN_PREDICATE,
            sqlite_where=OPEN_PREDICATE,
        ),
        Index("ix_remediations_node_opened", "cluster", "node", "opened_at"),
        Index("ix_remediations_status_next", "status", "next_run_at"),
        # The storm breaker's window (admission, on every claim) and the newest opening.
        Index("ix_remediations_incident_opened", "incident_id", "opened_at"),
        Index("ix_remediations_opened", "opened_at"),
        ForeignKeyConstraint(["cluster", "node"], ["nodes.cluster", "nodes.name"], name="fk_remediations_node"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = cluster_column()
    node: Mapped[str] = mapped_column(String(253))
    cause: Mapped[str] = mapped_column(Text)
    source: Mapped[Source] = mapped_column(state_type(Source, 16))
    status: Mapped[RemediationStatus] = mapped_column(state_type(RemediationStatus, 16))
    step: Mapped[Step] = mapped_column(state_type(Step, 32))
    ladder: Mapped[int] = mapped_column(Integer, default=0)
    opened_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    closed_at: Mapped[datetime | None]
    next_run_at: Mapped[datetime | None]
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_until: Mapped[datetime | None]
    event_id: Mapped[int | None] = mapped_column(BigId)
    outcome: Mapped[str | None] = mapped_column(Text)
    wait_reason: Mapped[str | None] = mapped_column(Text)
    # The JSON of a RemediationContext: read and write it through ``ctx``.
    context: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # Opened while the service ran in dry-run: never counted by the repeat-offender rule or the breaker.
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    # Folded into a topology-correlated incident: no VM action, never a repeat-offender count.
    incident_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("incidents.id"), index=True)
    # The fault's class (remediation.domain.causes), why, and the action now chosen for it
    # (restart, move-host, reimage, none, quarantine). NULL on rows from before classification.
    fault_class: Mapped[str | None] = mapped_column(String(32))
    fault_evidence: Mapped[str | None] = mapped_column(Text)
    action: Mapped[str | None] = mapped_column(String(32))
    # The profile that governed the node when this opened (NULL: the base policy) and that effective
    # policy itself (remediation.profiles.settings.EffectivePolicy), read until the remediation ends.
    # NULL policy on rows from before profiles: they run under today's configuration.
    profile: Mapped[str | None] = mapped_column(String(63), index=True)
    policy: Mapped[dict[str, Any] | None] = mapped_column(Json)

    steps: Mapped[list[RemediationStep]] = relationship(
        back_populates="remediation", order_by="RemediationStep.id", lazy="selectin"
    )

    @property
    def ctx(self) -> RemediationContext:
        """The context, typed (rows written before it was typed read the same)."""
        return RemediationContext.load(self.context)

    @ctx.setter
    def ctx(self, value: RemediationContext) -> None:
        self.context = value.dump()


class RemediationStep(Base):
    __tablename__ = "remediation_steps"
    __table_args__ = (Index("ix_steps_remediation", "remediation_id", "step", "attempt"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    remediation_id: Mapped[int] = mapped_column(BigId, ForeignKey("remediations.id"))
    step: Mapped[Step] = mapped_column(state_type(Step, 32))
    attempt: Mapped[int] = mapped_column(Integer)
    idempotency_key: Mapped[str] = mapped_column(String(128), unique=True)
    status: Mapped[StepStatus] = mapped_column(state_type(StepStatus, 16))
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    checks: Mapped[int] = mapped_column(Integer, default=0)
    retries: Mapped[int] = mapped_column(Integer, default=0)
    outcome: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    error_kind: Mapped[str | None] = mapped_column(String(64))
    provider_op: Mapped[dict[str, Any] | None] = mapped_column(Json)
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))

    remediation: Mapped[Remediation] = relationship(back_populates="steps")


class AuditLog(ClusterScoped, Base):
    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = cluster_column()
    at: Mapped[datetime] = mapped_column(index=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[AuditAction] = mapped_column(state_type(AuditAction, 64))
    target: Mapped[str] = mapped_column(String(253), default="", index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    # Which door: api (a named token's lever), db (the CLI in direct database mode), service (automation);
    # NULL on rows written before migration 0006.
    via: Mapped[str | None] = mapped_column(String(8))


class Control(ClusterScoped, Base):
    __tablename__ = "control"

    cluster: Mapped[str] = cluster_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict[str, Any]] = mapped_column(default=dict)
    updated_at: Mapped[datetime]


class NodeDomain(ClusterScoped, Base):
    """A node's failure domain as one source reports it (``slurm``: topology.conf switches;
    ``kubernetes``: Node labels). A source's report replaces its earlier rows for that node."""

    __tablename__ = "node_domains"
    __table_args__ = (Index("ix_node_domains_domain", "cluster", "kind", "name"),)

    cluster: Mapped[str] = cluster_column(primary_key=True)
    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    source: Mapped[str] = mapped_column(String(16), primary_key=True)
    kind: Mapped[str] = mapped_column(String(253), primary_key=True)
    name: Mapped[str] = mapped_column(String(253))
    # A topology/block block's smallest block size (Slurm's BlockSizes); NULL for other domains.
    size: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime]


class Incident(ClusterScoped, Base):
    """Nodes of one failure domain that failed together (see remediation.incidents.service)."""

    __tablename__ = "incidents"
    __table_args__ = (Index("ix_incidents_status_domain", "status", "kind", "name"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = cluster_column()
    kind: Mapped[str] = mapped_column(String(253))
    name: Mapped[str] = mapped_column(String(253))
    cause: Mapped[str] = mapped_column(Text)  # the likely cause on-call is told (leaf switch, zone...)
    status: Mapped[IncidentStatus] = mapped_column(state_type(IncidentStatus, 16), index=True)
    nodes: Mapped[list[str]] = mapped_column(Json, default=list)
    domain_size: Mapped[int] = mapped_column(Integer, default=0)
    opened_at: Mapped[datetime] = mapped_column(index=True)
    updated_at: Mapped[datetime]
    closed_at: Mapped[datetime | None]
    closed_by: Mapped[str | None] = mapped_column(String(128))
    close_reason: Mapped[str | None] = mapped_column(Text)
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))


REPAIRING = text(f"status = '{DomainRepairStatus.RUNNING.value}'")


class DomainRepair(ClusterScoped, Base):
    """One repair of a whole NVLink domain (see remediation.domain_repair): its trays, its ladder, where
    it is. One runs per domain at a time; a tray's signal while it runs joins it."""

    __tablename__ = "domain_repairs"
    __table_args__ = (
        Index("uq_domain_repairs_one_running", "cluster", "kind", "name", unique=True,
              postgresql_where=REPAIRING, sqlite_where=REPAIRING),
        Index("ix_domain_repairs_status_next", "status", "next_run_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = cluster_column()
    kind: Mapped[str] = mapped_column(String(253))  # block, or the clique label
    name: Mapped[str] = mapped_column(String(253))
    trays: Mapped[list[str]] = mapped_column(Json, default=list)  # every tray of the domain, sorted
    size: Mapped[int] = mapped_column(Integer)  # len(trays): what it counts as for admission
    reporters: Mapped[list[str]] = mapped_column(Json, default=list)  # the trays whose signals opened or joined it
    cause: Mapped[str] = mapped_column(Text)  # the signal that opened it
    source: Mapped[Source] = mapped_column(state_type(Source, 16), default=Source.SLURM)  # who reported it
    fault_class: Mapped[str] = mapped_column(String(32))
    fault_evidence: Mapped[str | None] = mapped_column(Text)
    status: Mapped[DomainRepairStatus] = mapped_column(state_type(DomainRepairStatus, 16), index=True)
    step: Mapped[DomainStep] = mapped_column(state_type(DomainStep, 32))
    rung: Mapped[int] = mapped_column(Integer, default=0)
    rungs: Mapped[list[str]] = mapped_column(Json, default=list)  # the ladder chosen when it opened
    ours: Mapped[list[str]] = mapped_column(Json, default=list)  # the trays whose drain is ours to give back
    opened_at: Mapped[datetime] = mapped_column(index=True)
    updated_at: Mapped[datetime]
    next_run_at: Mapped[datetime]
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_until: Mapped[datetime | None]
    closed_at: Mapped[datetime | None]
    close_reason: Mapped[str | None] = mapped_column(Text)
    wait_reason: Mapped[str | None] = mapped_column(Text)  # what it waits for now (admission, jobs, a check)
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))

    steps: Mapped[list[DomainRepairStep]] = relationship(back_populates="repair", order_by="DomainRepairStep.id")


class DomainRepairStep(Base):
    """One step of a domain repair, written before it acts and closed after: what it started (its jobs,
    the chassis reset), and how it ended."""

    __tablename__ = "domain_repair_steps"
    __table_args__ = (Index("ix_domain_repair_steps_repair", "repair_id", "step", "attempt"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    repair_id: Mapped[int] = mapped_column(BigId, ForeignKey("domain_repairs.id"))
    step: Mapped[DomainStep] = mapped_column(state_type(DomainStep, 32))
    attempt: Mapped[int] = mapped_column(Integer)
    idempotency_key: Mapped[str] = mapped_column(String(128), unique=True)
    status: Mapped[StepStatus] = mapped_column(state_type(StepStatus, 16))
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    outcome: Mapped[str | None] = mapped_column(Text)
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)
    provider_op: Mapped[dict[str, Any] | None] = mapped_column(Json)  # the rack reset's intent, then its record
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))

    repair: Mapped[DomainRepair] = relationship(back_populates="steps")


class Validation(ClusterScoped, Base):
    """One GPU check run by the validation (the ``validate`` step, or a human's ``remediation validate``
    / ``release --validate``): what ran, how it ended, and the end of its output."""

    __tablename__ = "validations"
    __table_args__ = (Index("ix_validations_node_started", "node", "started_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = cluster_column()
    remediation_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("remediations.id"), index=True)
    node: Mapped[str] = mapped_column(String(253))
    backend: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(128))  # reservation / job / Job name
    cause_class: Mapped[str] = mapped_column(String(32), default="unknown")
    command: Mapped[str] = mapped_column(Text)  # the argument list, joined by spaces for display
    outcome: Mapped[ValidationOutcome] = mapped_column(state_type(ValidationOutcome, 16), index=True)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(index=True)
    finished_at: Mapped[datetime]
    duration_s: Mapped[float] = mapped_column(default=0.0)
    output_tail: Mapped[str] = mapped_column(Text, default="")  # the last validation.output_bytes
    actor: Mapped[str] = mapped_column(String(128), default="")
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))


class DashboardSession(Base):
    """A dashboard login. The browser's cookie holds a random id; this row holds only its HMAC under
    the server's ``api.session_key``, so a copy of the table opens no session, and the SHA-256 of the
    token that logged in, checked against the configured tokens on every request."""

    __tablename__ = "dashboard_sessions"

    id_hmac: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_sha256: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime] = mapped_column(index=True)


class LeaderFence(ClusterScoped, Base):
    """The highest fencing token the ingest has seen for one leader lock; an event with a lower one
    was published by a leader that had already been replaced, and is dropped (``fenced`` counts them)."""

    __tablename__ = "leader_fences"

    cluster: Mapped[str] = cluster_column(primary_key=True)
    lock: Mapped[str] = mapped_column(String(32), primary_key=True)
    token: Mapped[int] = mapped_column(BigInteger)
    fenced: Mapped[int] = mapped_column(BigInteger, default=0)
    raised_at: Mapped[datetime]


class HardwareSighting(ClusterScoped, Base):
    """One read of the hardware a node name stood on (see :mod:`remediation.domain.hardware`): the
    machine's identity before and after a machine action and at a quarantine, or the GPUs a GPU check
    named (``gpus``: a list of ``{"uuid", "serial"}``, with ``"clique"``, the GPU's NVLink domain, when
    nvidia-smi named one)."""

    __tablename__ = "hardware_sightings"
    __table_args__ = (Index("ix_hardware_sightings_node_at", "node", "at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = cluster_column()
    node: Mapped[str] = mapped_column(String(253))
    at: Mapped[datetime]
    remediation_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("remediations.id"), index=True)
    step: Mapped[Step] = mapped_column(state_type(Step, 32))  # vm_restart, quarantine, validate
    action: Mapped[str | None] = mapped_column(String(32))  # the VM action just completed (after-action rows)
    provider: Mapped[str | None] = mapped_column(String(16))
    instance_id: Mapped[str | None] = mapped_column(String(253))
    host: Mapped[str | None] = mapped_column(String(253))
    bmc_uuid: Mapped[str | None] = mapped_column(String(64))
    bmc_serial: Mapped[str | None] = mapped_column(String(128))
    sku: Mapped[str | None] = mapped_column(String(128))
    gpus: Mapped[list[dict[str, Any]]] = mapped_column(Json, default=list)
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))


class EvidenceItem(ClusterScoped, Base):
    """One command's output the evidence job kept from a node before the hammer (see
    :mod:`remediation.evidence_collection.rules`): in ``content`` when small, else at ``location`` (a
    file of the evidence directory, or an object of its bucket) with its size and digest here."""

    __tablename__ = "evidence_items"
    __table_args__ = (Index("ix_evidence_items_remediation", "remediation_id", "step_id"),
                      UniqueConstraint("step_id", "name", name="uq_evidence_items_step_name"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    remediation_id: Mapped[int] = mapped_column(BigId, ForeignKey("remediations.id"))
    step_id: Mapped[int] = mapped_column(BigId, ForeignKey("remediation_steps.id"))
    node: Mapped[str] = mapped_column(String(253))
    name: Mapped[str] = mapped_column(String(63))
    status: Mapped[EvidenceStatus] = mapped_column(state_type(EvidenceStatus, 16))
    exit_code: Mapped[int | None] = mapped_column(Integer)
    duration_s: Mapped[float | None]
    size_bytes: Mapped[int] = mapped_column(BigInteger)  # what the job kept of the output (at most max_bytes)
    truncated: Mapped[bool] = mapped_column(Boolean, default=False)  # the command wrote more than max_bytes
    sha256: Mapped[str] = mapped_column(String(64))
    content: Mapped[str | None] = mapped_column(Text)  # the output itself, when it is kept in the database
    location: Mapped[str | None] = mapped_column(String(1024))  # else where: dir:NAME or s3://bucket/key
    collected_at: Mapped[datetime]


class RepairRequest(ClusterScoped, Base):
    """One hand-off of quarantined hardware to the site's repair system (see
    :mod:`remediation.repair_requests`): what was sent (``payload``), whether it arrived, and how it
    ended. One is open per node at a time; a failed re-check's request ``follows`` the one before."""

    __tablename__ = "repair_requests"
    __table_args__ = (
        Index("uq_repair_requests_one_open_per_node", "cluster", "node", unique=True,
              postgresql_where=REPAIR_OPEN, sqlite_where=REPAIR_OPEN),
        Index("ix_repair_requests_delivery", "delivery", "next_attempt_at"),
        Index("ix_repair_requests_node", "cluster", "node", "opened_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = cluster_column()
    node: Mapped[str] = mapped_column(String(253))
    remediation_id: Mapped[int] = mapped_column(BigId, ForeignKey("remediations.id"))  # the quarantine's
    follows_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("repair_requests.id"))
    status: Mapped[RepairStatus] = mapped_column(state_type(RepairStatus, 16))
    ticket: Mapped[str | None] = mapped_column(String(128))
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    delivery: Mapped[DeliveryStatus] = mapped_column(state_type(DeliveryStatus, 16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)  # the last failed delivery, never its URL
    opened_at: Mapped[datetime]
    delivered_at: Mapped[datetime | None]
    done_at: Mapped[datetime | None]  # when the repair system (or on-call) said the repair is done
    closed_at: Mapped[datetime | None]
    closed_by: Mapped[str | None] = mapped_column(String(128))
    note: Mapped[str | None] = mapped_column(Text)  # what the closer said, and what the re-check found
    recheck_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("remediations.id"))
    new_hardware: Mapped[str | None] = mapped_column(Text)  # the re-check saw other hardware: why, for people
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
