"""Where the CLI's reads and levers go: straight to the database, or through the API.

:class:`Direct` (no ``--server``, for admins on the database host; audited ``via=db`` as ``--actor`` or
``$USER``) or :class:`remediation.cli.remote.Remote` (``--server``; audited ``via=api`` as the token's
name). Commands only render what comes back. A refused lever, or follow-up work that could not be queued,
raises :class:`remediation.cli.context.CliError`.

Why: docs/running.md#the-cli
"""

from __future__ import annotations

from typing import Any, Protocol

from remediation.cli.context import EXIT_REQUEST, CliError, State
from remediation.domain_repair import service as repairs
from remediation.domain_repair.service import cancelled_text
from remediation.evidence_collection import service as collected
from remediation.incidents import service as inc
from remediation.repair_requests import service as repair_requests
from remediation.repair_requests.rules import CallbackStatus, RepairStatus, answered_text, checked_ticket
from remediation.services import policy_views
from remediation.services.clusters import (
    cluster_states,
    incident_cluster,
    known_clusters,
    node_cluster,
    remediation_cluster,
    repair_cluster,
)
from remediation.services.holds import automation_status
from remediation.services.lemons import LemonRow, lemons
from remediation.services.readmodels import (
    AuditRow,
    ClusterState,
    EventRow,
    NodeDetail,
    NodeRow,
    RecordNotFound,
    RejectedRow,
    RemediationDetail,
    RemediationRow,
    get_node,
    get_remediation,
    jsonable,
    list_audit,
    list_events,
    list_nodes,
    list_rejected,
    list_remediations,
    node_detail,
)
from remediation.services.stats import Stats, StatsQuery, stats
from remediation.settings import LemonSettings


class Backend(Protocol):
    mode: str  # "db" or "api": how the CLI reaches the service, as the audit log records it

    def nodes(self, status: str | None, profile: str | None = None) -> list[NodeRow]: ...
    def node(self, name: str) -> NodeRow: ...
    def node_detail(self, name: str, limit: int) -> NodeDetail: ...
    def events(self, node: str | None, after: int | None, limit: int) -> list[EventRow]: ...
    def remediations(self, status: str | None, node: str | None, limit: int,
                     *, profile: str | None = None) -> list[RemediationRow]: ...
    def remediation(self, remediation_id: int) -> RemediationDetail: ...
    def evidence(self, remediation_id: int, name: str, step_id: int | None = None) -> str: ...
    def rejected(self, limit: int) -> list[RejectedRow]: ...
    def audit(self, target: str | None, action: str | None, limit: int) -> list[AuditRow]: ...
    def stats(self, days: int, top: int, dry_run: bool, *, profile: str | None = None) -> Stats: ...
    def lemons(self, top: int) -> list[LemonRow]: ...
    def lemon_policy(self) -> LemonSettings | None: ...
    def status(self) -> dict[str, Any]: ...
    def incidents(self, status: str | None, limit: int) -> list[dict[str, Any]]: ...
    def incident(self, incident_id: int) -> dict[str, Any]: ...
    def repairs(self, status: str | None, limit: int) -> list[dict[str, Any]]: ...
    def repair(self, repair_id: int) -> dict[str, Any]: ...
    def cancel_repair(self, repair_id: int, reason: str) -> str: ...
    def repair_requests(self, status: str | None, node: str | None, limit: int) -> list[dict[str, Any]]: ...
    def repair_request(self, request_id: int) -> dict[str, Any]: ...
    def answer_repair(self, node: str, status: CallbackStatus, *, ticket: str, note: str | None) -> str: ...
    def breaker(self, profile: str | None = None) -> dict[str, Any]: ...
    def clusters(self) -> list[ClusterState]: ...
    def policy_show(self, profile: str | None) -> dict[str, Any]: ...
    def policy_explain(self, node: str) -> dict[str, Any]: ...
    def quarantine(self, node: str, reason: str) -> str: ...
    def release(self, node: str, reason: str) -> str: ...
    def cancel(self, remediation_id: int, reason: str, give_back: bool) -> str: ...
    def set_paused(self, paused: bool, reason: str) -> str: ...
    def report(self, node: str, reason: str) -> str: ...
    def close_breaker(self, reason: str, profile: str | None = None) -> str: ...
    def resolve_incident(self, incident_id: int, reason: str) -> str: ...


def backend(st: State) -> Backend:
    """The API client with ``--server``, else the database (built once per invocation)."""
    if st.server is None:
        return Direct(st)
    if st.remote is None:
        from remediation.cli.remote import Remote  # httpx only where the API mode needs it

        st.remote = Remote(st.server, st.token or "")
    st.remote.cluster = st.cluster  # every request names --cluster (None: every cluster)
    remote: Backend = st.remote
    return remote


class Direct:
    """Reads and levers over this machine's database connection (``via=db``)."""

    mode = "db"

    def __init__(self, st: State) -> None:
        self.st = st

    # ------------------------------------------------------------------------------------ reads

    def nodes(self, status: str | None, profile: str | None = None) -> list[NodeRow]:
        with self.st.reading() as s:
            return list_nodes(s, status, self.st.settings().policy.lemon, now=self.st.now(), profile=profile)

    def node_cluster(self, name: str) -> str:
        """The cluster node ``name`` is in (``--cluster``, else its only one; ambiguous is an error)."""
        with self.st.reading() as s:
            return node_cluster(s, name, self.st.cluster)

    def _about(self, node: str | None) -> str | None:
        """The cluster a read about ``node`` is scoped to: the node's, or ``--cluster`` (None: all)."""
        return self.node_cluster(node) if node else self.st.cluster

    def node(self, name: str) -> NodeRow:
        with self.st.reading(self.node_cluster(name)) as s:
            return get_node(s, name)

    def node_detail(self, name: str, limit: int) -> NodeDetail:
        with self.st.reading(self.node_cluster(name)) as s:
            return node_detail(s, name, limit, policy=self.st.settings().policy, now=self.st.now())

    def events(self, node: str | None, after: int | None, limit: int) -> list[EventRow]:
        with self.st.reading(self._about(node)) as s:
            return list_events(s, node=node, after_id=after, limit=limit)

    def remediations(self, status: str | None, node: str | None, limit: int,
                     *, profile: str | None = None) -> list[RemediationRow]:
        with self.st.reading(self._about(node)) as s:
            return list_remediations(s, status, node, limit=limit, profile=profile)

    def remediation(self, remediation_id: int) -> RemediationDetail:
        with self.st.reading() as s:
            return get_remediation(s, remediation_id)

    def evidence(self, remediation_id: int, name: str, step_id: int | None = None) -> str:
        from remediation.adapters.factory import evidence_storage

        storage = evidence_storage(self.st.settings())
        with self.st.reading() as s:
            return collected.whole(collected.find(s, remediation_id, name, step_id=step_id), storage)

    def rejected(self, limit: int) -> list[RejectedRow]:
        with self.st.reading() as s:
            return list_rejected(s, limit)

    def audit(self, target: str | None, action: str | None, limit: int) -> list[AuditRow]:
        try:
            cluster = self._about(target)
        except RecordNotFound:  # a target that is no node in the inventory: every cluster's rows of it
            cluster = self.st.cluster
        with self.st.reading(cluster) as s:
            return list_audit(s, target, action, limit=limit)

    def stats(self, days: int, top: int, dry_run: bool, *, profile: str | None = None) -> Stats:
        with self.st.reading() as s:
            return stats(s, self.st.now(), StatsQuery(days, top, include_dry_run=dry_run, profile=profile),
                         repeat_window=self.st.settings().policy.repeat_offender_window)

    def lemons(self, top: int) -> list[LemonRow]:
        with self.st.reading() as s:
            return lemons(s, self.st.now(), self.st.settings().policy.lemon, top=top)

    def lemon_policy(self) -> LemonSettings | None:
        return self.st.settings().policy.lemon

    def status(self) -> dict[str, Any]:
        with self.st.reading() as s:
            found = automation_status(s, pool_stale=self.st.settings().policy.pool_stale)
        return {**found, "clusters": jsonable(self.clusters())}

    def incidents(self, status: str | None, limit: int) -> list[dict[str, Any]]:
        with self.st.reading() as s:
            return inc.list_incidents(s, status, limit)

    def incident(self, incident_id: int) -> dict[str, Any]:
        with self.st.reading() as s:
            return inc.show(s, incident_id)

    def repairs(self, status: str | None, limit: int) -> list[dict[str, Any]]:
        with self.st.reading() as s:
            return repairs.list_repairs(s, status, limit)

    def repair(self, repair_id: int) -> dict[str, Any]:
        with self.st.reading() as s:
            return repairs.show_repair(s, repair_id)

    def repair_requests(self, status: str | None, node: str | None, limit: int) -> list[dict[str, Any]]:
        with self.st.reading() as s:
            return repair_requests.list_requests(s, status=RepairStatus(status) if status else None, node=node,
                                                 limit=limit)

    def repair_request(self, request_id: int) -> dict[str, Any]:
        with self.st.reading() as s:
            return repair_requests.detail(s, request_id)

    def clusters(self) -> list[ClusterState]:
        with self.st.reading() as s:
            return cluster_states(s, self._clusters())

    def _clusters(self) -> list[str]:
        """``--cluster``, else every cluster the configuration or the database knows."""
        if self.st.cluster is not None:
            return [self.st.cluster]
        with self.st.sessions()() as s:
            return known_clusters(s, self.st.settings().fleet())

    def breaker(self, profile: str | None = None) -> dict[str, Any]:
        """The breaker of ``--cluster`` or the only cluster; of several, the first latched (naming it)."""
        clusters = self._clusters()
        if len(clusters) == 1:
            return self.st.levers(clusters[0]).breaker_status(profile)
        latches = {c: self.st.levers(c).breaker_status(profile) for c in clusters}
        return next(({**v, "cluster": c} for c, v in latches.items() if v.get("open")), {})

    def policy_show(self, profile: str | None) -> dict[str, Any]:
        with self.st.reading() as s:
            return policy_views.show(s, self.st.settings(), profile)

    def policy_explain(self, node: str) -> dict[str, Any]:
        with self.st.reading(self.node_cluster(node)) as s:
            return policy_views.explain_node(s, self.st.settings(), node)

    # ----------------------------------------------------------------------------------- levers

    def quarantine(self, node: str, reason: str) -> str:
        followup = self.st.levers(self.node_cluster(node)).quarantine(node, self.st.actor, reason)
        return f"node/{node} quarantining (remediation #{followup.remediation_id})"

    def release(self, node: str, reason: str) -> str:
        undo = self.st.levers(self.node_cluster(node)).release(node, self.st.actor, reason)
        if undo.error is not None:  # committed, but the Slurm/Kubernetes undo could not be queued
            raise CliError(
                f"node/{node} released in the database, but the release actions could not be "
                f"queued ({undo.error}); resume it by hand (scontrol update nodename={node} "
                "state=resume)",
                EXIT_REQUEST,
            )
        return f"node/{node} released"

    def cancel(self, remediation_id: int, reason: str, give_back: bool) -> str:
        with self.st.sessions()() as s:
            cluster = remediation_cluster(s, remediation_id, self.st.cluster)
        done = self.st.levers(cluster).cancel(remediation_id, self.st.actor, reason, give_back=give_back)
        node, step = done.node, done.step
        if done.undo is None:
            return f"remediation/{remediation_id} cancelled at {step} (node/{node} left as it is)"
        if done.undo.error is not None:  # committed, but the Slurm/Kubernetes undo could not be queued
            raise CliError(
                f"remediation/{remediation_id} cancelled, but giving back node/{node} could not be "
                f"queued ({done.undo.error}); resume it by hand (scontrol update nodename={node} "
                "state=resume)",
                EXIT_REQUEST,
            )
        return f"remediation/{remediation_id} cancelled at {step}; giving back node/{node} (our drain, cordon, taint)"

    def set_paused(self, paused: bool, reason: str) -> str:
        """Pause or resume ``--cluster``, else every cluster (each audited in its own)."""
        before = self.st.levers().set_paused_in(self._clusters(), paused, self.st.actor, reason=reason)
        lines = []
        for cluster, was in before.items():
            said = ("automation paused" + (" (it already was)" if was else "") if paused
                    else "automation resumed" + ("" if was else " (it was not paused)"))
            lines.append(said if len(before) == 1 else f"cluster {cluster}: {said}")
        return "\n".join(lines)

    def report(self, node: str, reason: str) -> str:
        followups = self.st.levers(self.node_cluster(node)).report(node, self.st.actor, reason)
        if followups:
            return f"node/{node} reported: remediation #{followups[0].remediation_id} opened"
        return f"node/{node} reported and recorded (no new remediation: see `remediation nodes show {node}`)"

    def close_breaker(self, reason: str, profile: str | None = None) -> str:
        """Close the breaker of ``--cluster``, else of every cluster where it is open."""
        closed = self.st.levers().close_breakers(self._clusters(), self.st.actor, reason=reason,
                                                 profile=profile)
        whose = f"profile {profile}'s storm breaker" if profile else "storm breaker"
        lines = [f"{whose} closed; {len(f)} held remediation(s) re-check their trigger now" for f in closed.values()]
        if len(closed) == 1 and len(self._clusters()) == 1:
            return lines[0]
        return "\n".join(f"cluster {c}: {line}" for c, line in zip(closed, lines, strict=True))

    def cancel_repair(self, repair_id: int, reason: str) -> str:
        with self.st.sessions()() as s:
            cluster = repair_cluster(s, repair_id, self.st.cluster)
        held = self.st.levers(cluster).cancel_repair(repair_id, self.st.actor, reason)
        return cancelled_text(repair_id, held)

    def answer_repair(self, node: str, status: CallbackStatus, *, ticket: str, note: str | None) -> str:
        try:
            ticket = checked_ticket(ticket)
        except ValueError as exc:
            raise CliError(str(exc), EXIT_REQUEST) from None
        cluster = self.node_cluster(node)
        with self.st.reading(cluster) as s:
            request_id = repair_requests.open_request_of(s, node)
        said = repair_requests.Answer(status, ticket, self.st.actor, note)
        followup = self.st.levers(cluster).answer_repair(request_id, said)
        return answered_text(node, request_id, followup.remediation_id if followup else None)

    def resolve_incident(self, incident_id: int, reason: str) -> str:
        with self.st.sessions()() as s:
            cluster = incident_cluster(s, incident_id, self.st.cluster)
        followups = self.st.levers(cluster).resolve_incident(incident_id, self.st.actor, reason)
        return f"incident/{incident_id} resolved; {len(followups)} member remediation(s) re-check their trigger now"
