"""The levers as the API and the dashboard pull them: the one lever service, formatted for HTTP.

Both the JSON routes and the dashboard's forms go through :func:`pull`, which calls
:class:`remediation.services.levers.LeverService` (the CLI calls the same service), so a release
from the browser and one from ``curl`` write the same audit row and queue the same follow-up work. The
node is looked up first so an unknown node is a 404 rather than a refused lever.

Why: docs/running.md#the-api-and-the-dashboard
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import quote

from sqlalchemy.orm import Session, sessionmaker

from remediation.services.clusters import known_clusters, node_cluster, remediation_cluster
from remediation.services.levers import LeverService, Undo
from remediation.settings import Settings
from remediation.vocabulary import DEFAULT_CLUSTER

Lever = Literal["quarantine", "release", "report", "cancel", "pause", "resume", "breaker_close"]
FLEET_LEVERS = ("pause", "resume", "breaker_close")  # on a cluster, or on every cluster when none is named


def node_href(name: str, cluster: str | None) -> str:
    """The dashboard's page of node ``name`` in ``cluster``: a link names the node's cluster."""
    return f"/nodes/{quote(name, safe='')}" + (f"?cluster={quote(cluster, safe='')}" if cluster else "")


@dataclass
class LeverResult:
    lever: str
    message: str
    node: str | None = None
    remediation_id: int | None = None
    queued: bool = True  # false when the follow-up work could not be handed to the workers
    cluster: str | None = None  # the node's or remediation's cluster (None: a lever on several)
    clusters: list[str] = field(default_factory=list)  # where a pause, resume or breaker close acted


@dataclass(frozen=True)
class Aim:
    """What a lever is pulled on: the lever, and the node or the remediation it acts on (neither for
    the fleet-wide ones), in ``cluster`` (None: the node's only cluster, or every cluster)."""

    lever: Lever
    node: str | None = None
    remediation_id: int | None = None
    cluster: str | None = None


@dataclass(frozen=True)
class Pull:
    """One pull of a lever: on what (``aim``), by whom, why; ``give_back`` for a cancel, ``profile``
    for a breaker close."""

    aim: Aim
    actor: str
    reason: str
    give_back: bool = False
    profile: str | None = None
    clusters: list[str] = field(default_factory=list)  # pause, resume, breaker close: where (empty: aim's)


def every_cluster(sessions: sessionmaker[Session], settings: Settings, cluster: str | None) -> list[str]:
    """``cluster``, else every cluster the configuration or the database knows (where a pause acts)."""
    if cluster is not None:
        return [cluster]
    with sessions() as s:
        return known_clusters(s, settings.fleet())


def pull(fleet: LeverService, sessions: sessionmaker[Session], req: Pull) -> LeverResult:
    """Pull ``req``'s lever in the cluster of its node or remediation (an unknown one is a 404, a node
    name in several clusters without one named a 400), or in each of ``req.clusters``."""
    lever, node, remediation_id = req.aim.lever, req.aim.node, req.aim.remediation_id
    actor, reason, give_back = req.actor, req.reason, req.give_back
    clusters = req.clusters or ([req.aim.cluster] if req.aim.cluster else [DEFAULT_CLUSTER])
    with sessions() as s:
        if node is not None:
            clusters = [node_cluster(s, node, req.aim.cluster)]
        if remediation_id is not None:
            clusters = [remediation_cluster(s, remediation_id, req.aim.cluster)]
    if lever in FLEET_LEVERS:
        return _fleet_lever(fleet, clusters, req)
    service = fleet.in_cluster(clusters[0])
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
    else:
        raise ValueError(f"unknown lever {lever!r}")  # pragma: no cover - Lever is a closed set
    result.cluster = clusters[0]
    if undo is not None and undo.error is not None:  # committed; say plainly Slurm/Kubernetes were not touched
        result.queued = False
        result.message = (f"{undo.node} released in the database, but the release actions could not be "
                          f"queued ({type(undo.error).__name__}); resume it in Slurm by hand")
    return result


def _fleet_lever(fleet: LeverService, clusters: list[str], req: Pull) -> LeverResult:
    """Pause, resume or close the breaker in each of ``clusters``: one transaction and audit row each."""
    lever, actor, reason, profile = req.aim.lever, req.actor, req.reason, req.profile
    if lever == "breaker_close":
        closed = fleet.close_breakers(clusters, actor, reason=reason, profile=profile)
        whose = f"profile {profile}'s storm breaker" if profile else "storm breaker"
        said = {c: f"{whose} closed; {len(f)} held remediation(s) re-check their trigger now"
                for c, f in closed.items()}
    else:
        before = fleet.set_paused_in(clusters, lever == "pause", actor, reason=reason)
        verb = "paused" if lever == "pause" else "resumed"
        said = {c: f"automation {verb}" + (" (no change)" if was == (lever == "pause") else "")
                for c, was in before.items()}
    if len(clusters) == 1:
        message = next(iter(said.values()))
    else:
        message = "; ".join(f"cluster {c}: {line}" for c, line in said.items())
    return LeverResult(lever, message, cluster=clusters[0] if len(clusters) == 1 else None, clusters=list(said))
