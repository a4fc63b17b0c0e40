"""`remediation simulate --trace FILE`: rehearse the policy on a failure trace before turning it on.

Loads the settings (``--config`` as everywhere), replays the trace through remediation.services.simulate and
prints what the service would have done. ``--dump-events`` writes the synthesised events as JSONL, which
is also the format to replay a site's own history.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import typer

from remediation.cli.context import CliError, cli_errors, state
from remediation.cli.render import check_format, print_json, show, table
from remediation.domain.trace import TraceError, dump_events, load
from remediation.services.simulate import simulate as run_simulation


@cli_errors
def simulate(
    ctx: typer.Context,
    trace: Path = typer.Option(..., "--trace", help="Failure trace: events (.jsonl) or a failure mix (.csv)."),
    nodes: int = typer.Option(64, help="Cluster size to scale a failure mix to."),
    days: float = typer.Option(54.0, help="Period a failure mix is spread over, in days."),
    seed: int = typer.Option(1, help="Random seed for a failure mix (same seed, same trace)."),
    reboot_minutes: float = typer.Option(10.0, help="How long a simulated VM action takes."),
    repair_hours: float = typer.Option(4.0, help="When a fault a restart cannot fix is repaired by hand."),
    dump_events_to: Path = typer.Option(None, "--dump-events", help="Also write the trace's events as JSONL."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Replay a failure trace through the real decision and workflow code on a simulated clock, and
    report what the service would have done with the current settings."""
    fmt = check_format(output)
    settings = state(ctx).settings()
    try:
        faults = load(trace, nodes=nodes, days=days, start=datetime(2026, 1, 1, tzinfo=UTC), seed=seed)
    except TraceError as exc:
        raise CliError(str(exc)) from None
    if dump_events_to is not None:
        dump_events(faults, dump_events_to)
    names = sorted({f.event.node for f in faults} | {f"gpu-node-{i}" for i in range(nodes)})
    t0 = time.monotonic()
    report = run_simulation(faults, settings, names, reboot_s=reboot_minutes * 60, repair_s=repair_hours * 3600)
    took = time.monotonic() - t0
    if fmt == "json":
        print_json({**report.as_dict(), "simulated_in_s": round(took, 2)})
        return
    p = settings.policy
    rows = [
        ("faults replayed", report.faults),
        ("events decided", ", ".join(f"{k}: {v}" for k, v in sorted(report.decisions.items())) or "-"),
        ("remediations", ", ".join(f"{k}: {v}" for k, v in sorted(report.outcomes.items())) or "-"),
        ("VM actions", ", ".join(f"{k}: {v}" for k, v in sorted(report.vm_actions.items())) or "none"),
        ("most VM actions at once", f"{report.max_vm_in_flight} (max_concurrent {p.max_concurrent})"),
        ("storm breaker", f"opened {report.breaker_openings}x, open {report.breaker_open_s / 3600:.1f} h in all"),
        ("median time to recover", f"{report.recovery_p50_s / 60:.1f} min" if report.recovery_p50_s else "-"),
        ("quarantined", ", ".join(n for n, _ in report.quarantined) or "none"),
    ]
    show(table(["", "with these settings"], rows, title=f"simulated {trace.name} ({took:.1f}s)"))
    if report.ignored:
        show(table(["recorded, not acted on", "events"], sorted(report.ignored.items())))
