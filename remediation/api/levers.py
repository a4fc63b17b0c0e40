"""The levers as the API and the dashboard pull them: the one lever service, formatted for HTTP.

Both the JSON routes and the dashboard's forms go through :func:`pull`, which calls
:class:`remediation.services.levers.LeverService` (the CLI calls the same service), so a release
from the browser and one from ``curl`` write the same audit row and queue the same follow-up work. The
node is looked up first so an unknown node is a 404 rather than a refused lever.

Why: docs/running.md#the-api-and-the-dashboard
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlalchemy.orm import Session, sessionmaker

from remediation.services.levers import LeverService, Undo
from remediation.services.readmodels import get_node, get_remediation

Lever = Literal["quarantine", "release", "report", "cancel", "pause", "resume", "breaker_close"]


@dataclass
class LeverResult:
    lever: str
    message: str
    node: str | None = None
    remediation_id: int | None = None
    queued: bool = True  # false when the follow-up work could not be handed to the workers


@dataclass(frozen=True)
class Aim:
    """What a lever is pulled on: the lever, and the node or the remediation it acts on (neither for
    the fleet-wide ones)."""

    lever: Lever
    node: str | None = None
    remediation_id: int | None = None


@dataclass(frozen=True)
class Pull:
    """One pull of a lever: on what (``aim``), by whom, why; ``give_back`` for a cancel, ``profile``
    for a breaker close."""

    aim: Aim
    actor: str
    reason: str
    give_back: bool = False
    profile: str | None = None


def pull(service: LeverService, sessions: sessionmaker[Session], req: Pull) -> LeverResult:
    lever, node, remediation_id = req.aim.lever, req.aim.node, req.aim.remediation_id
    actor, reason, give_back, profile = req.actor, req.reason, req.give_back, req.profile
    with sessions() as s:  # an unknown node or remediation is a 404, not a refused lever
        if node is not None:
            get_node(s, node)
        if remediation_id is not None:
            get_remediation(s, remediation_id)
    undo: Undo | None = None
    if lever == "quarantine":
        f = service.quarantine(node or "", actor, reason)
        result = LeverResult(lever, f"{node} is being quarantined", node, f.remediation_id)
    elif lever == "release":
        undo = service.release(node or "", actor, reason)
        result = LeverResult(lever, f"{node} released", node)
    elif lever == "report":
        followups = service.report(node or "", actor, reason)
        opened = followups[0].remediation_id if followups else None
        msg = f"remediation #{opened} opened" if opened else "recorded; no new remediation opened"
        result = LeverResult(lever, f"{node} reported: {msg}", node, opened)
    elif lever == "cancel":
        done = service.cancel(remediation_id or 0, actor, reason, give_back=give_back)
        given = "; giving back our drain, cordon and taint" if give_back else ""
        result = LeverResult(lever, f"remediation #{done.remediation_id} cancelled at {done.step}{given}",
                             done.node, done.remediation_id)
        undo = done.undo
    elif lever == "breaker_close":
        followups = service.close_breaker(actor, reason, profile)
        whose = f"profile {profile}'s storm breaker" if profile else "storm breaker"
        result = LeverResult(lever, f"{whose} closed; {len(followups)} held remediation(s) re-check "
                                    "their trigger now")
    else:
        was = service.set_paused(lever == "pause", actor, reason)
        verb = "paused" if lever == "pause" else "resumed"
        result = LeverResult(lever, f"automation {verb}" + (" (no change)" if was == (lever == "pause") else ""))
    if undo is not None and undo.error is not None:  # committed; say plainly Slurm/Kubernetes were not touched
        result.queued = False
        result.message = (f"{undo.node} released in the database, but the release actions could not be "
                          f"queued ({type(undo.error).__name__}); resume it in Slurm by hand")
    return result
