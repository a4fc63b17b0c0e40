"""``remediation status``: is automation running, and if not, who or what stopped it and why.

The same overview as the dashboard (:func:`remediation.services.holds.automation_status`, ``GET
/api/v1/status``): whether automation is paused (by a human, or by the system on its own fault, and
whether the health probe will lift it), the storm breaker, remediations by status and the ones held on
an unmapped error, each with what it waits on.

Why: docs/on-call.md#on-call
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import typer

from remediation.cli import render as r
from remediation.cli.backend import backend
from remediation.cli.context import CLUSTER, cli_errors, state

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
def status(ctx: typer.Context, output: str = OUTPUT, *, cluster: str | None = CLUSTER) -> None:
    """Automation, breaker and remediations at a glance: what is stopped, by whom, and why."""
    fmt = r.check_format(output)
    st = state(ctx, cluster)
    report = backend(st).status()
    if fmt == "json":
        return r.print_json(report)
    paused, breaker = report["automation"], report["breaker"]
    held = [(h["id"], h["node"], h["step"], h["reason"]) for h in report["held"]]
    head = r.fields([
        ("Automation", _pause_line(paused)),
        ("Since", r.when(_at(paused), st.now()) if paused.get("paused") else "-"),
        ("Storm breaker", "OPEN: " + str(breaker.get("reason") or f"{breaker.get('failed')}/{breaker.get('pool')} "
                                         "nodes failed within the window") if breaker.get("open") else "closed"),
        ("Profiles' breakers", "; ".join(f"{name} OPEN: {latch.get('reason')}" for name, latch in
                                         report.get("profile_breakers", {}).items()) or None),
        ("Remediations", ", ".join(f"{k} {v}" for k, v in report["remediations"].items() if v) or "none"),
        ("Nodes", ", ".join(f"{k} {v}" for k, v in report["nodes"].items() if v) or "none"),
        ("Breaker's pool", _pool_line(report.get("pool"))),
    ])
    parts: list[object] = [head]
    if len(report.get("clusters") or []) > 1:
        parts += ["", cluster_table(report["clusters"])]
    if held:
        parts += ["", r.table(["remediation", "node", "step", "held because"],
                              [[f"#{i}", n, p, w] for i, n, p, w in held], title="Held (a human decides)")]
    r.show(*parts)


def cluster_table(clusters: list[dict[str, Any]]) -> object:
    """Every cluster's state, one a row: what ``GET /api/v1/clusters`` lists."""
    def why(detail: dict[str, Any], on: bool) -> str:
        return f"yes: {detail.get('reason') or '-'}" if on else "no"

    return r.table(["cluster", "nodes", "unhealthy", "quarantined", "open", "paused", "breaker"],
                   [[c["name"], str(c["nodes"]), str(c["unhealthy"]), str(c["quarantined"]),
                     str(c["open_remediations"]), why(c["paused_detail"], c["paused"]),
                     why(c["breaker_detail"], c["breaker_open"])] for c in clusters], title="Clusters")


def _pool_line(pool: dict[str, int] | None) -> str | None:
    """How many nodes the storm breaker divides by, and the rows it leaves out (services/pool.py)."""
    if not pool:
        return None
    if pool["confirmed"] + pool["stale"] == 0:
        return f"{pool['counted']} nodes (no watcher resync has confirmed any yet: every node counts)"
    return (f"{pool['counted']} nodes confirmed by a watcher resync; left out: {pool['stale']} not listed "
            f"lately (policy.pool_stale_s), {pool['unconfirmed']} never listed")


def _at(detail: dict[str, Any]) -> datetime | None:
    text = detail.get("at")
    return datetime.fromisoformat(text) if isinstance(text, str) else None
