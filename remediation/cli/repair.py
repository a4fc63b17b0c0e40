"""``remediation repair list|show|done|abandon``: hardware handed to the repair system, for on-call.

A node quarantined for an RMA is ``with-repair`` while its request is open. ``done NODE --ticket T``
says the repair is finished: a re-check runs the GPU check (and the domain check where the node is in
an NVLink domain), then returns the node or quarantines it again with a new request. ``abandon``
leaves it quarantined. Reads and levers go through the CLI's backend (the database, or ``--server``).

Why: docs/policy.md#repair-requests-handing-hardware-to-the-repair-system
"""

from __future__ import annotations

import json

import typer

from remediation.cli import render as r
from remediation.cli.backend import backend
from remediation.cli.context import CLUSTER, cli_errors, state
from remediation.repair_requests.rules import CallbackStatus, RepairStatus

app = typer.Typer(help="Repair requests: quarantined hardware handed to the repair system.", no_args_is_help=True)
OUTPUT = typer.Option("table", "-o", "--output", help="Output format: table, wide or json.")
TICKET = typer.Option(..., "--ticket", "-t", help="The repair system's ticket (recorded on the request).")
NOTE = typer.Option(None, "--note", "-n", help="What was done (one line, for the record).")


@app.command("list")
@cli_errors
def repair_list(
    ctx: typer.Context,
    status: RepairStatus = typer.Option(None, "--status", "-s", help="open, rechecking, returned, failed-check, "
                                        "abandoned or released."),
    node: str = typer.Option(None, "--node", help="Only this node's requests."),
    *, limit: int = typer.Option(100, "--limit", help="At most this many, newest first."),
    output: str = OUTPUT, cluster: str | None = CLUSTER,
) -> None:
    """List repair requests, newest first."""
    fmt = r.check_format(output)
    st = state(ctx, cluster)
    rows = backend(st).repair_requests(status, node, limit)
    if fmt == "json":
        return r.print_json(rows)
    if not rows:
        return r.empty("repair requests")
    now = st.now()
    headers = ["id", "node", "status", "delivery", "ticket", "opened"]
    if fmt == "wide":
        headers += ["follows", "re-check", "last error", "new hardware"]
    out = []
    for x in rows:
        tries = f" ({x['attempts']} failed)" if x["attempts"] and x["delivery"] == "pending" else ""
        row = [str(x["id"]), x["node"], r.status(x["status"]), x["delivery"] + tries, x["ticket"] or "-",
               r.when(x["opened_at"], now)]
        if fmt == "wide":
            row += [str(x["follows_id"] or "-"), str(x["recheck_id"] or "-"), x["last_error"] or "-",
                    x["new_hardware"] or "-"]
        out.append(row)
    r.show(r.table(headers, out))


@app.command("show")
@cli_errors
def repair_show(ctx: typer.Context, request_id: int = typer.Argument(..., metavar="ID"),
                output: str = OUTPUT, *, cluster: str | None = CLUSTER) -> None:
    """One repair request: where it stands and the JSON the repair system received."""
    fmt = r.check_format(output)
    st = state(ctx, cluster)
    d = backend(st).repair_request(request_id)
    if fmt == "json":
        return r.print_json(d)
    now = st.now()
    head = r.fields([
        ("Repair request", f"#{d['id']}" + (" (dry-run)" if d["dry_run"] else "")), ("Node", d["node"]),
        ("Status", r.status(d["status"])), ("Ticket", d["ticket"]),
        ("Quarantined by", f"remediation #{d['remediation_id']}"),
        ("Follows", f"request #{d['follows_id']}" if d["follows_id"] else None),
        ("Delivery", f"{d['delivery']}, {d['attempts']} failed attempt(s)"),
        ("Last error", d["last_error"]), ("Opened", f"{r.stamp(d['opened_at'])} ({r.when(d['opened_at'], now)})"),
        ("Done", r.stamp(d["done_at"]) if d["done_at"] else None),
        ("Re-check", f"remediation #{d['recheck_id']}" if d["recheck_id"] else None),
        ("New hardware", d["new_hardware"]), ("Closed", f"{r.stamp(d['closed_at'])} by {d['closed_by']}"
                                               if d["closed_at"] else None), ("Note", d["note"]),
    ])
    r.show(head, "", json.dumps(d["payload"], indent=2, sort_keys=True))


@app.command("done")
@cli_errors
def repair_done(ctx: typer.Context, node: str = typer.Argument(..., help="The node the repair was for."),
                *, ticket: str = TICKET, note: str | None = NOTE, cluster: str | None = CLUSTER) -> None:
    """The repair is done: re-check NODE (the GPU check, then return it, or quarantine it again)."""
    typer.echo(backend(state(ctx, cluster)).answer_repair(node, CallbackStatus.DONE, ticket=ticket, note=note))


@app.command("abandon")
@cli_errors
def repair_abandon(ctx: typer.Context, node: str = typer.Argument(..., help="The node the repair was for."),
                   *, ticket: str = TICKET, note: str | None = NOTE, cluster: str | None = CLUSTER) -> None:
    """No repair will come: close NODE's request; the node stays quarantined for a human."""
    typer.echo(backend(state(ctx, cluster)).answer_repair(node, CallbackStatus.ABANDONED, ticket=ticket,
                                                                   note=note))
