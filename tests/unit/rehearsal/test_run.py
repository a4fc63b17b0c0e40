"""The rehearsal carries out the gpu-reset rung: a job on the node that takes the outcome model's reset
time, fixes the fault where the model says a reset does, and otherwise lets the ladder climb."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.rehearsal.compare import by_class, with_reset, without_reset
from remediation.rehearsal.run import Pace, rehearse
from remediation.rehearsal.trace import Fault
from remediation.rehearsal.truth import Outcome
from remediation.settings import Settings
from remediation.vocabulary import GPU_RESET
from tests.unit.rehearsal.test_loop import masked

_WAITING = re.compile(r"(GPU reset of .*? of \S+) (running|started \(.*?\))")
T0 = datetime(2026, 3, 1, tzinfo=UTC)
NODES = [f"gpu-node-{i}" for i in range(16)]
#: The tests' environment turns classification off (tests/conftest.py); the rung needs the fault's class.
CLASSIFY = {"faults": {"classify": True}}
RUN = Pace(reboot_s=1800, repair_s=4 * 3600, reset_s=120, check_s=60, settle=timedelta(hours=1))


def xid48(i: int, *fixed_by: str) -> Fault:
    """A double-bit ECC error (gpu-memory: gpu-reset, then move-host) on node i, fixed by ``fixed_by``."""
    at = T0 + timedelta(hours=i)
    ev = NodeEvent(source=Source.KUBERNETES, node=f"gpu-node-{i}", kind=EventKind.UNHEALTHY,
                   state="GpuXidError=True", reason="Xid 48: An uncorrectable double bit error", observed_at=at,
                   dedupe_key=f"case:{i}")
    return Fault(at, ev, "restart" in fixed_by, "GPU HBM3 Memory", Outcome("GPU HBM3 Memory", frozenset(fixed_by)))


def test_a_reset_that_fixes_returns_the_node_without_a_reboot_and_one_that_cannot_climbs() -> None:
    faults = [xid48(0, "reset", "restart", "move"), xid48(1, "move")]
    report = rehearse(faults, Settings(policy=CLASSIFY, validation={"backend": "kubernetes"}), NODES,
                      pace=RUN)
    fixed, climbed = report.history
    assert fixed[2] == "succeeded" and climbed[2] == "succeeded"
    assert report.gpu_resets == 2 and report.gpu_resets_fixed == 1
    assert report.vm_actions == {"gpu-reset": 2, "stop_start": 1}  # only the one the reset left broken moved
    # Out of service: a reset and the check (2 + 1 minutes), then a reset, a move that takes a bare
    # machine's reboot and the check (2 + 30 + 1): 36 minutes, all of them gpu-memory's; and before each
    # first reset, the evidence job's 10 s (Pace.evidence_s).
    assert report.node_hours_by_class == {"gpu-memory": pytest.approx(0.6 + 2 * 10 / 3600)}
    assert report.node_hours_out == pytest.approx(0.6 + 2 * 10 / 3600)


def test_without_jobs_on_the_node_there_is_no_reset_and_every_fault_is_moved() -> None:
    faults = [xid48(0, "reset", "restart", "move"), xid48(1, "move")]
    report = rehearse(faults, Settings(policy=CLASSIFY), NODES, pace=RUN)
    assert report.gpu_resets == 0 and report.vm_actions == {"stop_start": 2}
    assert report.node_hours_by_class == {"gpu-memory": pytest.approx(1.0)}  # two 30-minute moves


def test_the_event_loop_wakes_a_reset_and_a_check_when_their_job_ends_as_the_polling_loop_does() -> None:
    faults = [xid48(i, *(("reset", "restart", "move") if i % 2 else ("move",))) for i in range(6)]
    settings = Settings(policy=CLASSIFY, validation={"backend": "kubernetes", "poll_interval_s": 30})
    polled = rehearse(faults, settings, NODES, pace=replace(RUN, loop="polling"))
    evented = rehearse(faults, settings, NODES, pace=replace(RUN, loop="events"))
    assert polled.gpu_resets == 6 and polled.gpu_resets_fixed == 3
    # A failed reset's row keeps its last waiting message: "started" where the event loop skipped the
    # polls that would have said "running". Every decision, time and verdict is the same.
    assert _waits(masked(evented)) == _waits(masked(polled))
    assert evented.runs < polled.runs, (evented.runs, polled.runs)


def _waits(report: dict) -> str:  # type: ignore[type-arg]
    return _WAITING.sub(r"\1 <waiting>", repr(report))


def test_with_and_without_the_reset_differ_only_in_the_rung_and_report_node_hours_per_class() -> None:
    base = Settings(policy=CLASSIFY)
    on, off = with_reset(base), without_reset(base)
    assert on.validation.runs_jobs and off.validation.runs_jobs  # both run the GPU check after every action
    assert off.policy.faults.ladders["gpu-memory"] == ["move-host", "quarantine"]
    assert GPU_RESET not in str(off.policy.faults.ladders) and not on.policy.faults.ladders
    faults = [xid48(0, "reset", "restart", "move"), xid48(1, "move")]
    a, b = (rehearse(faults, s, NODES, pace=RUN).as_dict() for s in (on, off))
    # Out without the reset: two moves of a bare machine's 30 minutes, each with the 1-minute check.
    assert by_class(a, b) == [("gpu-memory", 0.6, pytest.approx(31 / 30, abs=0.05))]
