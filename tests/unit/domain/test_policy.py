"""Table-driven tests of the pure policy: which events open remediations, repeat offenders, gating."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from remediation.clock import FakeClock
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.policy import (
    ClusterView,
    DecisionKind,
    NodeView,
    admit,
    breaker_open,
    count_in_window,
    decide,
)
from remediation.domain.statemachine import NodeStatus, Step
from remediation.settings import PolicySettings
from tests.scenario_table import NODE_NAME, BadInputs

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
POLICY = PolicySettings(repeat_offender_count=3, repeat_offender_window_s=7 * 86400)


def ev(
    state: str, reason: str = "", source: Source = Source.SLURM, kind: EventKind = EventKind.UNHEALTHY
) -> NodeEvent:
    return NodeEvent(source=source, node="gpu-node-7", kind=kind, state=state, reason=reason, observed_at=T0)


DECIDE_CASES = [
    ("slurm-fail-opens", ev("FAIL", "xid 79"), NodeView(), DecisionKind.OPEN),
    ("slurm-down-opens", ev("DOWN", "Not responding"), NodeView(), DecisionKind.OPEN),
    ("slurm-drain-opens", ev("DRAIN", "bad gpu"), NodeView(), DecisionKind.OPEN),
    ("slurm-idle+drain-combined-opens", ev("IDLE+DRAIN", "ecc"), NodeView(), DecisionKind.OPEN),
    ("slurm-not-responding-opens", ev("NOT_RESPONDING"), NodeView(), DecisionKind.OPEN),
    ("slurm-idle-ignored", ev("IDLE"), NodeView(), DecisionKind.RECORD),
    ("our-own-drain-ignored", ev("DRAIN", "remediation: slurm FAIL"), NodeView(), DecisionKind.RECORD),
    ("maintenance-drain-ignored", ev("DRAIN", "maintenance: PSU swap"), NodeView(), DecisionKind.RECORD),
    ("planned-drain-ignored", ev("DRAIN", "Planned kernel upgrade"), NodeView(), DecisionKind.RECORD),
    ("already-remediating", ev("FAIL", "xid"), NodeView(NodeStatus.REMEDIATING, 12), DecisionKind.RECORD),
    ("quarantined-stays", ev("FAIL", "xid"), NodeView(NodeStatus.QUARANTINED), DecisionKind.RECORD),
    (
        "k8s-configured-condition",
        ev("GpuXidError=True", source=Source.KUBERNETES),
        NodeView(),
        DecisionKind.OPEN,
    ),
    ("k8s-ready-false", ev("Ready=False", source=Source.KUBERNETES), NodeView(), DecisionKind.OPEN),
    (
        "k8s-unconfigured-condition",
        ev("MemoryPressure=True", source=Source.KUBERNETES),
        NodeView(),
        DecisionKind.RECORD,
    ),
    (
        "manual-report-opens",
        ev("REPORTED", "maintenance words do not matter", Source.MANUAL),
        NodeView(),
        DecisionKind.OPEN,
    ),
    ("repeat-offender-at-N", ev("FAIL"), NodeView(recent_failures=2), DecisionKind.QUARANTINE),
    ("not-yet-at-N-minus-1", ev("FAIL"), NodeView(recent_failures=1), DecisionKind.OPEN),
    (
        "healthy-recovers-unhealthy",
        ev("IDLE", kind=EventKind.HEALTHY),
        NodeView(NodeStatus.UNHEALTHY),
        DecisionKind.RECOVERED,
    ),
    (
        "healthy-while-remediating",
        ev("IDLE", kind=EventKind.HEALTHY),
        NodeView(NodeStatus.REMEDIATING, 3),
        DecisionKind.RECORD,
    ),
    (
        "healthy-does-not-release",
        ev("IDLE", kind=EventKind.HEALTHY),
        NodeView(NodeStatus.QUARANTINED),
        DecisionKind.RECORD,
    ),
    ("inventory-recorded", ev("IDLE", kind=EventKind.INVENTORY), NodeView(), DecisionKind.RECORD),
]


@pytest.mark.parametrize(
    ("event", "node", "expected"), [c[1:] for c in DECIDE_CASES], ids=[c[0] for c in DECIDE_CASES]
)
def test_decide(event: NodeEvent, node: NodeView, expected: DecisionKind) -> None:
    decision = decide(event, node, POLICY)
    assert decision.kind is expected, decision.reason
    assert decision.reason


def test_repeat_offender_reason_names_the_count_and_window() -> None:
    d = decide(ev("FAIL"), NodeView(recent_failures=2), POLICY)
    assert d.reason == "repeat offender: 3 failures within 7d (limit 3)"


def test_repeat_offender_threshold_follows_settings() -> None:
    policy = PolicySettings(repeat_offender_count=5)
    assert decide(ev("FAIL"), NodeView(recent_failures=3), policy).kind is DecisionKind.OPEN
    assert decide(ev("FAIL"), NodeView(recent_failures=4), policy).kind is DecisionKind.QUARANTINE


def test_window_expiry_counts_only_inside_the_window() -> None:
    clock = FakeClock(T0)
    window = timedelta(days=7)
    times = [T0 - timedelta(days=8), T0 - timedelta(days=6, hours=23), T0 - timedelta(hours=1)]
    assert count_in_window(times, clock.now(), window) == 2
    clock.advance(timedelta(days=1).total_seconds())
    assert count_in_window(times, clock.now(), window) == 1


def view(**kw: object) -> ClusterView:
    base: dict[str, object] = dict(
        paused=False, pool_size=100, failed_in_window=0, machine_active=0, last_machine_action_at=None
    )
    base.update(kw)
    return ClusterView(**base)  # type: ignore[arg-type]


ADMISSION_POLICY = PolicySettings(
    max_concurrent=2, breaker_max_fraction=0.10, breaker_min_failures=3, min_restart_gap_s=30
)

GATE_CASES = [
    ("all-clear", Step.VM_RESTART, view(), True, True),
    ("paused-blocks-drain", Step.SLURM_DRAIN, view(paused=True), True, False),
    ("paused-blocks-vm", Step.VM_RESTART, view(paused=True), True, False),
    ("breaker-allows-drain", Step.SLURM_DRAIN, view(failed_in_window=50), True, True),
    ("breaker-allows-cordon", Step.K8S_CORDON, view(failed_in_window=50), True, True),
    ("breaker-blocks-evict", Step.K8S_EVICT, view(failed_in_window=50), True, False),
    ("breaker-blocks-new-vm-action", Step.VM_RESTART, view(failed_in_window=11), True, False),
    ("breaker-lets-running-op-finish", Step.VM_RESTART, view(failed_in_window=50), False, True),
    ("breaker-at-exact-fraction-closed", Step.VM_RESTART, view(failed_in_window=10), True, True),
    ("breaker-min-failures-small-pool", Step.VM_RESTART, view(pool_size=8, failed_in_window=2), True, True),
    ("breaker-small-pool-opens-at-min", Step.VM_RESTART, view(pool_size=8, failed_in_window=3), True, False),
    ("max-concurrent-reached", Step.VM_RESTART, view(machine_active=2), True, False),
    ("max-concurrent-below", Step.VM_RESTART, view(machine_active=1), True, True),
    ("max-concurrent-ignores-polling", Step.VM_RESTART, view(machine_active=5), False, True),
    ("min-gap-not-elapsed", Step.VM_RESTART, view(last_machine_action_at=T0 - timedelta(seconds=29)), True, False),
    ("min-gap-elapsed", Step.VM_RESTART, view(last_machine_action_at=T0 - timedelta(seconds=30)), True, True),
    ("min-gap-only-for-vm", Step.SLURM_DRAIN, view(last_machine_action_at=T0), True, True),
]


@pytest.mark.parametrize(
    ("step", "cluster", "new_action", "ok"), [c[1:] for c in GATE_CASES], ids=[c[0] for c in GATE_CASES]
)
def test_admission(step: Step, cluster: ClusterView, new_action: bool, ok: bool) -> None:
    verdict = admit(step, cluster, ADMISSION_POLICY, now=T0, new_machine_action=new_action)
    assert verdict.ok is ok, verdict.reason
    if not ok:
        assert verdict.reason


def test_breaker_opens_and_closes_as_the_window_slides() -> None:
    clock = FakeClock(T0)
    failures = [T0 + timedelta(seconds=i) for i in range(12)]  # 12 of 100 nodes fail within 12 s
    clock.advance(20)

    def state() -> bool:
        n = count_in_window(failures, clock.now(), ADMISSION_POLICY.breaker_window)
        return breaker_open(view(failed_in_window=n), ADMISSION_POLICY)

    assert state() is True
    clock.advance(ADMISSION_POLICY.breaker_window_s - 15)  # the first 5 failures slide out: 7 left
    assert state() is False


@pytest.mark.parametrize("name", ["n1\n", "n1\nrm", "", "-n1", "n 1", "n1;ls", "a" * 254], ids=repr)
def test_node_names_are_matched_whole(name: str, bad_inputs: BadInputs) -> None:
    from remediation.domain.events import InvalidEvent

    with pytest.raises(InvalidEvent, match="node") as refused:
        NodeEvent.parse({"source": "slurm", "node": name, "kind": "unhealthy", "state": "DOWN",
                         "observed_at": T0.isoformat()})
    bad_inputs.tried(NODE_NAME, f"event node name {name!r:.40}", f"{type(refused.value).__name__}", lost=None)
