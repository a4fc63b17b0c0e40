"""``remediation status``: is automation running, and if not, who or what stopped it and why.

The first command to type at 3 a.m. It reads the same overview as the dashboard (``views.overview``):
whether automation is paused (by a human, or by the system on a fault in its own plumbing, with the
error and whether the health probe will lift it), the storm breaker, remediations by status and the ones
held on an error nobody mapped, each with what it waits on.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import typer
from sqlalchemy import select

from remediation.cli import render as r
from remediation.cli.context import cli_errors, state
from remediation.db.models import Remediation
from remediation.domain.statemachine import OPEN_STATUSES
from remediation.services.readmodels import overview

OUTPUT = typer.Option("table", "--output", "-o", help="table, wide or json.")


def _pause_line(detail: dict[str, Any]) -> str:
    if not detail.get("paused"):
        return "running"
    line = f"PAUSED by {detail.get('by', '?')}: {detail.get('reason', '')}"
    if detail.get("by") == "system":
        line += (f" (lifted by itself after the health probe of {detail.get('component')} succeeds; "
                 f"{detail.get('probe_ok', 0)} so far)" if detail.get("self_healing")
                 else " (a human must fix it, then run `remediation resume -r REASON`)")
    return line


@cli_errors
def status(ctx: typer.Context, output: str = OUTPUT) -> None:
    """Automation, breaker and remediations at a glance: what is stopped, by whom, and why."""
    fmt = r.check_format(output)
    st = state(ctx)
    with st.sessions()() as s:
        ov = overview(s)
        open_rems = s.scalars(
            select(Remediation).where(Remediation.status.in_(OPEN_STATUSES)).order_by(Remediation.id)
        ).all()
        held = [(x.id, x.node, x.step, x.wait_reason or "") for x in open_rems if (x.context or {}).get("held")]
    if fmt == "json":
        return r.print_json({"automation": ov.paused_detail or {"paused": False}, "breaker": ov.breaker_detail,
                             "remediations": ov.remediations_by_status, "nodes": ov.nodes_by_status,
                             "held": [{"id": i, "node": n, "step": p, "reason": w} for i, n, p, w in held]})
    breaker = ov.breaker_detail
    head = r.fields([
        ("Automation", _pause_line(ov.paused_detail)),
        ("Since", r.when(_at(ov.paused_detail), st.now()) if ov.paused else "-"),
        ("Storm breaker", "OPEN: " + str(breaker.get("reason") or f"{breaker.get('failed')}/{breaker.get('pool')} "
                                         "nodes failed within the window") if ov.breaker_open else "closed"),
        ("Remediations", ", ".join(f"{k} {v}" for k, v in ov.remediations_by_status.items() if v) or "none"),
        ("Nodes", ", ".join(f"{k} {v}" for k, v in ov.nodes_by_status.items() if v) or "none"),
    ])
    parts: list[object] = [head]
    if held:
        parts += ["", r.table(["remediation", "node", "step", "held because"],
                              [[f"#{i}", n, p, w] for i, n, p, w in held], title="Held (a human decides)")]
    r.show(*parts)


def _at(detail: dict[str, Any]) -> datetime | None:
    text = detail.get("at")
    return datetime.fromisoformat(text) if isinstance(text, str) else None
