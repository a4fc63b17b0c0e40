"""What the demo prints, read back from the database the service wrote (never from its own guesses).

:class:`Progress` prints each change of the remediations and the breaker as it happens;
:func:`read_summary` collects the demo's promised facts: outcomes, quarantines, the breaker, incidents, VM
actions and detection and recovery times.

Why: docs/running.md#the-demo
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from remediation.db.models import (
    AuditLog,
    DomainRepair,
    DomainRepairStep,
    Event,
    EvidenceItem,
    Incident,
    Remediation,
    RemediationStep,
    Validation,
)
from remediation.db.scope import scoped
from remediation.db.session import make_engine, make_session_factory
from remediation.domain.gpu_reset import machine_step_did
from remediation.domain.statemachine import HAPPY_PATH, OPEN_STATUSES, Step
from remediation.domain.topology import domain_key
from remediation.domain_repair.rules import DomainRepairStatus, DomainStep
from remediation.hostlist import compress
from remediation.services.hardware import node_eras
from remediation.settings import Settings
from remediation.vocabulary import DEFAULT_CLUSTER, GPU_RESET

DETECTABLE = frozenset({"researcher_fail", "slurmd_stop", "gpu_condition", "storm", "node_not_ready", "switch_down"})
#: How the report names a machine step that reset a GPU (the glossary's word; not a VM action).
GPU_RESET_SHOWN = "GPU reset"
LIVE_AUDIT = ("breaker_open", "breaker_closed", "escalate", "validation_held", "incident_opened",
              "incident_joined", "incident_recovered", "incident_resolved", "domain_repair_opened",
              "domain_repair_joined", "domain_repair_returned", "domain_repair_quarantined")
#: The audit rows that page on-call once for a whole incident or NVLink domain: printed whole.
PAGES = ("incident_opened", "domain_repair_opened", "domain_repair_quarantined")


def _ts(value: datetime) -> float:
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def _natural(node: str) -> tuple[str, int]:
    """gpu-node-9 before gpu-node-16."""
    head, _, num = node.rpartition("-")
    return (head, int(num)) if num.isdigit() else (node, -1)


def _in_service(cluster: Any, node: str) -> bool:
    """In the simulated world now: slurmctld has it up (not DOWN, drained, failed or silent) and its
    Kubernetes Node takes pods (not cordoned)."""
    base, flags, _ = cluster.slurm_state(node)
    cordoned = bool(cluster.kube.node(cluster.link(node).k8s)["spec"].get("unschedulable"))
    return base != "DOWN" and not flags & {"DRAIN", "FAIL", "NOT_RESPONDING"} and not cordoned


class Progress:
    """Prints remediation and breaker changes as they land in the database."""

    def __init__(self, settings: Settings, console: Console) -> None:
        self.sessions = make_session_factory(make_engine(settings.database))
        self.console = console
        self._seen: dict[int, tuple[str, str]] = {}
        self._repairs: dict[int, tuple[str, str]] = {}
        self._audit_id = 0
        self._open = 0
        self._total = 0

    def poll(self, elapsed: float) -> None:
        with self.sessions() as s:
            rows = s.execute(
                select(Remediation.id, Remediation.cluster, Remediation.node, Remediation.status, Remediation.step)
            ).all()
            audit = s.execute(
                select(AuditLog.id, AuditLog.cluster, AuditLog.action, AuditLog.target, AuditLog.reason)
                .where(AuditLog.id > self._audit_id)
                .where(AuditLog.action.in_(LIVE_AUDIT))
                .order_by(AuditLog.id)
            ).all()
            repairs = s.execute(select(DomainRepair.id, DomainRepair.cluster, DomainRepair.kind, DomainRepair.name,
                                       DomainRepair.size, DomainRepair.status, DomainRepair.step)).all()
        self._total = len(rows)
        self._open = sum(1 for r in rows if r.status in OPEN_STATUSES)
        for rid, cluster, node, status, step in rows:
            if self._seen.get(rid) != (status, step):
                self._seen[rid] = (status, step)
                color = {"succeeded": "green", "quarantined": "red"}.get(status, "cyan")
                self.console.print(f"[{elapsed:5.1f}s] #{rid} {cluster}/{node}: [{color}]{status}[/] {step}")
        for rid, cluster, kind, name, size, status, step in repairs:
            if self._repairs.get(rid) != (status, step):
                self._repairs[rid] = (status, step)
                color = {"returned": "green", "quarantined": "red"}.get(status, "cyan")
                self.console.print(f"[{elapsed:5.1f}s] domain repair #{rid} {cluster}/{kind} {name} ({size} trays): "
                                   f"[{color}]{status}[/] {step}")
        for aid, cluster, action, target, reason in audit:
            self._audit_id = aid
            page = action in PAGES
            color = "red" if page or action == "breaker_open" else "magenta"
            where = f"{cluster}/{target}" if target else f"{cluster}:"
            self.console.print(f"[{elapsed:5.1f}s] [{color}]{action}[/] {where} {reason if page else reason[:160]}")

    def settled(self, min_remediations: int) -> bool:
        """Enough remediations opened, and none of them nor any domain repair is still open."""
        running = sum(1 for status, _ in self._repairs.values() if status == DomainRepairStatus.RUNNING)
        return self._total >= min_remediations and self._open == 0 and running == 0

    def print_summary(self, summary: dict[str, Any]) -> None:
        c = self.console
        c.print(remediations_table(summary["remediations"], c))
        for name, one in summary["clusters"].items():
            c.print(f"[bold]cluster {name}[/]: {one['remediations']} remediation(s), {one['succeeded']} succeeded, "
                    f"quarantined: {', '.join(one['quarantined']) or 'none'}; events: {one['events']}")
        for inc in summary["incidents"]:
            took = f" after {inc['open_s']:.1f}s" if inc["open_s"] is not None else ""
            c.print(f"[bold]incident #{inc['id']}[/] {inc['domain']} (likely cause: {inc['cause']}): "
                    f"{len(inc['nodes'])} of its {inc['domain_size']} nodes, {compress(inc['nodes'])}; {inc['status']}{took}")
            c.print(f"  VM actions on its nodes: {inc['vm_actions']} (clouds' logs), {inc['vm_steps']} (workflow "
                    f"steps); pages: {inc['pages']}; back in service: {len(inc['in_service'])}/{len(inc['nodes'])} "
                    "(Slurm up and not drained, Node uncordoned)")  # fmt: skip
        for dom in summary.get("nvlink_domains") or []:
            c.print(domain_line(dom))
        c.print(f"succeeded: {summary['succeeded']}, quarantined: {summary['quarantined']}, "
                f"incidents: {len(summary['incidents'])}, VM actions at the clouds and the BMC: "
                f"{sum(summary['vm_actions'].values())}, breaker opened "
                f"{summary['breaker_opened']}x / closed {summary['breaker_closed']}x")  # fmt: skip
        for node in summary["quarantined"]:
            c.print(f"quarantined {node} after {summary['vm_actions'].get(node, 0)} VM action(s) at its cloud")
        validation = summary.get("validation") or {}
        if validation:
            c.print(f"validation: {summary['validation_checks']} GPU check(s); "
                    + "; ".join(f"{outcome}: {', '.join(nodes)}" for outcome, nodes in validation.items()))
        if (ev := summary.get("evidence") or {}).get("items"):
            c.print(f"collected evidence: {ev['items']} item(s) ({ev['collected']} collected) from "
                    f"{ev['remediations']} remediation(s) before the hammer; lines in the nodes' journals: "
                    f"{ev['journal_lines']}")
        for move in summary["hardware_moves"]:
            c.print(f"new hardware under the same name: {move['cluster']}/{move['node']}: {move['why']} "
                    f"({move['before']} -> {move['after']})")
        for node, why in summary["ignored"].items():
            c.print(f"left alone: {node}: {why}")
        det, rec = summary["detection_s"], summary["recovery_s"]
        if det:
            c.print(f"detection (fault -> event recorded): p50 {statistics.median(det):.2f}s, "
                    f"max {max(det):.2f}s over {len(det)} faults")  # fmt: skip
        if rec:
            c.print(f"recovery (opened -> back in service): p50 {statistics.median(rec):.1f}s, "
                    f"max {max(rec):.1f}s (simulated reboots)")  # fmt: skip
        dash = summary.get("dashboard") or {}
        c.print(f"dashboard {dash.get('url')}: /api/v1/overview answered {dash.get('status')} during the run")
        if summary["timed_out"]:
            c.print("[red]the demo timed out before every remediation settled[/]")


def domain_line(dom: dict[str, Any]) -> str:
    """An NVLink domain's story in one line: its repairs against the remediations its trays did not get,
    the Jobs each step ran, how it ended and its trays in service now (every figure counted)."""
    trays, fab, check = len(dom["trays"]), dom["jobs"].get("fabric_restart", {}), dom["jobs"].get("domain_check", {})
    took = f" after {dom['open_s']:.1f}s" if dom["open_s"] is not None else ""
    return (f"[bold]NVLink domain {dom['domain']}[/] (cluster {dom['cluster']}): {len(dom['repairs'])} domain "
            f"repair for {trays} trays, {dom['tray_remediations']} tray remediations (not {trays}); fabric restart "
            f"{fab.get('jobs', 0)} Jobs on {len(fab.get('nodes', []))} Nodes, domain check {check.get('jobs', 0)} "
            f"Job ({check.get('indexed', 0)} Indexed, {check.get('pods', 0)} pods on {len(check.get('nodes', []))} "
            f"Nodes); {dom['status']}{took}; back in service: {len(dom['in_service'])}/{trays}; VM actions: "
            f"{dom['vm_actions']}")


def remediations_table(remediations: list[dict[str, Any]], console: Console) -> Table:
    """One row per remediation, fitted to ``console``'s width: a column per fact where the whole table
    fits, otherwise the node and its outcome whole beside the rest stacked in one cell, so that no node
    name or status is ever cut short."""
    wide = Table(title="Remediations")
    columns = ("#", "cluster", "node", "outcome", "class", "action", "machine steps", "cause", "steps done", "time to recover")
    for col in columns:
        wide.add_column(col)
    for r in remediations:
        wide.add_row(str(r["id"]), r["cluster"], r["node"], _outcome(r), r["fault_class"] or "-", r["action"] or "-",
                     ", ".join(r["machine_steps"]) or "none", r["cause"][:44], str(len(r["steps_done"])),
                     _took(r))  # fmt: skip
    if Measurement.get(console, console.options.update_width(10_000), wide).maximum <= console.width:
        return wide
    stacked = Table(title="Remediations", show_lines=True)
    stacked.add_column("#", no_wrap=True)
    stacked.add_column("node", no_wrap=True)
    stacked.add_column("outcome", no_wrap=True)
    stacked.add_column("what happened")
    for r in remediations:
        did = ", ".join(r["machine_steps"]) or "none"
        took = f"recovered in {_took(r)}" if r["recovery_s"] is not None else "not recovered"
        detail = (f"{r['fault_class'] or '-'} -> {r['action'] or '-'}; machine steps: {did}\n"
                  f"cause: {r['cause'][:80]}\n{len(r['steps_done'])} steps done; {took}")  # fmt: skip
        stacked.add_row(str(r["id"]), f"{r['node']}\n{r['cluster']}", _outcome(r, "\n"), detail)
    return stacked


def _outcome(r: dict[str, Any], sep: str = " ") -> str:
    color = {"succeeded": "green", "quarantined": "red"}.get(r["status"], "yellow")
    incident = f"{sep}(incident #{r['incident']})" if r["incident"] else ""
    return f"[{color}]{r['status']}[/]{incident}"


def machine_steps(steps: Iterable[RemediationStep]) -> list[str]:
    """What each machine step (``vm_restart``) of a remediation did, in order: the VM action its backend
    took, or a GPU reset, named as such (docs/architecture.md, the glossary: a GPU reset is no machine
    action)."""
    did = [machine_step_did(st.provider_op) for st in sorted(steps, key=lambda st: st.id)
           if st.step == Step.VM_RESTART and st.provider_op]  # fmt: skip
    return [GPU_RESET_SHOWN if d == GPU_RESET else d for d in did]


def vm_actions(did: list[str]) -> list[str]:
    """Of what machine steps did, the VM actions (what the clouds' and the BMC's logs count too)."""
    return [d for d in did if d != GPU_RESET_SHOWN]


def _took(r: dict[str, Any]) -> str:
    return f"{r['recovery_s']:.1f}s" if r["recovery_s"] is not None else "-"


def read_summary(settings: Settings, cluster: Any, *, timed_out: bool, simulated: str = DEFAULT_CLUSTER,
                 racks: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the demo did, read back from the database and checked against the simulated cluster's own
    counts (``cluster``, named ``simulated``): remediations, incidents, the breaker, VM actions,
    detection and recovery times, the validation's verdicts and hardware moves; per cluster, what it
    opened and how that ended; and the NVLink domains of the simulated ``racks`` (by cluster name)."""
    sessions = make_session_factory(make_engine(settings.database))
    with sessions() as s:  # unscoped: every cluster, as on-call sees them
        remediations = _remediation_rows(s.scalars(select(Remediation).order_by(Remediation.id)).all())
        events = s.execute(select(Event.cluster, Event.node, Event.kind, Event.decision, Event.decision_reason,
                                  Event.received_at).order_by(Event.id)).all()  # fmt: skip
        audit_rows = s.execute(select(AuditLog.action, AuditLog.target, AuditLog.detail)).all()
        audit = [a.action for a in audit_rows]
        checks = s.execute(select(Validation.node, Validation.outcome, Validation.duration_s)).all()
        kept = s.execute(select(EvidenceItem.remediation_id, EvidenceItem.node, EvidenceItem.status)).all()
        incidents = _incident_rows(s, audit_rows)
        domains = nvlink_domains(s, racks or {})
    moves = []
    for name in settings.fleet():  # each cluster's own: a node is (cluster, name)
        with scoped(sessions, name)() as s:
            moves += [{"cluster": name, "node": node, "why": e.why, "before": eras[e.ordinal - 2].key,
                       "after": e.key} for node, eras in node_eras(s).items() for e in eras if e.ordinal > 1]
    _add_cluster_counts(incidents, remediations, cluster)
    happy = {str(step) for step in HAPPY_PATH if step is not Step.DONE}
    ignored = {
        e.node: e.decision_reason for e in events
        if e.kind == "unhealthy" and e.decision == "record" and "ignore" in e.decision_reason
    }  # fmt: skip
    return {
        "remediations": remediations,
        "succeeded": sum(1 for r in remediations if r["status"] == "succeeded"),
        "succeeded_all_steps": sum(
            1 for r in remediations if r["status"] == "succeeded" and happy <= set(r["steps_done"])
        ),
        "quarantined": sorted({r["node"] for r in remediations if r["status"] == "quarantined"}, key=_natural),
        "incidents": incidents,
        "breaker_opened": audit.count("breaker_open"),
        "breaker_closed": audit.count("breaker_closed"),
        "vm_actions": {n: k for n in cluster.names if (k := cluster.vm_actions(n))},
        "detection_s": _detection_delays(cluster, [e for e in events if e.cluster == simulated]),
        "clusters": _per_cluster(settings, remediations, events),
        "recovery_s": [r["recovery_s"] for r in remediations if r["recovery_s"] is not None],
        "ignored": ignored,
        "validation": {outcome: sorted({c.node for c in checks if c.outcome == outcome})
                 for outcome in sorted({c.outcome for c in checks})},
        "validation_checks": len(checks),
        "hardware_moves": sorted(moves, key=lambda m: (m["cluster"], *_natural(m["node"]))),
        "evidence": {"items": len(kept), "remediations": len({k.remediation_id for k in kept}),
                     "collected": sum(1 for k in kept if k.status == "collected"),
                     "journal_lines": sum(len(cluster.journal(n).read_text().splitlines())
                                          for n in cluster.names if cluster.journal(n).exists())},
        "nvlink_domains": domains,
        "timed_out": timed_out,
    }


def _per_cluster(settings: Settings, remediations: list[dict[str, Any]], events: list[Any]) -> dict[str, Any]:
    """Each cluster the service serves, by name: its remediations, how many succeeded, the nodes it
    quarantined and the events its watchers published."""
    return {
        name: {
            "remediations": sum(1 for r in remediations if r["cluster"] == name),
            "succeeded": sum(1 for r in remediations if r["cluster"] == name and r["status"] == "succeeded"),
            "quarantined": sorted({r["node"] for r in remediations
                                   if r["cluster"] == name and r["status"] == "quarantined"}, key=_natural),
            "events": sum(1 for e in events if e.cluster == name),
        }
        for name in settings.fleet()
    }  # fmt: skip


def _remediation_rows(rems: Iterable[Remediation]) -> list[dict[str, Any]]:
    """Each remediation as the summary shows it; recovery time only for one that succeeded."""
    return [
        {
            "id": r.id, "cluster": r.cluster, "node": r.node, "status": r.status, "cause": r.cause,
            "fault_class": r.fault_class, "action": r.action, "incident": r.incident_id,
            "machine_steps": machine_steps(r.steps),
            "steps_done": sorted({st.step for st in r.steps if st.status == "done"}),
            "recovery_s": _ts(r.closed_at) - _ts(r.opened_at) if r.closed_at and r.status == "succeeded" else None,
        }
        for r in rems
    ]  # fmt: skip


def _incident_rows(s: Session, audit_rows: Iterable[Any]) -> list[dict[str, Any]]:
    """Each incident: its domain, nodes, how long it stayed open and the pages it raised."""
    audit_rows = list(audit_rows)
    return [
        {
            "id": i.id, "domain": domain_key(i.kind, i.name), "cause": i.cause, "status": i.status,
            "nodes": sorted(i.nodes or [], key=_natural), "domain_size": i.domain_size,
            "open_s": _ts(i.closed_at) - _ts(i.opened_at) if i.closed_at else None,
            "pages": sum(1 for a in audit_rows
                         if a.action == "incident_opened" and (a.detail or {}).get("incident") == i.id),
        }
        for i in s.scalars(select(Incident).order_by(Incident.id))
    ]  # fmt: skip


def nvlink_domains(s: Session, racks: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each NVLink domain of a simulated cluster in ``racks`` (by cluster name) that had a domain repair:
    its repairs, its trays, the remediations its trays got all the same, the Jobs each step started as
    that cluster's apiserver recorded them (:func:`step_jobs`), and the trays in service now."""
    by_domain: dict[tuple[str, str, str], list[DomainRepair]] = {}
    for rep in s.scalars(select(DomainRepair).where(DomainRepair.cluster.in_(list(racks))).order_by(DomainRepair.id)):
        by_domain.setdefault((rep.cluster, rep.kind, rep.name), []).append(rep)
    out = []
    for (name, kind, domain), reps in by_domain.items():
        sim, last = racks[name], reps[-1]
        trays = sorted({tray for rep in reps for tray in rep.trays}, key=_natural)
        jobs, others = step_jobs(sim, [step for rep in reps for step in rep.steps])
        out.append({
            "cluster": name, "domain": f"{kind} {domain}", "repairs": [rep.id for rep in reps], "trays": trays,
            "reporters": sorted({t for rep in reps for t in rep.reporters}, key=_natural),
            "tray_remediations": s.scalar(select(func.count()).select_from(Remediation).where(
                Remediation.cluster == name, Remediation.node.in_(trays))),
            "status": last.status.value, "k8s_nodes": sorted(sim.link(tray).k8s for tray in trays),
            "open_s": _ts(last.closed_at) - _ts(last.opened_at) if last.closed_at else None,
            "jobs": jobs, "other_jobs": others, "in_service": [t for t in trays if _in_service(sim, t)],
            "vm_actions": sum(sim.vm_actions(tray) for tray in trays),
        })
    return out


def step_jobs(sim: Any, steps: Iterable[DomainRepairStep]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The Jobs ``sim``'s apiserver created (its request log: a POST answered 201), by the domain step
    whose row names them: how many, how many Indexed, and the pods its kubelets started for them and on
    which Nodes (``kube.jobs.runs``); and the Jobs no step names, which should be none."""
    created = {r.body["metadata"]["name"]: r.body for r in sim.kube.requests
               if r.method == "POST" and r.path.endswith("/jobs") and r.status == 201}
    named = {job: DomainStep(step.step).value for step in steps for job in (step.detail or {}).get("refs", {})}
    runs = sim.kube.jobs.runs
    out: dict[str, dict[str, Any]] = {}
    for step in sorted(set(named.values())):
        jobs = sorted(job for job, by in named.items() if by == step and job in created)
        pods = [run for run in runs if run.job in jobs]
        out[step] = {"jobs": len(jobs), "names": jobs, "pods": len(pods), "nodes": sorted({p.node for p in pods}),
                     "indexed": sum(1 for job in jobs if created[job]["spec"].get("completionMode") == "Indexed")}
    return out, sorted(set(created) - set(named))


def _add_cluster_counts(incidents: list[dict[str, Any]], remediations: list[dict[str, Any]], cluster: Any) -> None:
    """Per incident: the VM actions the clouds counted on its nodes, the machine steps the database
    recorded, and which of its nodes are in service now."""
    for inc in incidents:
        members = set(inc["nodes"])
        inc["vm_actions"] = sum(cluster.vm_actions(n) for n in members)
        inc["vm_steps"] = sum(len(vm_actions(r["machine_steps"])) for r in remediations if r["node"] in members)
        inc["in_service"] = [n for n in inc["nodes"] if _in_service(cluster, n)]


def _detection_delays(cluster: Any, events: Iterable[Any]) -> list[float]:
    """For each detectable fault injected, the seconds until its node's first unhealthy event after it."""
    events = list(events)
    detection = []
    for inj in cluster.injections:
        if inj.kind not in DETECTABLE:
            continue
        seen = [
            _ts(e.received_at)
            for e in events
            if e.node == inj.node and e.kind == "unhealthy" and _ts(e.received_at) >= inj.at
        ]
        if seen:
            detection.append(min(seen) - inj.at)
    return detection
