"""Every signal explained before it is counted: own-caused signals, superseded edges, different faults.

Table-driven over :func:`remediation.domain.policy.decide`, with a remediation window whose VM action started
at T0+100 s. ``settle`` is 600 s. Times are seconds after T0."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from remediation.domain.attribution import Window, healthy_observations, own_cause
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.policy import DecisionKind, NodeView, decide
from remediation.domain.statemachine import NodeStatus
from remediation.settings import PolicySettings

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
POLICY = PolicySettings(repeat_offender_count=2, settle_s=600)
K8S, SLURM, MANUAL = Source.KUBERNETES, Source.SLURM, Source.MANUAL
U, H = EventKind.UNHEALTHY, EventKind.HEALTHY
A, OP, Q, R, S = (DecisionKind.ATTRIBUTED, DecisionKind.OPEN, DecisionKind.QUARANTINE, DecisionKind.RECORD,
                  DecisionKind.SUPERSEDED)


def t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ev(source: Source, state: str, at: float, reason: str = "", since: float | None = None,
       kind: EventKind = U) -> NodeEvent:
    return NodeEvent(source=source, node="gpu-node-8", kind=kind, state=state, reason=reason,
                     observed_at=t(at), since=None if since is None else t(since))


OPEN = Window(11, t(0), None, t(100))  # open, its VM restarted at +100 s
CLOSED = Window(11, t(0), t(200), t(100))  # closed at +200 s
NO_VM = Window(11, t(0), t(50), None)  # closed (cancelled) before any VM action
AFTER = dict(status=NodeStatus.HEALTHY, recent_failures=1)  # one episode already behind the node

CASES = [
    # ---- our own reboot, while the remediation is open: attributed, linked to it
    ("open-ready-unknown-during-reboot", ev(K8S, "Ready=Unknown", 150, since=110),
     NodeView(NodeStatus.REMEDIATING, 11, 0, OPEN), A),
    ("open-not-responding-during-reboot", ev(SLURM, "NOT_RESPONDING", 120),
     NodeView(NodeStatus.REMEDIATING, 11, 0, OPEN), A),
    ("open-gpu-condition-is-recorded-under-it", ev(K8S, "GpuXidError=True", 150, since=140),
     NodeView(NodeStatus.REMEDIATING, 11, 0, OPEN), R),
    ("open-ready-before-the-vm-action-is-under-it", ev(K8S, "Ready=False", 90, since=20),
     NodeView(NodeStatus.REMEDIATING, 11, 0, OPEN), R),
    # ---- after the close, within settle: the phantom
    ("closed-late-ready-unknown-from-the-reboot", ev(K8S, "Ready=Unknown", 201, since=110), NodeView(**AFTER, window=CLOSED), A),
    ("closed-ready-false-from-the-boot", ev(K8S, "Ready=False", 260, since=130), NodeView(**AFTER, window=CLOSED), A),
    ("closed-slurm-down-observed-before-close", ev(SLURM, "DOWN", 150, "Not responding"), NodeView(**AFTER, window=CLOSED), A),
    ("closed-resume-echo-not-responding", ev(SLURM, "NOT_RESPONDING", 230), NodeView(**AFTER, window=CLOSED), A),
    ("closed-our-drain-echo", ev(SLURM, "DRAIN", 210, "remediation: slurm FAIL: xid 79"), NodeView(**AFTER, window=CLOSED), A),
    ("closed-our-down-with-our-reason", ev(SLURM, "DOWN", 150, "remediation: slurm FAIL: xid"), NodeView(**AFTER, window=CLOSED), A),
    # ---- a different fault in the same window is a fault
    ("closed-new-gpu-condition-counts", ev(K8S, "GpuXidError=True", 250, since=220), NodeView(**AFTER, window=CLOSED), Q),
    ("closed-researcher-fail-new-reason-counts", ev(SLURM, "FAIL", 230, "xid 48: ecc"), NodeView(**AFTER, window=CLOSED), Q),
    ("closed-ready-false-that-began-after-close", ev(K8S, "Ready=False", 560, since=260), NodeView(**AFTER, window=CLOSED), Q),
    ("closed-slurmd-dies-after-close-down", ev(SLURM, "DOWN", 260, "Not responding"), NodeView(**AFTER, window=CLOSED), Q),
    ("closed-human-down-reason", ev(SLURM, "DOWN", 150, "bad cable"), NodeView(**AFTER, window=CLOSED), Q),
    ("closed-ready-before-our-vm-action", ev(K8S, "Ready=False", 210, since=40), NodeView(**AFTER, window=CLOSED), Q),
    ("manual-report-is-a-human-verdict", ev(MANUAL, "REPORTED", 210, "bad"), NodeView(**AFTER, window=CLOSED), Q),
    # ---- after settle, nothing is ours any more
    ("after-settle-reboot-kind-counts", ev(K8S, "Ready=Unknown", 801, since=110), NodeView(**AFTER, window=CLOSED), Q),
    ("after-settle-not-responding-counts", ev(SLURM, "NOT_RESPONDING", 801), NodeView(**AFTER, window=CLOSED), Q),
    # ---- no VM action: no reboot to echo
    ("no-vm-action-no-echo", ev(K8S, "Ready=Unknown", 60, since=55), NodeView(**AFTER, window=NO_VM), Q),
    ("no-window-ready-opens", ev(K8S, "Ready=Unknown", 60, since=55), NodeView(), OP),
    # ---- older watchers send no `since`: the observation time stands in for it
    ("no-since-observed-in-window", ev(K8S, "Ready=Unknown", 150), NodeView(**AFTER, window=CLOSED), A),
    ("no-since-observed-after-close", ev(K8S, "Ready=Unknown", 300), NodeView(**AFTER, window=CLOSED), Q),
    # ---- level: a newer healthy observation of the same condition supersedes the edge
    ("superseded-by-newer-healthy", ev(K8S, "Ready=False", 300, since=250),
     NodeView(**AFTER, healthy={("kubernetes", "Ready"): t(300.5)}), S),
    ("same-instant-healthy-does-not-supersede", ev(K8S, "Ready=False", 300, since=250),
     NodeView(**AFTER, healthy={("kubernetes", "Ready"): t(300)}), Q),
    ("older-healthy-does-not-supersede", ev(K8S, "Ready=False", 300, since=250),
     NodeView(**AFTER, healthy={("kubernetes", "Ready"): t(299)}), Q),
    ("other-condition-does-not-supersede", ev(K8S, "Ready=False", 300, since=250),
     NodeView(**AFTER, healthy={("kubernetes", "GpuXidError"): t(400)}), Q),
    ("slurm-superseded-by-idle", ev(SLURM, "FAIL", 300, "xid"), NodeView(healthy={("slurm", "node"): t(301)}), S),
    ("slurm-not-superseded-by-kube", ev(SLURM, "FAIL", 300, "xid"), NodeView(healthy={("kubernetes", "Ready"): t(301)}), OP),
]


@pytest.mark.parametrize(("event", "view", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide_explains_before_counting(event: NodeEvent, view: NodeView, expected: DecisionKind) -> None:
    decision = decide(event, view, POLICY)
    assert decision.kind is expected, decision.reason
    if expected is A:
        assert decision.reason.startswith("caused by remediation #11: ") and decision.remediation == 11


def test_attribution_names_the_action() -> None:
    assert own_cause(ev(K8S, "Ready=Unknown", 201, since=110), CLOSED, "remediation:",
                     settle=timedelta(seconds=600)) == "caused by remediation #11: vm_restart"
    drain = ev(SLURM, "DRAIN", 210, "remediation: quarantined: repeat offender")
    quarantined = replace(CLOSED, quarantined=True)
    assert own_cause(drain, quarantined, "remediation:",
                     settle=timedelta(seconds=600)) == "caused by remediation #11: quarantine"
    # The step comes from the remediation's record, not from the reason's wording.
    assert own_cause(drain, CLOSED, "remediation:",
                     settle=timedelta(seconds=600)) == "caused by remediation #11: slurm_drain"
    reworded = ev(SLURM, "DRAIN", 210, "remediation: held out of the pool")
    assert own_cause(reworded, quarantined, "remediation:",
                     settle=timedelta(seconds=600)) == "caused by remediation #11: quarantine"


def test_a_dry_run_causes_nothing() -> None:
    dry = Window(11, t(0), t(200), t(100), dry_run=True)
    assert own_cause(ev(K8S, "Ready=Unknown", 201, since=110), dry, "remediation:",
                     settle=timedelta(seconds=600)) is None


def test_healthy_observations_take_healthy_events_and_slurm_inventory_of_a_good_state() -> None:
    rows = [
        ("n", "kubernetes", "healthy", "Ready=True", t(5)),
        ("n", "kubernetes", "healthy", "Ready=True", t(3)),
        ("n", "kubernetes", "unhealthy", "Ready=False", t(9)),
        ("n", "slurm", "inventory", "IDLE", t(7)),
        ("n", "slurm", "inventory", "DOWN", t(8)),
        ("m", "slurm", "inventory", "FAIL+DRAIN", t(8)),
    ]
    got = healthy_observations(rows, {"slurm": frozenset({"DOWN", "FAIL", "DRAIN"})})
    assert got == {("n", ("kubernetes", "Ready")): t(5), ("n", ("slurm", "node")): t(7)}
