"""What the demo prints, read back from the database the service wrote (never from its own guesses).

- :class:`Progress` polls the remediations and the breaker's audit rows and prints each change as
  it happens (a live log of the workflow moving through its steps).
- :func:`read_summary` collects the facts the demo promises: remediations succeeded (with every step
  of the happy path recorded ``done``), the quarantined node, the breaker opening and closing, the
  VM actions the cloud endpoints answered, and detection (fault injected -> event recorded) and
  recovery (remediation opened -> closed) times.
"""

from __future__ import annotations

import statistics
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy import select

from remediation.db.models import AuditLog, Event, Remediation, Validation
from remediation.db.session import make_engine, make_session_factory
from remediation.domain.statemachine import HAPPY_PATH, OPEN_STATUSES, Step
from remediation.settings import Settings

DETECTABLE = frozenset({"researcher_fail", "slurmd_stop", "gpu_condition", "storm", "node_not_ready"})


def _ts(value: datetime) -> float:
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


class Progress:
    """Prints remediation and breaker changes as they land in the database."""

    def __init__(self, settings: Settings, console: Console) -> None:
        self.sessions = make_session_factory(make_engine(settings.database))
        self.console = console
        self._seen: dict[int, tuple[str, str]] = {}
        self._audit_id = 0
        self._open = 0
        self._total = 0

    def poll(self, elapsed: float) -> None:
        with self.sessions() as s:
            rows = s.execute(
                select(Remediation.id, Remediation.node, Remediation.status, Remediation.step)
            ).all()
            audit = s.execute(
                select(AuditLog.id, AuditLog.action, AuditLog.target, AuditLog.reason)
                .where(AuditLog.id > self._audit_id)
                .where(AuditLog.action.in_(("breaker_open", "breaker_closed", "escalate", "validation_held")))
                .order_by(AuditLog.id)
            ).all()
        self._total = len(rows)
        self._open = sum(1 for r in rows if r.status in OPEN_STATUSES)
        for rid, node, status, step in rows:
            if self._seen.get(rid) != (status, step):
                self._seen[rid] = (status, step)
                color = {"succeeded": "green", "quarantined": "red"}.get(status, "cyan")
                self.console.print(f"[{elapsed:5.1f}s] #{rid} {node}: [{color}]{status}[/] {step}")
        for aid, action, target, reason in audit:
            self._audit_id = aid
            color = "red" if action == "breaker_open" else "magenta"
            self.console.print(f"[{elapsed:5.1f}s] [{color}]{action}[/] {target} {reason[:100]}")

    def settled(self, min_remediations: int) -> bool:
        return self._total >= min_remediations and self._open == 0

    def print_summary(self, summary: dict[str, Any]) -> None:
        table = Table(title="Remediations")
        for col in ("#", "node", "outcome", "cause", "steps done", "time to recover"):
            table.add_column(col)
        for r in summary["remediations"]:
            took = f"{r['recovery_s']:.1f}s" if r["recovery_s"] is not None else "-"
            color = {"succeeded": "green", "quarantined": "red"}.get(r["status"], "yellow")
            table.add_row(str(r["id"]), r["node"], f"[{color}]{r['status']}[/]", r["cause"][:50],
                          str(len(r["steps_done"])), took)  # fmt: skip
        self.console.print(table)
        c = self.console
        c.print(f"succeeded: {summary['succeeded']}, quarantined: {summary['quarantined']}, "
                f"VM actions at the clouds: {sum(summary['vm_actions'].values())}, breaker opened "
                f"{summary['breaker_opened']}x / closed {summary['breaker_closed']}x")  # fmt: skip
        gate = summary.get("gate") or {}
        if gate:
            c.print(f"health gate: {summary['gate_checks']} GPU check(s); "
                    + "; ".join(f"{outcome}: {', '.join(nodes)}" for outcome, nodes in gate.items()))
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


def read_summary(settings: Settings, cluster: Any, *, timed_out: bool) -> dict[str, Any]:
    sessions = make_session_factory(make_engine(settings.database))
    with sessions() as s:
        rems = s.scalars(select(Remediation).order_by(Remediation.id)).all()
        events = s.execute(select(Event.node, Event.kind, Event.decision, Event.decision_reason,
                                  Event.received_at).order_by(Event.id)).all()  # fmt: skip
        audit = list(s.scalars(select(AuditLog.action)).all())
        checks = s.execute(select(Validation.node, Validation.outcome, Validation.duration_s)).all()
        remediations = [
            {
                "id": r.id, "node": r.node, "status": r.status, "cause": r.cause,
                "steps_done": sorted({st.step for st in r.steps if st.status == "done"}),
                "recovery_s": _ts(r.closed_at) - _ts(r.opened_at) if r.closed_at and r.status == "succeeded" else None,
            }
            for r in rems
        ]  # fmt: skip
    happy = {str(step) for step in HAPPY_PATH if step is not Step.DONE}
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
        "quarantined": sorted({r["node"] for r in remediations if r["status"] == "quarantined"}),
        "breaker_opened": audit.count("breaker_open"),
        "breaker_closed": audit.count("breaker_closed"),
        "vm_actions": {n: k for n in cluster.names if (k := cluster.vm_actions(n))},
        "detection_s": detection,
        "recovery_s": [r["recovery_s"] for r in remediations if r["recovery_s"] is not None],
        "ignored": ignored,
        "gate": {outcome: sorted({c.node for c in checks if c.outcome == outcome})
                 for outcome in sorted({c.outcome for c in checks})},
        "gate_checks": len(checks),
        "timed_out": timed_out,
    }
