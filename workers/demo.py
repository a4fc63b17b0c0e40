"""`remediation demo`: the whole loop on a simulated 32-node cluster, in one process, in about a minute.

The scenario follows the mix of faults in the Llama 3 405B interruption trace (see docs/policy.md),
time-compressed:

- a researcher marks a node FAIL after an Xid error (the most common fault: a faulty GPU);
- a node stops answering (a NIC fault): slurmctld marks it DOWN "Not responding";
- an admin drains a node for maintenance: recorded, never touched;
- one "lemon" node fails three times: restarted twice, then quarantined;
- a switch failure takes 6 nodes (19% of the pool) down at once: the storm breaker opens, the nodes are
  drained but no VM is restarted until the breaker window has passed.

Everything runs through the production code paths: the Slurm watcher polls the simulated slurmctld,
events go through the bus to the ingest task, a real Celery worker (memory broker) runs the workflow
against the simulated Slurm, Kubernetes and VM adapters, and SQLite records it all.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

DEMO_ENV = {
    "REMEDIATION_SIM__NODES": "gpu-node-[0-31]",
    "REMEDIATION_SIM__OP_POLLS": "2",
    "REMEDIATION_WORKFLOW__POLL_INTERVAL_S": "0.5",
    "REMEDIATION_WORKFLOW__SWEEP_INTERVAL_S": "2",
    "REMEDIATION_WORKFLOW__LEASE_S": "15",
    "REMEDIATION_POLICY__MIN_RESTART_GAP_S": "0.5",
    "REMEDIATION_POLICY__BREAKER_WINDOW_S": "15",
    "REMEDIATION_SLURM__POLL_INTERVAL_S": "0.25",
    "REMEDIATION_SLURM__NOT_RESPONDING_GRACE_S": "0",
}

LEMON = "gpu-node-9"
STORM = [f"gpu-node-{i}" for i in range(20, 26)]


@dataclass
class Injection:
    node: str
    what: str
    at: float  # wall clock


def run_demo(workdir: Path, timeout_s: float = 120.0, console: Console | None = None) -> dict[str, object]:
    from workers.embedded import configure_environment

    console = console or Console()
    configure_environment(workdir, DEMO_ENV)
    _quiet()
    from remediation.settings import load_settings

    settings = load_settings()
    from remediation.adapters.memory import MemorySlurm
    from watchers.runtime import Stopper, make_bus
    from watchers.slurm import run as run_slurm_watcher
    from workers.adapters.factory import make_world
    from workers.embedded import start

    world = make_world(settings)
    emb = start()
    stopper = Stopper(install=False)
    watcher = threading.Thread(
        target=run_slurm_watcher, args=(settings, stopper, make_bus(settings), MemorySlurm(world)),
        name="slurm-watcher", daemon=True,
    )
    watcher.start()
    console.print(f"[bold]node-remediation demo[/]: 32 simulated nodes, database {settings.database.url}")
    injections: list[Injection] = []

    def inject(node: str, what: str, **kw: object) -> None:
        world.set_slurm(node, **kw)  # type: ignore[arg-type]
        injections.append(Injection(node, what, time.time()))
        console.print(f"  [yellow]fault[/] {node}: {what}")

    try:
        time.sleep(1.0)  # the watcher's first poll publishes the inventory
        inject("gpu-node-7", "researcher: scontrol update state=fail reason='xid 79'", flags=["FAIL"],
               reason="xid 79", user="alice")
        inject("gpu-node-3", "slurmd not responding (NIC)", state="DOWN", flags=["NOT_RESPONDING"],
               reason="Not responding", user="slurm")
        inject("gpu-node-12", "admin: drain reason='maintenance: PSU swap'", flags=["DRAIN"],
               reason="maintenance: PSU swap", user="root")
        for attempt in range(3):
            _wait_idle(world, LEMON, timeout_s)
            inject(LEMON, f"xid 48 (double-bit ECC), failure {attempt + 1}", flags=["FAIL"],
                   reason=f"xid 48 #{attempt + 1}", user="bob")
            time.sleep(1.5)
        for node in STORM:
            inject(node, "switch failure: not responding", state="DOWN", flags=["NOT_RESPONDING"],
                   reason="Not responding", user="slurm")
        summary = _wait_settled(settings, timeout_s)
    finally:
        stopper.stop()
        emb.stop()
    _print_summary(console, summary, injections, world)
    return summary


def _quiet() -> None:
    """The demo prints its own story; keep Celery's start-up chatter (running as root, the memory
    transport's hostname notice) out of it."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", module="celery.platforms")
    for name in ("celery", "kombu", "amqp"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _wait_idle(world: object, node: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = world.node(node)["slurm"]  # type: ignore[attr-defined]
        if not s["flags"] and s["state"] == "IDLE":
            return
        time.sleep(0.2)


def _wait_settled(settings: object, timeout_s: float) -> dict[str, object]:
    from sqlalchemy import select

    from remediation.db.models import AuditLog, Event, Remediation
    from remediation.db.session import make_engine, make_session_factory
    from remediation.states import OPEN_STATUSES

    sessions = make_session_factory(make_engine(settings.database))  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    while True:
        with sessions() as s:
            rems = s.scalars(select(Remediation)).all()
            open_count = sum(1 for r in rems if r.status in OPEN_STATUSES)
            storm_done = sum(1 for r in rems if r.node in STORM and r.status not in OPEN_STATUSES)
            if (rems and open_count == 0 and storm_done == len(STORM)) or time.monotonic() > deadline:
                events = s.scalars(select(Event).order_by(Event.id)).all()
                audit = s.scalars(select(AuditLog.action)).all()
                return {
                    "remediations": [(r.id, r.node, r.status, r.cause, r.opened_at, r.closed_at) for r in rems],
                    "events": [(e.node, e.kind, e.state, e.decision, e.decision_reason, e.received_at) for e in events],
                    "breaker_opened": audit.count("breaker_open"),
                    "breaker_closed": audit.count("breaker_closed"),
                    "timed_out": time.monotonic() > deadline,
                }
        time.sleep(0.5)


def _ts(value: datetime) -> float:
    return value.timestamp() if value.tzinfo else value.replace(tzinfo=__import__("datetime").UTC).timestamp()


def _print_summary(console: Console, summary: dict[str, object], injections: list[Injection], world: object) -> None:
    rems = summary["remediations"]
    events = summary["events"]
    table = Table(title="Remediations")
    for col in ("#", "node", "outcome", "cause", "time to recover"):
        table.add_column(col)
    recoveries = []
    for rid, node, status, cause, opened, closed in rems:  # type: ignore[attr-defined]
        took = f"{_ts(closed) - _ts(opened):.1f}s" if closed else "-"
        if closed and status == "succeeded":
            recoveries.append(_ts(closed) - _ts(opened))
        color = {"succeeded": "green", "quarantined": "red"}.get(status, "yellow")
        table.add_row(str(rid), node, f"[{color}]{status}[/]", cause[:60], took)
    console.print(table)
    detections = []
    for inj in injections:
        seen = [_ts(r) for n, kind, _s, _d, _why, r in events if n == inj.node and kind == "unhealthy" and _ts(r) >= inj.at]  # type: ignore[attr-defined]
        if seen:
            detections.append(min(seen) - inj.at)
    ignored = [(n, why) for n, kind, _s, d, why, _r in events if n == "gpu-node-12" and kind == "unhealthy"]  # type: ignore[attr-defined]
    restarts = len(world.calls("vm.restart", effect=True))  # type: ignore[attr-defined]
    console.print(
        f"succeeded: {sum(1 for r in rems if r[2] == 'succeeded')}, "  # type: ignore[attr-defined]
        f"quarantined: {sorted({r[1] for r in rems if r[2] == 'quarantined'})}, "  # type: ignore[attr-defined]
        f"VM restarts: {restarts}, breaker opened {summary['breaker_opened']}x / closed {summary['breaker_closed']}x"
    )
    if ignored:
        console.print(f"maintenance drain on gpu-node-12: {ignored[0][1]}")
    if detections:
        console.print(f"detection (fault -> event recorded): p50 {statistics.median(detections):.2f}s, "
                      f"max {max(detections):.2f}s over {len(detections)} faults")
    if recoveries:
        console.print(f"recovery (opened -> back in service): p50 {statistics.median(recoveries):.1f}s, "
                      f"max {max(recoveries):.1f}s (simulated reboots)")
    if summary["timed_out"]:
        console.print("[red]the demo timed out before every remediation settled[/]")
