"""The JSON API under ``/api/v1``: the same read models as the CLI (:mod:`remediation.services.readmodels`)
and the levers as POST endpoints with validated JSON bodies.

Inputs are constrained in the schema (node-name pattern, ranges, single-line reasons). Handlers are plain
``def``, run in FastAPI's thread pool.

Why: docs/running.md#the-api-and-the-dashboard
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.orm import Session

from remediation.api.auth import API_ERRORS, Principal, api_reader, bearer, require_admin
from remediation.api.levers import Aim, LeverResult, Pull, every_cluster, pull
from remediation.db.scope import scoped
from remediation.domain.events import NODE_NAME
from remediation.evidence_collection import service as collected
from remediation.evidence_collection.settings import NAME as ITEM_NAME
from remediation.ports.errors import RemediationError
from remediation.profiles.settings import PROFILE_NAME
from remediation.services.clusters import cluster_states, node_cluster
from remediation.services.holds import automation_status
from remediation.services.lemons import LemonRow
from remediation.services.lemons import lemons as compute_lemons
from remediation.services.readmodels import (
    AuditRow,
    ClusterState,
    EventRow,
    NodeDetail,
    NodeRow,
    Overview,
    RecordNotFound,
    RejectedRow,
    RemediationDetail,
    RemediationRow,
    jsonable,
    list_audit,
    list_events,
    list_nodes,
    list_rejected,
    list_remediations,
    node_detail,
    overview,
    quarantined,
)
from remediation.services.readmodels import get_remediation as get_rem
from remediation.services.stats import Stats, StatsQuery
from remediation.services.stats import stats as compute_stats
from remediation.vocabulary import CLUSTER_NAME

MAX_ID = 2**63 - 1
NodeName = Annotated[str, Path(pattern=NODE_NAME.pattern, max_length=253, examples=["gpu-node-7"])]
NodeFilter = Annotated[str | None, Query(pattern=NODE_NAME.pattern, max_length=253)]
RemId = Annotated[int, Path(ge=1, le=MAX_ID)]
Limit = Annotated[int, Query(ge=1, le=1000)]
StatusFilter = Annotated[str | None, Query(max_length=32, description="A status (or open/closed).")]
ProfileFilter = Annotated[str | None, Query(pattern=PROFILE_NAME, description="A profile's name.")]
ClusterFilter = Annotated[str | None, Query(
    pattern=CLUSTER_NAME.pattern, max_length=63,
    description="Only this cluster (omit: every cluster). For a node: the node's cluster, needed only when "
                "its name is in several (400 otherwise).")]


def reading(request: Request, cluster: str | None = None) -> Session:
    """A session for a read: scoped to ``cluster``, or seeing every cluster (None)."""
    sessions = request.app.state.sessions
    return (sessions if cluster is None else scoped(sessions, cluster))()


def node_scope(request: Request, node: str, cluster: str | None) -> str:
    """The cluster node ``node`` is in: ``cluster`` if given, else its only one (400 when several)."""
    with request.app.state.sessions() as s:
        return node_cluster(s, node, cluster)


def fleet(request: Request, cluster: str | None) -> list[str]:
    """``cluster``, else every cluster the configuration or the database knows."""
    return every_cluster(request.app.state.sessions, request.app.state.settings, cluster)


def reader(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Principal:
    return api_reader(request, creds)


def admin(who: Annotated[Principal, Depends(reader)]) -> Principal:
    return require_admin(who)


Reader = Annotated[Principal, Depends(reader)]
Admin = Annotated[Principal, Depends(admin)]

router = APIRouter(prefix="/api/v1", tags=["on-call"], responses=API_ERRORS)

#: The refusals of an operation that answers plain text: JSON all the same, as every refusal is
#: (FastAPI would otherwise document them in the operation's own media type).
TEXT_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"description": e["description"],
           "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
    for code, e in API_ERRORS.items()
}


class LeverBody(BaseModel):
    """Why (required, for the audit log) and, optionally, who is pressing the button."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=1000, examples=["bad GPU, RMA ticket 1234"])
    actor: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[\w.@ -]+$",
                              description="A human name; recorded with the token's fingerprint.")

    @field_validator("reason")
    @classmethod
    def _one_line(cls, value: str) -> str:
        value = value.strip()
        if not value or not value.isprintable():
            raise ValueError("reason must be a non-empty single line of printable characters")
        return value


class CancelBody(LeverBody):
    give_back: bool = Field(False, description="Also resume our drain (only while the reason is still ours) "
                                               "and remove our cordon and taint.")


class BreakerState(BaseModel):
    """The storm breaker's latch: open until a human closes it."""

    open: bool
    reason: str | None = None
    since: str | None = None
    closed_at: str | None = None
    closed_by: str | None = None
    close_reason: str | None = None
    cluster: str | None = None  # whose latch this is (None: no cluster's breaker is latched)


def _about(request: Request, node: str | None, cluster: str | None) -> str | None:
    """The cluster a read about ``node`` (an audit target) is scoped to: the node's if it is one."""
    if not node:
        return cluster
    try:
        return node_scope(request, node, cluster)
    except RecordNotFound:  # a target that is no node in the inventory: every cluster's rows of it
        return cluster


def _pull(request: Request, who: Principal, body: LeverBody, *, aim: Aim) -> LeverResult:
    st = request.app.state
    give_back = isinstance(body, CancelBody) and body.give_back
    profile = body.profile if isinstance(body, BreakerCloseBody) else None
    clusters = fleet(request, aim.cluster) if aim.node is None and aim.remediation_id is None else []
    req = Pull(aim, who.actor(body.actor), body.reason, give_back=give_back, profile=profile, clusters=clusters)
    return pull(st.levers, st.sessions, req)


@router.get("/overview", response_model=Overview, summary="Counts by status, breaker, pause, queue depth")
def get_overview(request: Request, _: Reader, cluster: ClusterFilter = None) -> Overview:
    """The fleet's counts (``cluster``: that cluster's), and every cluster with its state."""
    names = fleet(request, cluster)
    with reading(request, cluster) as s:
        result = overview(s)
        result.clusters = cluster_states(s, names)
    qd = request.app.state.queue_depth
    result.queue_depth = qd() if qd is not None else None
    return result


class Identity(BaseModel):
    """Who the server takes this token for: its name (the audit actor of a named token) and role."""

    name: str
    role: str
    named: bool = Field(description="From api.tokens (true) or an unnamed legacy list (false).")


@router.get("/whoami", response_model=Identity, summary="The token's name and role")
def get_whoami(who: Reader) -> Identity:
    return Identity(name=who.name, role=who.role, named=who.named)


@router.get("/clusters", response_model=list[ClusterState], summary="Every cluster and its state")
def get_clusters(request: Request, _: Reader, cluster: ClusterFilter = None) -> list[ClusterState]:
    """Each cluster the configuration or the database knows: paused (by whom, why), storm breaker
    latched (why), open remediations, and its nodes: how many, unhealthy, quarantined."""
    names = fleet(request, cluster)
    with reading(request, cluster) as s:
        return cluster_states(s, names)


@router.get("/status", summary="Automation, breaker, counts, and remediations held for a human")
def get_status(request: Request, _: Reader, cluster: ClusterFilter = None) -> dict[str, Any]:
    """What ``remediation status`` shows: the pause (by whom, why), the storm breaker, remediations and
    nodes by status, each remediation held on an error nobody mapped, and every cluster's state."""
    st = request.app.state
    names = fleet(request, cluster)
    with reading(request, cluster) as s:
        return {**automation_status(s, st.settings.policy.pool_stale),
                "clusters": jsonable(cluster_states(s, names))}


@router.get("/nodes", response_model=list[NodeRow])
def get_nodes(request: Request, _: Reader, status: StatusFilter = None, *, profile: ProfileFilter = None,
              cluster: ClusterFilter = None) -> list[NodeRow]:
    st = request.app.state
    with reading(request, cluster) as s:
        return list_nodes(s, status, st.settings.policy.lemon, now=st.clock.now(), profile=profile)


@router.get("/nodes/{node}", response_model=NodeDetail, summary="A node and its timeline")
def get_node_detail(request: Request, _: Reader, node: NodeName, *, limit: Limit = 200,
                    cluster: ClusterFilter = None) -> NodeDetail:
    st = request.app.state
    with reading(request, node_scope(request, node, cluster)) as s:
        return node_detail(s, node, limit, policy=st.settings.policy, now=st.clock.now())


@router.get("/remediations", response_model=list[RemediationRow])
def get_remediations(request: Request, _: Reader, status: StatusFilter = "open", *, node: NodeFilter = None,
                     limit: Limit = 100, profile: ProfileFilter = None, cluster: ClusterFilter = None
                     ) -> list[RemediationRow]:
    """Remediations, newest first; in flight (``status=open``) unless asked otherwise."""
    with reading(request, node_scope(request, node, cluster) if node else cluster) as s:
        return list_remediations(s, status, node, limit=limit, profile=profile)


@router.get("/remediations/{remediation_id}", response_model=RemediationDetail)
def get_remediation(request: Request, _: Reader, remediation_id: RemId,
                    *, cluster: ClusterFilter = None) -> RemediationDetail:
    with reading(request, cluster) as s:
        return get_rem(s, remediation_id)


@router.get("/remediations/{remediation_id}/evidence/{name}", response_class=PlainTextResponse, responses=TEXT_ERRORS,
            summary="One item of a remediation's collected evidence, whole")
def get_evidence(request: Request, _: Reader, remediation_id: RemId, *,
                 name: Annotated[str, Path(pattern=ITEM_NAME.pattern, examples=["nvidia-smi-q"])],
                 step: Annotated[int | None, Query(ge=1, le=MAX_ID, description="The step row that kept it "
                                                   "(omit: the newest that kept one of that name).")] = None,
                 cluster: ClusterFilter = None) -> PlainTextResponse:
    """The item's text as the node wrote it (from its row, the evidence directory or its bucket)."""
    with reading(request, cluster) as s:
        return evidence_text(s, request, (remediation_id, name, step))


def evidence_text(s: Session, request: Request, which: tuple[int, str, int | None]) -> PlainTextResponse:
    """An item's text (``which``: remediation, name, step row or None), served as plain text that no
    browser sniffs into a page: it is what a node wrote."""
    item = collected.find(s, which[0], which[1], step_id=which[2])
    try:
        text = collected.whole(item, request.app.state.evidence_storage)
    except RemediationError as exc:  # the store: unreachable, denied, or another backend's location
        raise HTTPException(503, exc.message) from None
    return PlainTextResponse(text, headers={"X-Content-Type-Options": "nosniff"})


@router.get("/quarantine", response_model=list[NodeRow], summary="Quarantined nodes")
def get_quarantine(request: Request, _: Reader, cluster: ClusterFilter = None) -> list[NodeRow]:
    with reading(request, cluster) as s:
        return quarantined(s)


@router.get("/audit", response_model=list[AuditRow])
def get_audit(request: Request, _: Reader, target: NodeFilter = None,
              *, action: Annotated[str | None, Query(pattern=r"^[a-z_]{1,64}$")] = None,
              limit: Limit = 100, cluster: ClusterFilter = None) -> list[AuditRow]:
    with reading(request, _about(request, target, cluster)) as s:
        return list_audit(s, target, action, limit=limit)


@router.get("/events", response_model=list[EventRow])
def get_events(request: Request, _: Reader, node: NodeFilter = None,
               *, after: Annotated[int | None, Query(ge=0,
                                                     le=MAX_ID)] = None, limit: Limit = 50,
               cluster: ClusterFilter = None) -> list[EventRow]:
    """The newest events, oldest first; pass ``after`` (the last id seen) to follow."""
    with reading(request, node_scope(request, node, cluster) if node else cluster) as s:
        return list_events(s, node, after, limit=limit)


@router.get("/rejected", response_model=list[RejectedRow])
def get_rejected(request: Request, _: Reader, limit: Limit = 50, *, cluster: ClusterFilter = None
                 ) -> list[RejectedRow]:
    with reading(request, cluster) as s:
        return list_rejected(s, limit)


@router.get("/stats", response_model=Stats)
def get_stats(request: Request, _: Reader, days: Annotated[int, Query(ge=1, le=3650)] = 30,
              *, top: Annotated[int, Query(ge=1, le=1000)] = 10, dry_run: bool = False,
              profile: ProfileFilter = None, cluster: ClusterFilter = None) -> Stats:
    """Real history; ``dry_run=true`` includes what dry-run recorded (always counted in ``dry_run``);
    ``profile``: only what opened under that profile; ``cluster``: only that cluster's."""
    st = request.app.state
    with reading(request, cluster) as s:
        return compute_stats(s, st.clock.now(), StatsQuery(days, top, include_dry_run=dry_run,
                                                           profile=profile),
                             repeat_window=st.settings.policy.repeat_offender_window)


@router.get("/lemons", response_model=list[LemonRow], summary="Nodes by lemon score, worst first")
def get_lemons(request: Request, _: Reader, top: Annotated[int, Query(ge=1, le=1000)] = 10,
               *, cluster: ClusterFilter = None) -> list[LemonRow]:
    """Decayed, class-weighted failures with distinct causes counted, each with its explanation; a
    node at or over ``policy.lemon.threshold`` is quarantined on its next failure."""
    st = request.app.state
    with reading(request, cluster) as s:
        return compute_lemons(s, st.clock.now(), st.settings.policy.lemon, top=top)


@router.post("/nodes/{node}/quarantine", response_model=LeverResult, tags=["levers"])
def post_quarantine(request: Request, who: Admin, node: NodeName, *, body: LeverBody,
                 cluster: ClusterFilter = None) -> LeverResult:
    return _pull(request, who, body, aim=Aim("quarantine", node, cluster=cluster))


@router.post("/nodes/{node}/release", response_model=LeverResult, tags=["levers"])
def post_release(request: Request, who: Admin, node: NodeName, *, body: LeverBody,
                 cluster: ClusterFilter = None) -> LeverResult:
    return _pull(request, who, body, aim=Aim("release", node, cluster=cluster))


@router.post("/nodes/{node}/report", response_model=LeverResult, tags=["levers"])
def post_report(request: Request, who: Admin, node: NodeName, *, body: LeverBody,
                 cluster: ClusterFilter = None) -> LeverResult:
    return _pull(request, who, body, aim=Aim("report", node, cluster=cluster))


@router.post("/remediations/{remediation_id}/cancel", response_model=LeverResult, tags=["levers"])
def post_cancel(request: Request, who: Admin, remediation_id: RemId, *, body: CancelBody,
                cluster: ClusterFilter = None) -> LeverResult:
    return _pull(request, who, body, aim=Aim("cancel", remediation_id=remediation_id, cluster=cluster))


class BreakerCloseBody(LeverBody):
    profile: str | None = Field(None, pattern=PROFILE_NAME, description="Close this profile's breaker, not the fleet's.")


@router.get("/breaker", response_model=BreakerState, summary="The storm breaker: open, why, since when")
def get_breaker(request: Request, _: Reader, profile: ProfileFilter = None,
                *, cluster: ClusterFilter = None) -> BreakerState:
    """The fleet's storm breaker, or with ``profile`` that profile's own: ``cluster``'s, else the only
    cluster's, else the first cluster's that is latched (``cluster`` names it)."""
    levers = request.app.state.levers
    names = fleet(request, cluster)
    latches = {c: levers.in_cluster(c).breaker_status(profile) for c in names}
    shown = next((c for c, v in latches.items() if v.get("open")), names[0] if len(names) == 1 else None)
    latch = latches.get(shown, {}) if shown is not None else {}
    return BreakerState(open=bool(latch.get("open")), reason=latch.get("reason"), since=latch.get("at"),
                        closed_at=latch.get("closed_at"), closed_by=latch.get("closed_by"),
                        close_reason=latch.get("close_reason"), cluster=shown)


@router.post("/breaker/close", response_model=LeverResult, tags=["levers"])
def post_breaker_close(request: Request, who: Admin, body: BreakerCloseBody,
                       *, cluster: ClusterFilter = None) -> LeverResult:
    """Close the storm breaker of ``cluster``, else of every cluster where it is open."""
    return _pull(request, who, body, aim=Aim("breaker_close", cluster=cluster))


@router.post("/pause", response_model=LeverResult, tags=["levers"])
def post_pause(request: Request, who: Admin, body: LeverBody, *, cluster: ClusterFilter = None) -> LeverResult:
    """Pause ``cluster``, else every cluster (each audited in its own)."""
    return _pull(request, who, body, aim=Aim("pause", cluster=cluster))


@router.post("/resume", response_model=LeverResult, tags=["levers"])
def post_resume(request: Request, who: Admin, body: LeverBody, *, cluster: ClusterFilter = None) -> LeverResult:
    """Resume ``cluster``, else every cluster (each audited in its own)."""
    return _pull(request, who, body, aim=Aim("resume", cluster=cluster))
