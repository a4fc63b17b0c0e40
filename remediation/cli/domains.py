"""``remediation domains list|show|cancel``: repairs of whole NVLink domains for on-call.

A domain fault (an SXID, the fabric manager, IMEX, NVLink faults on many trays) opens one repair of
the domain, never one remediation per tray: drain every tray, restart the fabric software on each,
check the domain with one job, power-cycle the rack, and quarantine it as one. Reads go through the
CLI's backend (the database, or the API with ``--server``).

Why: docs/policy.md#the-domain-ladder-one-repair-per-nvlink-domain
"""

from __future__ import annotations

import typer

from remediation.cli import render as r
from remediation.cli.backend import backend
from remediation.cli.context import CLUSTER, cli_errors, state
from remediation.hostlist import compress

app = typer.Typer(help="Domain repairs: one ladder for a whole NVLink domain.", no_args_is_help=True)
OUTPUT = typer.Option("table", "-o", "--output", help="Output format: table, wide or json.")


@app.command("list")
@cli_errors
def domains_list(
    ctx: typer.Context,
    status: str = typer.Option(None, "--status", "-s", help="running, returned, quarantined or cancelled."),
    limit: int = typer.Option(100, "--limit", help="At most this many, newest first."),
    *, output: str = OUTPUT, cluster: str | None = CLUSTER,
) -> None:
    """List domain repairs, newest first."""
    fmt = r.check_format(output)
    st = state(ctx, cluster)
    rows = backend(st).repairs(status, limit)
    if fmt == "json":
        return r.print_json(rows)
    if not rows:
        return r.empty("domain repairs")
    now = st.now()
    headers = ["id", "status", "domain", "class", "step", "trays", "opened"]
    if fmt == "wide":
        headers += ["reported by", "waiting on", "closed", "dry-run"]
    out = []
    for x in rows:
        row = [str(x["id"]), r.status(x["status"]), x["domain"], x["fault_class"], x["step"],
               f"{x['size']}: {compress(x['trays'])}", r.when(x["opened_at"], now)]
        if fmt == "wide":
            row += [compress(x["reporters"]), x["wait_reason"] or "-",
                    r.when(x["closed_at"], now) if x["closed_at"] else "-", "yes" if x["dry_run"] else "no"]
        out.append(row)
    r.show(r.table(headers, out))


@app.command("show")
@cli_errors
def domains_show(ctx: typer.Context, repair_id: int = typer.Argument(..., metavar="ID"),
                 output: str = OUTPUT, *, cluster: str | None = CLUSTER) -> None:
    """One domain repair: its domain, trays, cause, ladder and every step."""
    fmt = r.check_format(output)
    st = state(ctx, cluster)
    d = backend(st).repair(repair_id)
    if fmt == "json":
        return r.print_json(d)
    now = st.now()
    head = r.fields([
        ("Domain repair", f"#{d['id']}" + (" (dry-run)" if d["dry_run"] else "")), ("Status", r.status(d["status"])),
        ("Domain", d["domain"]), ("Trays", f"{d['size']}: {compress(d['trays'])}"),
        ("Reported by", compress(d["reporters"])), ("Cause", f"{d['fault_class']}: {d['cause']}"),
        ("Evidence", d["fault_evidence"]), ("Ladder", " > ".join(d["rungs"]) or None),
        ("Step", d["step"]), ("Waiting on", d["wait_reason"]),
        ("Opened", f"{r.stamp(d['opened_at'])} ({r.when(d['opened_at'], now)})"),
        ("Closed", f"{r.stamp(d['closed_at'])}: {d['close_reason']}" if d["closed_at"] else None),
    ])
    rows = [[x["step"], str(x["attempt"]), r.status(x["status"]), r.stamp(x["started_at"]), x["outcome"] or "-"]
            for x in d["steps"]]
    r.show(head, "", r.table(["step", "attempt", "status", "started", "outcome"], rows, title="Steps"))


@app.command("cancel")
@cli_errors
def domains_cancel(ctx: typer.Context, repair_id: int = typer.Argument(..., metavar="ID"),
                   reason: str = typer.Option(..., "--reason", "-r", help="Why (recorded in the audit log)."),
                   *, cluster: str | None = CLUSTER) -> None:
    """Stop a running domain repair where it stands. Its trays are left as they are (drained by us, if
    it got that far) for a human; a job it started is taken down by the next sweep."""
    typer.echo(backend(state(ctx, cluster)).cancel_repair(repair_id, reason))
