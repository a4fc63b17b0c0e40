"""``/api/v1/repair-requests``: hardware handed to the repair system, read over JSON, and the repair
system's callback (a ``repair`` token, or an admin's) that says a repair is done or abandoned.

The callback goes through the lever service, as ``remediation repair done|abandon`` does, so both
write the same audit row and open the same re-check.

Why: docs/policy.md#repair-requests-handing-hardware-to-the-repair-system
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, status
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, ConfigDict, Field, field_validator

from remediation.api.auth import API_ERRORS, Principal, bearer, repair_caller
from remediation.api.routes import ClusterFilter, NodeFilter, Reader, reading
from remediation.repair_requests import service as svc
from remediation.repair_requests.rules import TICKET, CallbackStatus, RepairStatus
from remediation.vocabulary import DEFAULT_CLUSTER

RequestId = Annotated[int, Path(ge=1, le=2**63 - 1)]


def caller(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Principal:
    return repair_caller(request, creds)


class RequestRow(BaseModel):
    id: int
    cluster: str = DEFAULT_CLUSTER
    node: str
    remediation_id: int
    follows_id: int | None = None
    status: str
    ticket: str | None = None
    delivery: str
    attempts: int
    next_attempt_at: datetime | None = None
    last_error: str | None = None
    opened_at: datetime
    delivered_at: datetime | None = None
    done_at: datetime | None = None
    closed_at: datetime | None = None
    closed_by: str | None = None
    note: str | None = None
    recheck_id: int | None = None
    new_hardware: str | None = None
    dry_run: bool


class RequestDetail(RequestRow):
    payload: dict[str, Any]


class CallbackBody(BaseModel):
    """What the repair system says: the repair is done (the node is re-checked, then returned or
    quarantined again) or abandoned (it stays quarantined), under its ticket."""

    model_config = ConfigDict(extra="forbid")
    status: CallbackStatus
    ticket: str = Field(pattern=TICKET.pattern, examples=["RMA-20931"], description="The repair system's ticket.")
    note: str | None = Field(None, min_length=1, max_length=1000, examples=["GPU 3 replaced"])

    @field_validator("note")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or not value.isprintable()):
            raise ValueError("note must be a non-empty single line of printable characters")
        return value.strip() if value is not None else None


class CallbackAnswer(BaseModel):
    repair_request: int
    status: str
    message: str
    recheck_id: int | None = None


router = APIRouter(prefix="/api/v1", tags=["repair requests"], responses=API_ERRORS)


@router.get("/repair-requests", response_model=list[RequestRow], summary="Repair requests, newest first")
def get_requests(request: Request, _: Reader, status_: Annotated[RepairStatus | None, Query(alias="status")] = None,
                 *, node: NodeFilter = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                 cluster: ClusterFilter = None) -> list[dict[str, Any]]:
    with reading(request, cluster) as s:
        return svc.list_requests(s, status=status_, node=node, limit=limit)


@router.get("/repair-requests/{request_id}", response_model=RequestDetail, summary="One repair request")
def get_request(request: Request, _: Reader, request_id: RequestId) -> dict[str, Any]:
    with reading(request) as s:
        try:
            return svc.detail(s, request_id)
        except svc.RepairNotFound as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None


@router.post("/repair-requests/{request_id}/callback", response_model=CallbackAnswer, tags=["levers"],
             summary="The repair system says a repair is done or abandoned")
def post_callback(request: Request, who: Annotated[Principal, Depends(caller)], request_id: RequestId, *,
                  body: CallbackBody) -> CallbackAnswer:
    """Done: the node is re-checked (the GPU check, and the domain check where it is in an NVLink
    domain), then returned or quarantined again with a new request. 404: no such request; 409: it is
    no longer open (a second callback)."""
    said = svc.Answer(body.status, body.ticket, who.name, body.note)
    try:
        followup = request.app.state.levers.answer_repair(request_id, said)
    except svc.RepairNotFound as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{exc}: the callback names no request this service "
                            "opened") from None
    except svc.RepairRefused as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    if followup is None:
        return CallbackAnswer(repair_request=request_id, status=RepairStatus.ABANDONED,
                              message=f"repair request #{request_id} abandoned: the node stays quarantined")
    return CallbackAnswer(repair_request=request_id, status=RepairStatus.RECHECKING, recheck_id=followup.remediation_id,
                          message=f"repair request #{request_id} done: re-check #{followup.remediation_id} runs "
                          "the GPU check, then returns the node or quarantines it again")
