"""The Slurm reboot machine backend with its one command runner faked at our own boundary: what it asks
slurmctld, when it asks again (never, for one idempotency key), and its verdict on each node state
slurmctld shows. The node lines are the shapes Slurm 22.05.8 and 24.11.5 printed (scripts/slurm-up.sh,
RebootProgram restarting slurmd); the real thing runs in tests/integration/slurm/test_slurm_reboot.py.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from remediation.adapters.factory import machine_backend, make_adapters
from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.adapters.noop import NoopSlurmReboot, Recorder
from remediation.adapters.slurm.args import InvalidSlurmArgument
from remediation.adapters.slurm.reboot import RebootOnly, SlurmReboot, requested_at
from remediation.domain.context import RemediationContext
from remediation.domain.outcomes import Adapters, StepInput, StepSettings, Wait
from remediation.domain.providerid import InvalidProviderID
from remediation.domain.step_bodies import vm_restart
from remediation.ports.cluster import MachinesByNode, Operation, VMAction, VMRef
from remediation.ports.errors import ConfigError, PermanentError
from remediation.settings import load_settings

NODE = "gpu-node-1"
KEY = "r12:vm_restart:1"
ASKED = 1_795_649_000  # the request, in the Operation and in the marker
OLD_BOOT = ASKED - 3600


def stamp(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))  # scontrol prints local time


def line(state: str, boot: int | None, start: int, reason: str = "", at: int = ASKED) -> str:
    """``scontrol show node -o`` as 22.05 and 24.11 print it (the fields the parser reads)."""
    why = f" Reason={reason} [root@{stamp(at)}]" if reason else ""
    return (f"NodeName={NODE} Arch=x86_64 CPUTot=64 State={state} ThreadsPerCore=1 Partitions=gpu  "
            f"BootTime={stamp(boot) if boot else 'None'} SlurmdStartTime={stamp(start)} "
            f"LastBusyTime={stamp(start)}{why}")


class FakeSlurm:
    """Answers ``scontrol show node -o`` with ``node`` and records every other command."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.asked: list[list[str]] = []

    def __call__(self, argv: list[str]) -> str:
        if argv[1:3] == ["show", "node"]:
            return self.node + "\n"
        self.asked.append(argv)
        return ""


def reboot(node: str) -> tuple[SlurmReboot, FakeSlurm]:
    adapter = SlurmReboot(load_settings().slurm, "remediation:")
    fake = FakeSlurm(node)
    adapter.cli._run = fake  # type: ignore[method-assign]  # the one runner every Slurm command goes through
    return adapter, fake


def ours(suffix: str = "") -> str:
    from remediation.adapters.cloud.common import marker_for

    return f"remediation: reboot {marker_for(VMAction.RESTART, KEY)}@{ASKED}{suffix}"


def operation(**data: Any) -> Operation:
    return Operation("slurm", f"reboot:{NODE}@{ASKED}", VMAction.RESTART, VMRef("slurm", NODE),
                     {"requested_at": ASKED, **data})


def test_the_request_is_one_argument_list_with_asap_nextstate_down_and_our_marker() -> None:
    adapter, fake = reboot(line("IDLE+DRAIN", OLD_BOOT, OLD_BOOT + 5, "remediation: xid 79"))
    before = int(time.time())
    op = adapter.start(adapter.machine_of(NODE), VMAction.RESTART, KEY)
    [argv] = fake.asked
    assert argv[:4] == ["scontrol", "reboot", "ASAP", "nextstate=DOWN"] and argv[5] == NODE
    # The request's time is slurmctld's ReasonTime after the request (the fake's is ASKED); the marker
    # carries the worker's own, which no proof reads.
    assert op.data["requested_at"] == ASKED and op.data["request"] == "requested"
    mine = requested_at(argv[4], op.data["marker"])
    assert mine is not None and before <= mine <= time.time()
    assert argv[4] == f"reason={ours().replace(str(ASKED), str(mine))}"  # reboot keeps quotes: none added
    assert (op.provider, op.vm, op.action) == ("slurm", VMRef("slurm", NODE), VMAction.RESTART)


ON_RECORD = [
    ("requested-22.05", line("IDLE+DRAIN+REBOOT_REQUESTED", OLD_BOOT, OLD_BOOT + 5, ours())),
    ("issued", line("DOWN+DRAIN+REBOOT_ISSUED", OLD_BOOT, OLD_BOOT + 5, ours(" : reboot issued"))),
    ("complete", line("DOWN", ASKED + 2, ASKED + 2, ours(" : reboot issued : reboot complete"))),
    ("timed-out-24.11", line("DOWN+DRAIN", OLD_BOOT, ASKED + 2, ours(" : reboot issued : reboot timed out"))),
]


@pytest.mark.parametrize("node", [n for _, n in ON_RECORD], ids=[i for i, _ in ON_RECORD])
def test_a_redelivered_start_finds_its_request_and_never_asks_again(node: str) -> None:
    adapter, fake = reboot(node)
    op = adapter.start(VMRef("slurm", NODE), VMAction.RESTART, KEY)
    assert fake.asked == [] and op.data["requested_at"] == ASKED and op.data["request"] == "found"


def test_a_reboot_already_pending_is_waited_on_not_doubled() -> None:
    # A human's scontrol reboot (no marker of ours): its reason time is when it was asked.
    adapter, fake = reboot(line("DOWN+DRAIN+REBOOT_ISSUED", OLD_BOOT, OLD_BOOT + 5, "Reboot ASAP : reboot issued",
                                at=ASKED - 60))
    op = adapter.start(VMRef("slurm", NODE), VMAction.RESTART, KEY)
    assert fake.asked == [] and op.data["request"] == "adopted" and op.data["requested_at"] == ASKED - 60


def test_another_keys_marker_is_not_this_attempts_request() -> None:
    # 24.11 keeps a reason after a resume: the first attempt's completed reboot must not stand for the second.
    adapter, fake = reboot(line("IDLE", ASKED + 2, ASKED + 2, ours(" : reboot issued : reboot complete")))
    op = adapter.start(VMRef("slurm", NODE), VMAction.RESTART, "r12:vm_restart:2")
    assert len(fake.asked) == 1 and op.data["request"] == "requested"


@pytest.mark.parametrize("action", [VMAction.STOP_START, VMAction.REIMAGE, VMAction.REDEPLOY])
def test_anything_heavier_than_a_reboot_ends_the_ladder_and_runs_nothing(action: VMAction) -> None:
    adapter, fake = reboot(line("IDLE+DRAIN", OLD_BOOT, OLD_BOOT + 5))
    with pytest.raises(RebootOnly, match=str(action)) as raised:
        adapter.start(VMRef("slurm", NODE), action, KEY)
    assert isinstance(raised.value, PermanentError) and fake.asked == []


@pytest.mark.parametrize("vm", [VMRef("gce", NODE), VMRef("slurm", "gpu-node-[1-4]"), VMRef("slurm", "ALL")],
                         ids=["a-cloud-vm", "a-hostlist", "every-node"])
def test_only_one_plain_slurm_node_is_ever_rebooted(vm: VMRef) -> None:
    adapter, fake = reboot(line("IDLE+DRAIN", OLD_BOOT, OLD_BOOT + 5))
    with pytest.raises(PermanentError):
        adapter.start(vm, VMAction.RESTART, KEY)
    with pytest.raises(PermanentError):
        adapter.poll(Operation("slurm", "x", VMAction.RESTART, vm, {"requested_at": ASKED}))
    assert fake.asked == []
    with pytest.raises(InvalidSlurmArgument):
        adapter.machine_of("gpu-node-[1-4]")


WAIT, DONE, FAILED = (False, False), (True, False), (True, True)  # (done, error)
VERDICTS = [
    ("requested", line("IDLE+DRAIN+REBOOT_REQUESTED", OLD_BOOT, OLD_BOOT + 5, ours()), WAIT),
    ("issued", line("DOWN+DRAIN+REBOOT_ISSUED", OLD_BOOT, OLD_BOOT + 5, ours()), WAIT),
    # slurmd restarted without a reboot: registered after the request, with the old BootTime.
    ("slurmd-back-no-boot", line("DOWN+DRAIN+REBOOT_ISSUED", OLD_BOOT, ASKED + 2, ours()), WAIT),
    ("complete", line("DOWN", ASKED + 2, ASKED + 2, ours(" : reboot issued : reboot complete")), DONE),
    ("boot-read-a-second-early", line("DOWN", ASKED - 1, ASKED + 1, ours(" : reboot complete")), DONE),
    ("no-boot-time-yet", line("IDLE+NOT_RESPONDING", None, ASKED + 2), WAIT),
    # The words Slurm appends play no part: these end in an error because no boot followed the request.
    ("timed-out-22.05", line("DOWN", OLD_BOOT, ASKED + 2, ours(" : reboot issued : reboot timed out")), FAILED),
    ("timed-out-24.11", line("DOWN+DRAIN", OLD_BOOT, OLD_BOOT + 5, ours(" : reboot timed out")), FAILED),
    ("complete-in-words-only", line("DOWN", OLD_BOOT, ASKED + 2, ours(" : reboot complete")), FAILED),
    ("resumed-by-a-human", line("IDLE", OLD_BOOT, ASKED + 2), FAILED),
    ("booted-but-slurmd-not-since", line("DOWN", ASKED + 2, ASKED - 30, ours()), FAILED),
]


@pytest.mark.parametrize(("node", "verdict"), [(n, v) for _, n, v in VERDICTS], ids=[i for i, _, _ in VERDICTS])
def test_poll_takes_its_verdict_from_flags_and_times(node: str, verdict: tuple[bool, bool]) -> None:
    adapter, fake = reboot(node)
    status = adapter.poll(operation())
    assert (status.done, status.error is not None) == verdict
    assert fake.asked == []


def test_a_recorded_operation_without_its_request_time_is_refused() -> None:
    adapter, _ = reboot(line("DOWN", ASKED + 2, ASKED + 2))
    with pytest.raises(PermanentError, match="no request time"):
        adapter.poll(operation(requested_at="soon"))


def step_input() -> StepInput:
    return StepInput(remediation_id=12, node=NODE, cause="xid 79", ladder=0, context=RemediationContext(),
                     key=KEY, attempt=1, started_at=datetime.now(UTC), checks=0, provider_op=None,
                     detail={"slurmd_start_before": ""})  # recorded in a write of its own before the action


def test_the_machine_step_asks_a_node_addressed_provider_for_its_ref_and_needs_no_provider_id() -> None:
    world = MemoryWorld(nodes=[NODE])
    recorder = Recorder()
    cfg = StepSettings.of(load_settings())
    out = vm_restart(step_input(), Adapters(MemorySlurm(world), MemoryKube(world), NoopSlurmReboot(recorder)),
                     cfg, now=datetime.now(UTC))
    assert isinstance(out, Wait) and out.provider_op is not None
    assert out.provider_op["vm"]["provider"] == "slurm" and out.provider_op["vm"]["name"] == NODE
    assert [(a["would"], a["node"]) for a in recorder.actions] == [("slurm reboot", NODE)]
    # A cloud provider still needs the Node's providerID.
    assert not isinstance(MemoryVM(world), MachinesByNode)
    with pytest.raises(InvalidProviderID):
        vm_restart(step_input(), Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world)), cfg,
                   now=datetime.now(UTC))


def test_the_factory_builds_the_reboot_and_its_dry_run_twin() -> None:
    settings = {"machine": {"backend": "slurm"}, "slurm": {"backend": "cli"}, "kube": {"backend": "memory"}}
    assert isinstance(machine_backend(load_settings(**settings)), SlurmReboot)
    dry = make_adapters(load_settings(dry_run=True, **settings))
    assert isinstance(dry.machine, NoopSlurmReboot) and isinstance(dry.machine, MachinesByNode)
    with pytest.raises(ConfigError, match="machine.backend=slurm runs scontrol reboot: it needs slurm.backend cli"):
        machine_backend(load_settings(machine={"backend": "slurm"}, slurm={"backend": "memory"}))
