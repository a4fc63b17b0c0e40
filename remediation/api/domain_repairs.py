"""``/api/v1/domain-repairs``: repairs of whole NVLink domains, read over JSON.

The same functions as ``remediation domains list|show|cancel`` (:mod:`remediation.domain_repair.service`
for reads, the lever service for the cancel), so the terminal and the API write the same audit row.

Why: docs/policy.md#the-domain-ladder-one-repair-per-nvlink-domain
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel

from remediation.api.auth import API_ERRORS
from remediation.api.routes import Admin, ClusterFilter, LeverBody, Reader, reading
from remediation.domain_repair import service as svc
from remediation.services.clusters import repair_cluster
from remediation.vocabulary import DEFAULT_CLUSTER

RepairId = Annotated[int, Path(ge=1, le=2**63 - 1)]


class RepairStep(BaseModel):
    step: str
    attempt: int
    status: str
    started_at: datetime
    finished_at: datetime | None = None
    outcome: str | None = None


class RepairRow(BaseModel):
    id: int
    domain: str
    kind: str
    name: str
    trays: list[str]
    size: int
    reporters: list[str]
    cause: str
    fault_class: str
    fault_evidence: str | None = None
    status: str
    step: str
    rungs: list[str]
    ours: list[str]
    wait_reason: str | None = None
    opened_at: datetime
    updated_at: datetime
    closed_at: datetime | None = None
    close_reason: str | None = None
    dry_run: bool
    cluster: str = DEFAULT_CLUSTER


class RepairDetail(RepairRow):
    steps: list[RepairStep]


class RepairCancelled(BaseModel):
    lever: str = "domain_repair_cancel"
    message: str
    domain_repair: int
    released: list[int]


router = APIRouter(prefix="/api/v1", tags=["domain repairs"], responses=API_ERRORS)


@router.get("/domain-repairs", response_model=list[RepairRow], summary="Repairs of NVLink domains, newest first")
def get_repairs(request: Request, _: Reader,
                status: Annotated[str | None, Query(pattern="^(running|returned|quarantined|cancelled)$")] = None,
                *, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                cluster: ClusterFilter = None) -> list[dict[str, Any]]:
    with reading(request, cluster) as s:
        return svc.list_repairs(s, status, limit)


@router.get("/domain-repairs/{repair_id}", response_model=RepairDetail, summary="One domain repair and its steps")
def get_repair(request: Request, _: Reader, repair_id: RepairId, *, cluster: ClusterFilter = None) -> dict[str, Any]:
    with reading(request, cluster) as s:
        return svc.show_repair(s, repair_id)


@router.post("/domain-repairs/{repair_id}/cancel", response_model=RepairCancelled, tags=["levers"])
def post_cancel(request: Request, who: Admin, repair_id: RepairId, *, body: LeverBody,
                cluster: ClusterFilter = None) -> RepairCancelled:
    """Stop a running domain repair where it stands: its trays are left for a human."""
    with request.app.state.sessions() as s:
        owner = repair_cluster(s, repair_id, cluster)
    held = request.app.state.levers.in_cluster(owner).cancel_repair(repair_id, who.actor(body.actor), body.reason)
    return RepairCancelled(message=svc.cancelled_text(repair_id, held), domain_repair=repair_id, released=held)
