"""`remediation simulate --trace FILE`: rehearse the policy on a failure trace before turning it on.

Loads the settings (``--config`` as everywhere), replays the trace through remediation.services.simulate and
prints what the service would have done. ``--dump-events`` writes the synthesised events as JSONL, which
is also the format to replay a site's own history. On a terminal a progress bar on stderr shows the
simulated days done and the faults handled; ``-o json`` carries the wall time it took (``wall_s``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import typer

from remediation.cli.context import CliError, cli_errors, state
from remediation.cli.render import check_format, print_json, show, table
from remediation.domain.trace import Fault, TraceError, dump_events, load
from remediation.services.sim_loop import Tally
from remediation.services.simulate import simulate as run_simulation


def progress_bar(faults: list[Fault], out: TextIO, every_s: float = 0.2,
                 tick: Callable[[], float] = time.monotonic) -> tuple[Callable[[datetime, Tally], None],
                                                                      Callable[[], None]]:
    """A one-line bar (simulated days done, faults handled), redrawn at most every ``every_s`` of wall
    time, and the function that clears it. The caller only installs it when ``out`` is a terminal."""
    first, last = (faults[0].at, faults[-1].at) if faults else (None, None)
    span_days = max((last - first).total_seconds() / 86400, 1e-9) if first and last else 1e-9
    shown = [float("-inf")]

    def draw(now: datetime, tally: Tally) -> None:
        t = tick()
        if t - shown[0] < every_s or first is None:
            return
        shown[0] = t
        done = min(max((now - first).total_seconds() / 86400, 0.0), span_days)
        filled = int(30 * done / span_days)
        out.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] day {done:.1f}/{span_days:.1f}  "
                  f"faults {tally.faults_handled}/{len(faults)}")
        out.flush()

    def clear() -> None:
        if shown[0] != float("-inf"):
            out.write("\r" + " " * 72 + "\r")
            out.flush()

    return draw, clear


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
    draw, clear = progress_bar(faults, sys.stderr) if sys.stderr.isatty() else (None, lambda: None)
    t0 = time.monotonic()
    try:
        report = run_simulation(faults, settings, names, reboot_s=reboot_minutes * 60,
                                repair_s=repair_hours * 3600, progress=draw)
    finally:
        clear()
    took = time.monotonic() - t0
    if fmt == "json":
        print_json({**report.as_dict(), "wall_s": round(took, 2)})
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
