"""The rehearsal's event loop decides exactly what the polling loop decides, with fewer workflow runs.

Each case replays one trace through both loops (remediation.rehearsal.loop) and compares every
remediation (status, outcome, times, ladder) with every one of its steps (attempt, status, start and
finish, outcome, error), every event's decision, and the report. Only ids the world makes up at random
(boot ids, operation refs) are masked. The cases make remediations wait at each kind of admission refusal: a burst
larger than ``max_concurrent``, the minimum gap, a latched storm breaker (kept, or auto-closed), and
faults a restart cannot fix (verify waits, then the ladder climbs).
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.rehearsal.report import Report
from remediation.rehearsal.run import Layout, Pace, rehearse
from remediation.rehearsal.trace import Fault, Scale, load
from remediation.settings import Settings

T0 = datetime(2026, 3, 1, tzinfo=UTC)
MIX = Path(__file__).resolve().parents[3] / "remediation" / "data" / "llama3-405b-interruptions.csv"
_RANDOM_IDS = re.compile(r"\b(op-)?[0-9a-f]{10,32}\b")


def fault(i: int, node: int, minutes: float, state: str = "GpuXidError=True", fixed: bool = True) -> Fault:
    at = T0 + timedelta(minutes=minutes)
    source = Source.SLURM if state in ("FAIL", "DOWN") else Source.KUBERNETES
    ev = NodeEvent(source=source, node=f"gpu-node-{node}", kind=EventKind.UNHEALTHY, state=state,
                   reason="Not responding" if state == "DOWN" else "xid 79", observed_at=at,
                   dedupe_key=f"case:{i}")
    return Fault(at, ev, fixed)


def nodes(n: int) -> list[str]:
    return [f"gpu-node-{i}" for i in range(n)]


def burst() -> list[Fault]:
    """Ten nodes at once, then stragglers, one of them broken for good, and a repeat on the broken one."""
    out = [fault(i, i, 0) for i in range(10)]
    out += [fault(10, 10, 3, "DOWN"), fault(11, 11, 7, "Ready=False", fixed=False), fault(12, 12, 95, "FAIL")]
    out += [fault(13, 11, 100, "Ready=False", fixed=False)]
    return out


# Minutes, not the defaults' tens of minutes, so that the polling loop stays quick.
FAST = {"poll_interval_s": 120, "max_wait_s": 120, "verify_timeout_s": 360, "vm_operation_timeout_s": 600}
CASES: list[tuple[str, Any, dict[str, Any], dict[str, Any]]] = [
    ("llama-mix-24-nodes", lambda: load(MIX, Scale(nodes=48, days=54, start=T0, seed=5)), {}, FAST),
    ("burst-max-concurrent-and-gap", burst, {"max_concurrent": 2, "min_restart_gap_s": 150, "breaker_max_fraction": 0.5}, FAST),
    ("breaker-latched", burst, {"breaker_max_fraction": 0.22, "max_concurrent": 3}, FAST),
    ("breaker-auto-close", burst, {"breaker_max_fraction": 0.22, "breaker_auto_close_s": 1800}, FAST),
    ("odd-poll-grid", burst, {"max_concurrent": 3, "min_restart_gap_s": 31, "breaker_max_fraction": 0.5},
     {**FAST, "poll_interval_s": 47, "max_wait_s": 45}),
]
RUN = Pace(reboot_s=240, repair_s=1800, settle=timedelta(minutes=20))


def masked(report: Report) -> dict[str, Any]:
    out = {**report.as_dict(), "per_event": report.per_event, "history": report.history}
    out.pop("runs")
    return eval_mask(out)


def eval_mask(value: Any) -> Any:
    if isinstance(value, str):
        return _RANDOM_IDS.sub("<id>", value)
    if isinstance(value, dict):
        return {k: eval_mask(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [eval_mask(v) for v in value]
    return value


@pytest.mark.parametrize(("trace", "policy", "workflow"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_event_loop_decides_like_the_polling_loop(trace: Any, policy: dict[str, Any],
                                                  workflow: dict[str, Any]) -> None:
    faults = trace()
    settings = Settings(policy=policy, workflow=workflow)
    fleet = sorted(set(nodes(48)) | {f.event.node for f in faults})
    polled = rehearse(faults, settings, fleet, pace=replace(RUN, loop="polling"))
    evented = rehearse(faults, settings, fleet, pace=replace(RUN, loop="events"))
    assert polled.history, "the case opened no remediation: it compares nothing"
    assert sum(1 for h in polled.history for st in h[7] if st[0] == "vm_restart") > 0
    if policy.get("breaker_max_fraction", 1) < 0.5:
        assert polled.breaker_openings == 1  # the case reaches the latched breaker
    elif trace is burst:
        assert polled.quarantined and polled.outcomes.get("succeeded")  # the ladder climbed, others returned
    assert masked(evented) == masked(polled)
    assert evented.runs < polled.runs, (evented.runs, polled.runs)


def test_a_remediation_held_by_the_incident_grace_sleeps_until_it_ends_and_decides_the_same() -> None:
    """Nodes in leaf groups wait out ``incidents.vm_grace_s`` before their first machine action: the
    event loop skips the looks the grace refuses, and every decision comes out as the polling loop's."""
    faults = load(MIX, Scale(nodes=48, days=54, start=T0, seed=5, leaf_size=16))
    settings = Settings(workflow=FAST, incidents={"vm_grace_s": 600})
    fleet = sorted(set(nodes(48)) | {f.event.node for f in faults})
    polled = rehearse(faults, settings, fleet, pace=replace(RUN, loop="polling"), layout=Layout(leaf_size=16))
    evented = rehearse(faults, settings, fleet, pace=replace(RUN, loop="events"), layout=Layout(leaf_size=16))
    assert settings.incidents.vm_grace_s >= 5 * FAST["poll_interval_s"], "the grace spans no poll to skip"
    first_actions = sum(1 for h in polled.history if any(st[0] == "vm_restart" for st in h[7]))
    assert first_actions > 0
    assert masked(evented) == masked(polled)
    # The polling loop looks at each first machine action about five times in the grace, all refused;
    # the event loop looks once, when the grace ends (at least three looks saved each).
    assert evented.runs + 3 * first_actions <= polled.runs, (evented.runs, polled.runs, first_actions)
