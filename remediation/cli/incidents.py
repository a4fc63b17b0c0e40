"""``remediation incidents list|show|resolve``: topology-correlated incidents for on-call.

An incident is one failure domain (a leaf switch, an NVLink domain, a zone) whose nodes failed
together: they are drained, get no VM action, and wait for the incident to close. ``resolve`` is the
human's way to close it once the part is fixed; each member then re-checks its own trigger (healthy
ones are given back, bad ones are remediated on their own). Reads go through the CLI's backend
(:mod:`remediation.incidents.service` directly, or the API with ``--server``).

Why: docs/policy.md#correlated-incidents-half-a-domain-or-4-of-its-nodes-within-2-minutes
"""

from __future__ import annotations

import typer

from remediation.cli import render as r
from remediation.cli.backend import backend
from remediation.cli.context import CLUSTER, cli_errors, state
from remediation.hostlist import compress

app = typer.Typer(help="Correlated incidents: one failure domain, many nodes, one page.", no_args_is_help=True)
OUTPUT = typer.Option("table", "-o", "--output", help="Output format: table, wide or json.")


@app.command("list")
@cli_errors
def incidents_list(
    ctx: typer.Context,
    status: str = typer.Option(None, "--status", "-s", help="open, closed, recovered or resolved."),
    limit: int = typer.Option(100, "--limit", help="At most this many, newest first."),
    *, output: str = OUTPUT, cluster: str | None = CLUSTER,
) -> None:
    """List incidents, newest first."""
    fmt = r.check_format(output)
    st = state(ctx, cluster)
    rows = backend(st).incidents(status, limit)
    if fmt == "json":
        return r.print_json(rows)
    if not rows:
        return r.empty("incidents")
    now = st.now()
    headers = ["id", "status", "domain", "likely cause", "nodes", "opened"]
    if fmt == "wide":
        headers += ["closed", "by", "why closed", "dry-run"]
    out = []
    for x in rows:
        row = [str(x["id"]), r.status(x["status"]), x["domain"], x["cause"],
               f"{x['node_count']}/{x['domain_size']}: {compress(x['nodes'])}", r.when(x["opened_at"], now)]
        if fmt == "wide":
            row += [r.when(x["closed_at"], now) if x["closed_at"] else "-", x["closed_by"] or "-",
                    x["close_reason"] or "-", "yes" if x["dry_run"] else "no"]
        out.append(row)
    r.show(r.table(headers, out))


@app.command("show")
@cli_errors
def incidents_show(ctx: typer.Context, incident_id: int = typer.Argument(..., metavar="ID"),
                   output: str = OUTPUT, *, cluster: str | None = CLUSTER) -> None:
    """One incident: its domain, likely cause, nodes, and each member's remediation."""
    fmt = r.check_format(output)
    st = state(ctx, cluster)
    d = backend(st).incident(incident_id)
    if fmt == "json":
        return r.print_json(d)
    now = st.now()
    head = r.fields([
        ("Incident", f"#{d['id']}" + (" (dry-run)" if d["dry_run"] else "")), ("Status", r.status(d["status"])),
        ("Domain", d["domain"]), ("Likely cause", d["cause"]),
        ("Nodes", f"{d['node_count']} of {d['domain_size']}: {compress(d['nodes'])}"),
        ("Opened", f"{r.stamp(d['opened_at'])} ({r.when(d['opened_at'], now)})"),
        ("Closed", f"{r.stamp(d['closed_at'])} by {d['closed_by']}: {d['close_reason']}" if d["closed_at"] else None),
    ])
    rows = [[f"#{m['id']}", m["node"], r.status(m["status"]), m["step"], m["wait_reason"] or "-"]
            for m in d["remediations"]]
    r.show(head, "", r.table(["remediation", "node", "status", "step", "waiting on"], rows, title="Members"))


@app.command("resolve")
@cli_errors
def incidents_resolve(ctx: typer.Context, incident_id: int = typer.Argument(..., metavar="ID"),
                      reason: str = typer.Option(..., "--reason", "-r", help="Why (recorded in the audit log)."), *, cluster: str | None = CLUSTER) -> None:
    """Close an open incident (the part is fixed). Each member re-checks its trigger: healthy nodes
    are given back, nodes still bad are remediated on their own."""
    typer.echo(backend(state(ctx, cluster)).resolve_incident(incident_id, reason))
