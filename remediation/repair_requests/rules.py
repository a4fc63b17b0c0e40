"""Repair requests, pure: their statuses, the JSON a repair system receives (``schema_version`` 1),
the retry backoff of a failed delivery, and whether the hardware after a repair is other hardware.

Why: docs/policy.md#repair-requests-handing-hardware-to-the-repair-system
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from remediation.domain.hardware import Machine

SCHEMA_VERSION = 1
#: Evidence content is sent inline up to this many bytes; a larger item is named by its location.
INLINE_EVIDENCE_BYTES = 8 * 1024


class RepairStatus(StrEnum):
    """Where a repair request stands."""

    OPEN = "open"  # handed over (or being delivered): the node is with-repair
    RECHECKING = "rechecking"  # the repair is done: a re-check (GPU check, then return) runs
    RETURNED = "returned"  # the re-check passed and the node went back to the pool
    FAILED_CHECK = "failed-check"  # the re-check failed: quarantined again, a new request follows this one
    ABANDONED = "abandoned"  # no repair will come: the node stays quarantined for a human
    RELEASED = "released"  # a human released the node while the request was open


#: The statuses in which the repair system may still answer.
OPEN_REPAIRS = frozenset({RepairStatus.OPEN})
#: The statuses of a request that is over.
CLOSED_REPAIRS = frozenset({RepairStatus.RETURNED, RepairStatus.FAILED_CHECK, RepairStatus.ABANDONED,
                            RepairStatus.RELEASED})


class DeliveryStatus(StrEnum):
    """Whether the repair system has the request."""

    PENDING = "pending"  # not delivered yet (attempts > 0: failing, retried with backoff)
    DELIVERED = "delivered"
    STOPPED = "stopped"  # the request closed before it was delivered: no more attempts


class CallbackStatus(StrEnum):
    """What a repair system (or on-call) says of a request."""

    DONE = "done"
    ABANDONED = "abandoned"


@dataclass(frozen=True)
class Gpu:
    uuid: str
    serial: str | None = None


@dataclass(frozen=True, kw_only=True)
class Hardware(Machine):
    """The hardware identity the request names: the machine, its BMC, its GPUs (None: not known)."""

    gpus: tuple[Gpu, ...] = ()


@dataclass(frozen=True)
class EvidenceItem:
    """One item of the evidence collected before the quarantine; ``content`` only when inline and small."""

    name: str
    status: str
    exit_code: int | None
    size_bytes: int
    truncated: bool
    sha256: str
    location: str | None
    content: str | None = None


@dataclass(frozen=True)
class PastFault:
    at: datetime
    fault_class: str | None


@dataclass(frozen=True)
class Lemon:
    score: float
    failures: int
    over_threshold: bool
    explanation: str


@dataclass(frozen=True)
class Facts:
    """Everything a request says, read when it opens."""

    request_id: int
    cluster: str
    node: str
    remediation_id: int
    opened_at: datetime
    fault_class: str | None
    cause: str
    reason: str  # the quarantine's reason (with its RMA note)
    hardware: Hardware
    lemon: Lemon
    follows: int | None = None
    fault_evidence: str | None = None
    evidence: tuple[EvidenceItem, ...] = ()
    history: tuple[PastFault, ...] = field(default=())
    dry_run: bool = False


def inline(content: str | None, size_bytes: int) -> str | None:
    """The content sent inline: an item kept in the database and no larger than 8 KiB."""
    if content is None or size_bytes > INLINE_EVIDENCE_BYTES or len(content.encode()) > INLINE_EVIDENCE_BYTES:
        return None
    return content


def payload(f: Facts) -> dict[str, Any]:
    """The JSON body of the request (docs/policy.md documents every key)."""
    hw = {**asdict(f.hardware), "gpus": [asdict(g) for g in f.hardware.gpus]}
    return {
        "schema_version": SCHEMA_VERSION,
        "request": {"id": f.request_id, "follows": f.follows, "opened_at": f.opened_at.isoformat(),
                    "dry_run": f.dry_run,
                    "callback": f"/api/v1/repair-requests/{f.request_id}/callback"},
        "cluster": f.cluster,
        "node": f.node,
        "hardware": hw,
        "fault": {"class": f.fault_class, "cause": f.cause, "evidence": f.fault_evidence, "reason": f.reason,
                  "remediation": f.remediation_id},
        "evidence": [_item(e) for e in f.evidence],
        "history": [{"at": p.at.isoformat(), "fault_class": p.fault_class} for p in f.history],
        "lemon": asdict(f.lemon),
    }


def _item(e: EvidenceItem) -> dict[str, Any]:
    out = asdict(e)
    if out["content"] is None:
        del out["content"]
    return out


def backoff(attempts: int, *, base_s: float, max_s: float) -> float:
    """Seconds before the next delivery after ``attempts`` failed ones: base, twice that, ... up to max."""
    return float(min(max_s, base_s * 2 ** max(0, attempts - 1)))


def items(hw: Hardware) -> tuple[str, ...]:
    """The hardware items a request names, for counting repair time per item: the machine by its most
    physical identity known (BMC serial, BMC UUID, host, instance), and each GPU by its serial."""
    machine = next((f"{k}:{v}" for k, v in (("serial", hw.bmc_serial), ("bmc", hw.bmc_uuid), ("host", hw.host),
                                             ("instance", hw.instance_id)) if v), None)
    return (*((machine,) if machine else ()), *sorted({f"gpu:{g.serial or g.uuid}" for g in hw.gpus}))


def changed(asked: Hardware, seen: Hardware) -> str | None:
    """Why ``seen`` (read at the re-check) is other hardware than ``asked`` (the request's), for people;
    None: the same as far as both say. A field only one of them knows says nothing."""
    for name in ("instance_id", "host", "bmc_uuid", "bmc_serial"):
        was, now = getattr(asked, name), getattr(seen, name)
        if was and now and was != now:
            return f"{name.replace('_', ' ')} changed ({was} -> {now})"
    before = {g.serial or g.uuid for g in asked.gpus}
    after = {g.serial or g.uuid for g in seen.gpus}
    if before and after and before != after:
        return f"GPU serials changed ({len(before - after)} of {len(before)} replaced)"
    return None


#: A ticket as the repair system names it: one word of letters, digits and ``.:#/@+-_``.
TICKET = re.compile(r"^[\w.:#/@+-]{1,128}$")


def checked_ticket(ticket: str) -> str:
    """``ticket`` when it is one, else a ValueError that says what a ticket may hold."""
    if not TICKET.fullmatch(ticket):
        raise ValueError(f"a ticket is 1 to 128 letters, digits and .:#/@+-_ (got {ticket[:40]!r})")
    return ticket


def answered_text(node: str, request_id: int, recheck_id: int | None) -> str:
    """What on-call reads after answering a request."""
    if recheck_id is None:
        return f"node/{node}: repair request #{request_id} abandoned; the node stays quarantined"
    return (f"node/{node}: repair request #{request_id} done; re-check #{recheck_id} runs the GPU check, "
            "then returns the node or quarantines it again")
