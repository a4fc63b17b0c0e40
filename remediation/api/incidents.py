"""``/api/v1/incidents``: topology-correlated incidents, read and resolved over JSON.

The same functions as ``remediation incidents list|show|resolve`` (:mod:`remediation.incidents.service`
for reads, the lever service for the resolve), so the terminal and the API write the same audit row.

Why: docs/policy.md#correlated-incidents-half-a-domain-or-4-of-its-nodes-within-2-minutes
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel

from remediation.api.auth import API_ERRORS
from remediation.api.routes import Admin, ClusterFilter, LeverBody, Reader, reading
from remediation.incidents import service as svc
from remediation.services.clusters import incident_cluster
from remediation.vocabulary import DEFAULT_CLUSTER

IncidentId = Annotated[int, Path(ge=1, le=2**63 - 1)]


class IncidentMember(BaseModel):
    id: int
    node: str
    status: str
    step: str
    wait_reason: str | None = None
    opened_at: datetime
    dry_run: bool


class IncidentRow(BaseModel):
    id: int
    domain: str
    kind: str
    name: str
    cause: str
    status: str
    nodes: list[str]
    node_count: int
    domain_size: int
    opened_at: datetime
    closed_at: datetime | None = None
    closed_by: str | None = None
    close_reason: str | None = None
    dry_run: bool
    cluster: str = DEFAULT_CLUSTER


class IncidentDetail(IncidentRow):
    likely_cause: str
    remediations: list[IncidentMember]


class IncidentResolved(BaseModel):
    lever: str = "incident_resolve"
    message: str
    incident: int
    released: list[int]


router = APIRouter(prefix="/api/v1", tags=["incidents"], responses=API_ERRORS)


@router.get("/incidents", response_model=list[IncidentRow], summary="Correlated incidents, newest first")
def get_incidents(request: Request, _: Reader,
                  status: Annotated[str | None, Query(pattern="^(open|closed|recovered|resolved)$")] = None,
                  *, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                  cluster: ClusterFilter = None) -> list[dict[str, Any]]:
    with reading(request, cluster) as s:
        return svc.list_incidents(s, status, limit)


@router.get("/incidents/{incident_id}", response_model=IncidentDetail, summary="One incident and its members")
def get_incident(request: Request, _: Reader, incident_id: IncidentId,
                 *, cluster: ClusterFilter = None) -> dict[str, Any]:
    with reading(request, cluster) as s:
        return svc.show(s, incident_id)


@router.post("/incidents/{incident_id}/resolve", response_model=IncidentResolved, tags=["levers"])
def post_resolve(request: Request, who: Admin, incident_id: IncidentId, *,
                 body: LeverBody, cluster: ClusterFilter = None) -> IncidentResolved:
    """Close an open incident: each member re-checks its trigger (healthy: given back; bad: remediated alone)."""
    with request.app.state.sessions() as s:
        owner = incident_cluster(s, incident_id, cluster)
    followups = request.app.state.levers.in_cluster(owner).resolve_incident(incident_id, who.actor(body.actor),
                                                                            body.reason)
    return IncidentResolved(message=f"incident #{incident_id} resolved; {len(followups)} member "
                                    "remediation(s) re-check their trigger now",
                            incident=incident_id, released=[f.remediation_id for f in followups])
