"""Rewording every message the service writes for people changes nothing it decides.

Each scenario runs twice: as shipped, and with every human-readable reason reworded (step outcomes and
their notes, ingest decisions, admission verdicts, incident holds: a prefix, and every letter's case
swapped, so that no ``startswith``, ``==`` or ``in`` on the old words can still match). Everything the
service decides must come out the same: each remediation's status, ladder, times and steps (with the
keys each step recorded), each event's decision, each node's status, the rehearsal's run count (what
it skipped depends on why a step waited), and the one RMA note on a quarantine of hardware to return.
The scenarios run on the rehearsal's in-memory database, so the test needs no server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields, is_dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld, OpTiming
from remediation.clock import FakeClock
from remediation.db.models import Node, Remediation
from remediation.db.session import make_session_factory, memory_engine
from remediation.domain import outcomes, policy
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.incidents import service as incidents
from remediation.ports.errors import TransientError
from remediation.rehearsal.report import Report
from remediation.rehearsal.run import Layout, Pace, _migrated_template, rehearse
from remediation.rehearsal.trace import Fault
from remediation.services.ingest import ingest
from remediation.services.workflow import RetryLater, Workflow
from remediation.settings import Settings

T0 = datetime(2026, 3, 1, tzinfo=UTC)
NODES = [f"gpu-node-{i}" for i in range(24)]


def reword(text: str) -> str:
    return f"(reworded) {text.swapcase()}" if text else text


def reworded(value: Any) -> Any:
    """A reason, however it is returned: text, or a value carrying it in ``reason``."""
    if isinstance(value, str):
        return reword(value)
    if is_dataclass(value) and not isinstance(value, type) and any(f.name == "reason" for f in fields(value)):
        return replace(value, reason=reword(value.reason))
    return value


# Every value the service builds around a message for people, and the field holding the message.
MESSAGES: list[tuple[type, str]] = [
    (outcomes.Note, "reason"), (outcomes.Done, "outcome"), (outcomes.Wait, "reason"),
    (outcomes.Escalate, "reason"), (outcomes.Hold, "reason"), (outcomes.Quarantine, "reason"),
    (outcomes.Cancel, "reason"), (policy.Decision, "reason"), (policy.Admission, "reason"),
]


@contextmanager
def rewording() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for cls, name in MESSAGES:
            patch.setattr(cls, "__init__", _rewording_init(cls.__init__, name))
        hold_reason = incidents.hold_reason
        patch.setattr(incidents, "hold_reason", lambda *a, **k: reworded(hold_reason(*a, **k)))
        yield


def _rewording_init(init: Callable[..., None], name: str) -> Callable[..., None]:
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        object.__setattr__(self, name, reword(getattr(self, name)))

    return wrapped


# ------------------------------------------------------------------------------- what is compared


def decisions(report: Report) -> dict[str, Any]:
    """A rehearsal's report without its words."""
    return {
        "events": [(key, decision) for key, decision, _ in report.per_event],
        "remediations": [(node, status, opened, closed, ladder, [st[:5] for st in steps])
                         for node, _, status, _, opened, closed, ladder, steps in report.history],
        "runs": report.runs, "outcomes": report.outcomes, "vm_actions": report.vm_actions,
        "pages": report.pages, "incidents": report.incidents, "breaker_openings": report.breaker_openings,
        "rma_notes": [(node, why.lower().count("rma")) for node, why in report.quarantined],
    }


def fault(i: int, node: int, minutes: float, state: str = "GpuXidError=True", reason: str = "xid 79",
          fixed: bool = True) -> Fault:
    source = Source.SLURM if state in ("FAIL", "DOWN") else Source.KUBERNETES
    ev = NodeEvent(source=source, node=f"gpu-node-{node}", kind=EventKind.UNHEALTHY, state=state, reason=reason,
                   observed_at=T0 + timedelta(minutes=minutes), dedupe_key=f"case:{i}")
    return Fault(ev.observed_at, ev, fixed)


def burst() -> list[Fault]:
    """Ten nodes at once, stragglers, one broken for good (the ladder climbs to quarantine), a repeat."""
    out = [fault(i, i, 0) for i in range(10)]
    out += [fault(10, 10, 3, "DOWN"), fault(11, 11, 7, "Ready=False", fixed=False), fault(12, 12, 95, "FAIL")]
    return [*out, fault(13, 11, 100, "Ready=False", fixed=False)]


def hardware() -> list[Fault]:
    """Classified faults: a GPU that fell off the bus (hardware to return) on nodes a restart cannot fix."""
    return [fault(i, i, 5 * i, "FAIL", reason="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
                  fixed=False) for i in range(4)]


FAST = {"poll_interval_s": 120, "max_wait_s": 120, "verify_timeout_s": 360, "vm_operation_timeout_s": 600}
CASES: list[tuple[str, Callable[[], list[Fault]], dict[str, Any], dict[str, Any]]] = [
    ("max-concurrent-gap-ladder", burst, {"policy": {"max_concurrent": 2, "min_restart_gap_s": 150,
                                                     "breaker_max_fraction": 0.5}}, {}),
    ("breaker-latched", burst, {"policy": {"breaker_max_fraction": 0.22, "max_concurrent": 3}}, {}),
    ("incident-holds", burst, {"policy": {"breaker_max_fraction": 0.9}}, {"leaf_size": 4}),
    ("rma-quarantine", hardware, {"policy": {"faults": {"classify": True, "ladders": {"gpu-hardware": ["quarantine"]}},
                                             "repeat_offender_count": 99}}, {}),
]


@pytest.mark.parametrize(("trace", "config", "extra"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("loop", ["events", "polling"])
def test_rehearsal_decides_the_same_whatever_the_words(
    trace: Callable[[], list[Fault]], config: dict[str, Any], extra: dict[str, Any], loop: Any,
) -> None:
    settings = Settings(**config, workflow=FAST)
    faults = trace()

    def run() -> Report:
        return rehearse(faults, settings, NODES, pace=Pace(reboot_s=240, repair_s=1800,
                                                           settle=timedelta(minutes=20), loop=loop),
                        layout=Layout(**extra))

    shipped = run()
    assert shipped.history, "the case opened no remediation: it compares nothing"
    with rewording():
        assert decisions(run()) == decisions(shipped)


# ------------------------------------------------------------------------ the engine's own records


class FailingPolls(MemoryVM):
    """A VM API that takes the restart and then answers every poll with a 503."""

    def poll(self, op: dict[str, Any]) -> Any:
        raise TransientError("503 Service Unavailable")


def engine_run(vm: type[MemoryVM], event_reason: str) -> dict[str, Any]:
    """One event through ingest and every step it leads to, retrying transient errors after their
    countdown as the Celery task does; returns what was decided and recorded, without the words."""
    sessions = make_session_factory(memory_engine(_migrated_template()))
    clock = FakeClock(T0)
    world = MemoryWorld(nodes=NODES, timing=OpTiming(clock=clock.now))
    settings = Settings(policy={"min_restart_gap_s": 0}, workflow={"poll_interval_s": 5, "lease_s": 30})
    engine = Workflow(sessions, outcomes.Adapters(MemorySlurm(world), MemoryKube(world), vm(world)),
                      settings, clock=clock)
    event = NodeEvent(source=Source.SLURM, node="gpu-node-3", kind=EventKind.UNHEALTHY, state="FAIL",
                      reason=event_reason, observed_at=clock.now())
    with sessions() as s, s.begin():
        todo = [(rid, step, 0.0) for rid, step in ingest(s, [event.to_json()], settings.policy,
                                                         clock=clock).opened]
    for _ in range(500):
        if not todo:
            break
        rid, step, countdown = todo.pop(0)
        clock.advance(countdown)
        try:
            nxt = engine.run(rid, step)
        except RetryLater as retry:
            todo.append((rid, step, retry.countdown))
            continue
        if nxt is not None:
            todo.append((nxt.remediation_id, nxt.step, nxt.countdown))
    with sessions() as s:
        rems = s.scalars(select(Remediation)).all()
        return {
            "nodes": sorted(tuple(row) for row in
                            s.execute(select(Node.name, Node.status).where(Node.status != "healthy"))),
            "remediations": [(r.status, r.ladder, r.action, sorted(r.context),
                              [(st.step, st.attempt, st.status, st.error_kind, sorted(st.detail or {}))
                               for st in r.steps]) for r in rems],
        }


@pytest.mark.parametrize(("vm", "reason"), [
    (MemoryVM, "xid 79"),
    (FailingPolls, "xid 79"),  # the engine gives up on transient errors, rung after rung
    (MemoryVM, "remediation: drained by an earlier run"),  # the echo of our own drain
], ids=["succeeds", "gives-up-on-transient-errors", "our-own-drain-echo"])
def test_engine_decides_and_records_the_same_whatever_the_words(vm: type[MemoryVM], reason: str) -> None:
    shipped = engine_run(vm, reason)
    with rewording():
        assert engine_run(vm, reason) == shipped
