"""The levers as the API and the dashboard pull them: one transaction, then dispatch after commit.

Both the JSON routes and the dashboard's forms go through :func:`pull`, so a release from the browser
and one from ``curl`` write the same audit row and queue the same follow-up work. The node is looked up
first so an unknown node is a 404 rather than a refused lever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlalchemy.orm import Session, sessionmaker

from remediation import levers
from remediation.clock import SystemClock
from remediation.dispatch import dispatcher
from remediation.settings import Settings
from remediation.views import get_node, get_remediation

Lever = Literal["quarantine", "release", "report", "cancel", "pause", "resume", "breaker_close"]


@dataclass
class LeverResult:
    lever: str
    message: str
    node: str | None = None
    remediation_id: int | None = None
    queued: bool = True  # false when the follow-up work could not be handed to the workers


def pull(sessions: sessionmaker[Session], settings: Settings, lever: Lever, actor: str, reason: str,
         node: str | None = None, remediation_id: int | None = None, give_back: bool = False) -> LeverResult:
    now = SystemClock().now()
    with sessions() as s, s.begin():
        if node is not None:
            get_node(s, node)
        if remediation_id is not None:
            get_remediation(s, remediation_id)
        if lever == "quarantine":
            f = levers.quarantine(s, node or "", actor, reason, now)
            result = LeverResult(lever, f"{node} is being quarantined", node, f.remediation_id)
            followups = [f]
        elif lever == "release":
            levers.release(s, node or "", actor, reason, now)
            result, followups = LeverResult(lever, f"{node} released", node), []
        elif lever == "report":
            followups = list(levers.report(s, node or "", actor, reason, now, settings.policy))
            opened = followups[0].remediation_id if followups else None
            msg = f"remediation #{opened} opened" if opened else "recorded; no new remediation opened"
            result = LeverResult(lever, f"{node} reported: {msg}", node, opened)
        elif lever == "cancel":
            rem = levers.cancel(s, remediation_id or 0, actor, reason, now, give_back=give_back)
            given = "; giving back our drain, cordon and taint" if give_back else ""
            result = LeverResult(lever, f"remediation #{rem.id} cancelled at {rem.step}{given}", rem.node, rem.id)
            followups = []
            if give_back:
                node = rem.node
        elif lever == "breaker_close":
            followups = levers.close_breaker(s, actor, reason, now)
            result = LeverResult(lever, f"storm breaker closed; {len(followups)} held remediation(s) re-check "
                                        "their trigger now")
        else:
            was = levers.set_paused(s, lever == "pause", actor, reason, now)
            verb = "paused" if lever == "pause" else "resumed"
            result, followups = LeverResult(lever, f"automation {verb}" + (" (no change)" if was == (
                lever == "pause") else "")), []
    dispatcher().steps(followups)
    if lever == "release" or (lever == "cancel" and give_back):
        try:
            dispatcher().release(node or "")
        except Exception as exc:  # committed; say plainly that Slurm/Kubernetes were not touched
            result.queued = False
            result.message = (f"{node} released in the database, but the release actions could not be "
                              f"queued ({type(exc).__name__}); resume it in Slurm by hand")
    return result
