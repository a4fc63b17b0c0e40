"""Error scope on real Postgres: the system's faults pause, unmapped errors hold, neither is a node's fault.

The engine runs synchronously against the in-memory world with a fake clock (as in
test_workflow_engine.py); the adapters raise what the real ones raise for each case. What must hold:

- a systemic error (401, 403, quota, configuration, slurmctld unreachable) records the error on the step
  at once, pauses automation with the reason, writes one page however many nodes meet it, and never
  quarantines or closes a remediation (so no node is charged a failure);
- an error nobody mapped holds its own remediation with a page; the same error on a second node pauses;
- a self-healing pause is lifted by the health probe after ``policy.probe_successes`` answers in a row,
  a credential pause only by a human, whose resume also lifts the holds.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.clock import FakeClock
from remediation.db.models import AuditLog, Remediation, RemediationStep
from remediation.db.queries import PAUSED, control_get, recent_failure_counts
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.step_bodies import Adapters
from remediation.ports.dispatch import FollowUp
from remediation.ports.errors import ControllerUnreachable, CredentialError, QuotaError, SystemicError
from remediation.services import lever_rules
from remediation.services.ingest import ingest
from remediation.services.workflow import Workflow
from remediation.settings import Settings
from tests.faults import SOFTWARE_FAULT
from tests.integration.test_workflow_engine import clock  # noqa: F401  (fixture)

NODES = [f"gpu-node-{i}" for i in range(8)]


@pytest.fixture
def world() -> MemoryWorld:
    return MemoryWorld(nodes=NODES)


@pytest.fixture
def settings() -> Settings:
    return Settings(
        policy={"min_restart_gap_s": 0, "breaker_max_fraction": 1.0, "max_concurrent": 8},
        workflow={"poll_interval_s": 5, "verify_timeout_s": 120, "lease_s": 30},
    )


class FailingVM(MemoryVM):
    """A cloud whose ``start`` raises ``error()`` while ``failing`` is set."""

    def __init__(self, world: MemoryWorld, error: Any) -> None:
        super().__init__(world)
        self.error, self.failing, self.calls = error, True, 0

    def start(self, vm, action, key):  # noqa: ANN001, ANN201
        self.calls += 1
        if self.failing:
            raise self.error()
        return super().start(vm, action, key)


class ReachableAgainSlurm(MemorySlurm):
    """slurmctld that cannot be reached while ``down`` is set."""

    down = False

    def get_node(self, name):  # noqa: ANN001, ANN201
        if self.down:
            raise ControllerUnreachable("scontrol show node: Unable to contact slurm controller (connect failure)")
        return super().get_node(name)


def open_for(
    sessions: sessionmaker[Session], settings: Settings, clock: FakeClock, nodes: list[str],
    world: MemoryWorld | None = None,
) -> list[FollowUp]:
    """A researcher's FAIL on each node, in the world (when given) and as the watcher's event."""
    for n in nodes if world is not None else ():
        world.set_slurm(n, flags=["FAIL"], reason=SOFTWARE_FAULT)
    events = [NodeEvent(source=Source.SLURM, node=n, kind=EventKind.UNHEALTHY, state="FAIL", reason=SOFTWARE_FAULT,
                        observed_at=clock.now()).to_json() for n in nodes]
    with sessions() as s, s.begin():
        result = ingest(s, events, settings.policy, clock=clock)
    return [FollowUp(rid, step) for rid, step in result.opened]


def run(engine: Workflow, clock: FakeClock, todo: list[FollowUp], rounds: int = 400) -> list[FollowUp]:
    """Run follow-ups (time advancing by their countdowns) until each is refused by admission for the same
    reason twice, or done. Returns the follow-ups still pending."""
    queue = deque(todo)
    for _ in range(rounds):
        if not queue:
            return []
        f = queue.popleft()
        clock.advance(f.countdown)
        nxt = engine.run(f.remediation_id, f.step)
        if nxt is not None:
            queue.append(nxt)
    return list(queue)


def rems(sessions: sessionmaker[Session]) -> list[Remediation]:
    with sessions() as s:
        return list(s.scalars(select(Remediation).order_by(Remediation.id)))


def audits(sessions: sessionmaker[Session], action: str) -> list[AuditLog]:
    with sessions() as s:
        return list(s.scalars(select(AuditLog).where(AuditLog.action == action).order_by(AuditLog.id)))


def vm_rows(sessions: sessionmaker[Session]) -> list[RemediationStep]:
    with sessions() as s:
        return list(s.scalars(select(RemediationStep).where(RemediationStep.step == "vm_restart")))


@pytest.mark.parametrize(
    "error",
    [
        lambda: CredentialError("not authenticated: HTTP 401 Request had invalid authentication credentials",
                                status=401, component="cloud"),
        lambda: CredentialError("permission denied: compute.instances.reset", status=403, component="cloud"),
        lambda: QuotaError("quota exhausted: CPUS_ALL_REGIONS", status=403, component="cloud"),
    ],
    ids=["401", "403", "quota"],
)
def test_a_systemic_error_pauses_once_and_charges_no_node(
    sessions: sessionmaker[Session], world: MemoryWorld, settings: Settings, clock: FakeClock, error: Any
) -> None:
    vm = FailingVM(world, error)
    engine = Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), vm), settings, clock=clock)
    pending = run(engine, clock, open_for(sessions, settings, clock, NODES[:6], world))

    pause = control_get_now(sessions)
    assert pause["paused"] is True and pause["by"] == "system"
    assert error().message in pause["reason"] and pause["self_healing"] is False
    assert len(audits(sessions, "pause")) == 1  # one page, however many nodes met it
    assert all(r.status == "waiting" for r in rems(sessions)), [(r.node, r.status) for r in rems(sessions)]
    assert not [r for r in rems(sessions) if r.status == "quarantined"]
    # The step that met it shows the error at once; the others never called the cloud (admission held them).
    (failed_row,) = [r for r in vm_rows(sessions) if r.error]
    # waiting: slurmd's start was recorded in a write of its own before the call that failed
    assert failed_row.status == "waiting" and failed_row.error_kind == type(error()).__name__
    assert vm.calls == 1
    with sessions() as s:
        assert recent_failure_counts(s, NODES[:6], clock.now(),
                                     window=settings.policy.repeat_offender_window) == {
            n: 1 for n in NODES[:6]}  # the one remediation each, nothing more
    # A credential heals only by a human: the probe does nothing, a resume lets every remediation finish.
    for _ in range(5):
        engine.probe()
    assert control_get_now(sessions)["paused"] is True
    vm.failing = False
    with sessions() as s, s.begin():
        lever_rules.set_paused(s, False, "alice", reason="rotated the service account key", now=clock.now())
    assert run(engine, clock, pending) == []
    assert [r.status for r in rems(sessions)] == ["succeeded"] * 6
    assert len(world.calls("vm.restart", effect=True)) == 6  # the held step ran again once, not twice


def control_get_now(sessions: sessionmaker[Session]) -> dict[str, Any]:
    with sessions() as s:
        return control_get(s, PAUSED)


def test_an_unreachable_controller_pauses_and_the_probe_resumes_after_three_answers(
    sessions: sessionmaker[Session], world: MemoryWorld, settings: Settings, clock: FakeClock
) -> None:
    slurm = ReachableAgainSlurm(world)
    engine = Workflow(sessions, Adapters(slurm, MemoryKube(world), MemoryVM(world)), settings, clock=clock)
    todo = open_for(sessions, settings, clock, NODES[:4], world)
    slurm.down = True
    pending = run(engine, clock, todo)
    pause = control_get_now(sessions)
    assert pause["paused"] and pause["self_healing"] and pause["component"] == "slurm"
    assert "Unable to contact slurm controller" in pause["reason"]
    assert not [r for r in rems(sessions) if r.status != "waiting"]
    engine.probe()
    assert control_get_now(sessions)["probe_ok"] == 0  # still down: no progress
    slurm.down = False
    engine.probe()
    engine.probe()
    assert control_get_now(sessions)["paused"] is True  # two answers in a row are not enough
    engine.probe()
    assert control_get_now(sessions)["paused"] is False
    (resumed,) = audits(sessions, "resume")
    assert resumed.actor == "system" and "answered 3 times" in resumed.reason
    assert run(engine, clock, pending) == []
    assert [r.status for r in rems(sessions)] == ["succeeded"] * 4


class Surprise(Exception):
    """A type no adapter maps."""


def test_an_unmapped_error_holds_one_node_and_the_same_error_on_a_second_node_pauses(
    sessions: sessionmaker[Session], world: MemoryWorld, settings: Settings, clock: FakeClock
) -> None:
    class SurprisingVM(MemoryVM):
        def start(self, vm, action, key):  # noqa: ANN001, ANN201
            raise Surprise(f"credential plugin exploded for {vm.name}")

    engine = Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), SurprisingVM(world)),
                      settings, clock=clock)
    (first,) = open_for(sessions, settings, clock, NODES[:1], world)
    f = first
    while f.step != "vm_restart":
        f = engine.run(f.remediation_id, f.step)
    f = engine.run(f.remediation_id, f.step)  # slurmd's start is recorded before the machine action
    held = engine.run(f.remediation_id, f.step)
    assert held is not None and held.countdown <= settings.workflow.poll_interval_s
    (row,) = vm_rows(sessions)
    assert row.error == "credential plugin exploded for gpu-node-0" and "Surprise" in row.error_kind
    (rem,) = rems(sessions)
    assert rem.status == "waiting" and rem.wait_reason.startswith("held: unmapped")
    assert len(audits(sessions, "hold")) == 1 and not audits(sessions, "pause")
    assert control_get_now(sessions).get("paused") is not True  # one node: a hold, not a pause
    # Held: running it again does not call the cloud again.
    again = engine.run(held.remediation_id, held.step)
    assert again is not None and rems(sessions)[0].wait_reason.startswith("held:")
    # The same error on a second node is not a coincidence any more.
    run(engine, clock, open_for(sessions, settings, clock, NODES[1:2], world), rounds=20)
    pause = control_get_now(sessions)
    assert pause["paused"] is True and "gpu-node-0, gpu-node-1" in pause["reason"]
    assert len(audits(sessions, "pause")) == 1 and len(audits(sessions, "hold")) == 2
    assert not [r for r in rems(sessions) if r.status in ("quarantined", "failed", "succeeded")]
    with sessions() as s, s.begin():
        lever_rules.set_paused(s, False, "alice", reason="patched the plugin", now=clock.now())
    assert len(audits(sessions, "unhold")) == 2
    assert all("held" not in (r.context or {}) for r in rems(sessions))


def test_errors_carry_one_scope_each() -> None:
    from remediation.ports.errors import (
        ConfigError,
        NotFound,
        NotSupported,
        PermanentError,
        Scope,
        TransientError,
    )

    assert issubclass(NotSupported, ConfigError) and issubclass(ConfigError, SystemicError)
    assert {c.scope for c in (CredentialError, QuotaError, ConfigError, ControllerUnreachable)} == {Scope.SYSTEM}
    assert {c.scope for c in (PermanentError, NotFound)} == {Scope.NODE}
    assert TransientError.scope is Scope.TRANSIENT


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("scontrol update: Unable to contact slurm controller (connect failure)", "ControllerUnreachable"),
        ("sinfo: error: Munge encode failed: Failed to access munge.socket.2", "ControllerUnreachable"),
        ("scontrol: error: Incompatible versions of client and server code", "ConfigError"),
        # Slurm 22.05 and 24.11, scontrol reboot on a cluster without one: the last line alone reads
        # like an unreachable controller.
        ("scontrol reboot: scontrol: error: RebootProgram isn't defined\n"
         "scontrol_reboot_nodes error: Unspecified error", "ConfigError"),
        ("scontrol update: Access/permission denied", "CredentialError"),
        ("scontrol update: Invalid node name specified", "UnknownNode"),
        ("scontrol update: Invalid node state specified", "PermanentError"),
        ("squeue: Resource temporarily unavailable", "TransientError"),
    ],
    ids=["unreachable", "munge", "version-mismatch", "no-reboot-program", "denied", "unknown-node", "refused", "busy"],
)
def test_the_slurm_table_gives_each_message_its_scope(message: str, kind: str) -> None:
    from remediation.ports.errors import error_for_slurm

    assert error_for_slurm(message).kind == kind
