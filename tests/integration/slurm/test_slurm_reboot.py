"""Slurm's own reboot (``machine.backend = slurm``) against the real slurmctld of each release.

The session clusters' RebootProgram (``scripts/slurm-up.sh``) restarts the rebooted node's slurmd with
``-b``, which registers as a fresh boot; with ``DIR/run/NODE.no-boot`` it restarts slurmd without it,
so slurmd registers again with the old BootTime: a reboot that never happens. The requests slurmctld
received are counted in its own log, the reboots the nodes ran in the program's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from remediation.adapters.noop import NoopKube
from remediation.adapters.slurm.cli import CliSlurm
from remediation.adapters.slurm.parse import NodeRecord
from remediation.adapters.slurm.reboot import REBOOT_FLAGS, SlurmReboot
from remediation.clock import SystemClock
from remediation.domain.context import RemediationContext
from remediation.domain.outcomes import Adapters, Done, Escalate, StepInput, StepSettings, Wait
from remediation.domain.step_bodies import verify, vm_restart
from remediation.domain.step_records import dumped
from remediation.ports.cluster import Operation, OperationStatus, VMAction, VMRef
from remediation.settings import SlurmSettings, load_settings
from tests.integration.slurm.conftest import SlurmCluster
from tests.pace import within

pytestmark = pytest.mark.slurm

PREFIX = "remediation:"  # policy.our_reason_prefix (default)


def requests(cluster: SlurmCluster, node: str) -> int:
    """Reboot requests slurmctld queued for ``node`` (it logs each one, on 22.05 and 24.11)."""
    log = (cluster.dir / "log" / "slurmctld.log").read_text()
    return log.count(f"reboot request queued for nodes {node}\n")


def reboots(cluster: SlurmCluster, node: str) -> int:
    """Times the RebootProgram ran for ``node``."""
    path = cluster.dir / "log" / "reboot.log"
    return sum(f" reboot {node} " in line for line in path.read_text().splitlines()) if path.exists() else 0


def poll_until_done(settings: SlurmSettings, stored: str, timeout: float = 30) -> OperationStatus:
    """Poll as a redelivered task would: a fresh adapter, and only the Operation the step row kept."""
    deadline = within(timeout)
    while True:
        status = SlurmReboot(settings, PREFIX).poll(Operation.from_dict(json.loads(stored)))
        if status.done or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def test_one_request_per_key_across_a_kill_and_recovery_proven_by_slurmctld(slurm: SlurmCluster) -> None:
    node, key = "gpu-node-1", "r41:vm_restart:1"
    cli = CliSlurm(slurm.settings())
    cli.drain(node, f"{PREFIX} xid 79")  # the workflow's drain, before any machine action
    before, asked_before, ran_before = cli.status(node), requests(slurm, node), reboots(slurm, node)
    worker = SlurmReboot(slurm.settings(), PREFIX)
    op = worker.start(worker.machine_of(node), VMAction.RESTART, key)
    since = op.data["requested_at"]
    assert requests(slurm, node) == asked_before + 1
    # The worker dies before the workflow recorded the Operation; the redelivered step starts again.
    again = SlurmReboot(slurm.settings(), PREFIX).start(VMRef("slurm", node), VMAction.RESTART, key)
    assert (again.data["requested_at"], again.data["request"]) == (since, "found")
    stored = json.dumps(again.to_dict())  # what the step row keeps

    status = poll_until_done(slurm.settings(), stored)
    assert status == OperationStatus(done=True)
    after = cli.status(node)
    assert not after.flags & REBOOT_FLAGS
    assert after.boot_time >= since - 1 and after.slurmd_start_time >= since > before.boot_time
    # nextstate=DOWN: back, but out of service under our reason until the workflow returns it.
    assert after.state == "DOWN" and after.reason.startswith(f"{PREFIX} reboot ")
    # Killed once more, after the reboot and before recording it: nothing is asked again.
    assert SlurmReboot(slurm.settings(), PREFIX).start(VMRef("slurm", node), VMAction.RESTART, key).data[
        "request"] == "found"
    assert (requests(slurm, node), reboots(slurm, node)) == (asked_before + 1, ran_before + 1)


def wait_for(cli: CliSlurm, node: str, ok: Callable[[NodeRecord], bool], timeout: float = 30) -> NodeRecord:
    deadline = within(timeout)
    while not ok(now := cli.status(node)):
        assert time.monotonic() < deadline, now
        time.sleep(0.2)
    return now


def test_a_reboot_that_never_happens_is_waited_on_then_reported_as_an_error(slurm: SlurmCluster) -> None:
    node = "gpu-node-2"
    marker = slurm.dir / "run" / f"{node}.no-boot"
    marker.touch()
    try:
        cli = CliSlurm(slurm.settings())
        cli.drain(node, f"{PREFIX} xid 79")
        asked_before = requests(slurm, node)
        worker = SlurmReboot(slurm.settings(), PREFIX)
        op = worker.start(worker.machine_of(node), VMAction.RESTART, "r42:vm_restart:1")
        since = op.data["requested_at"]
        # slurmd registers again after the request, from a machine that did not boot: not a reboot.
        # (Issued first: a slurmd started in the request's own second already reads as "after" it.)
        back = wait_for(cli, node, lambda n: "REBOOT_ISSUED" in n.flags and n.slurmd_start_time >= since
                        and "NOT_RESPONDING" not in n.flags)
        assert 0 < back.boot_time < since - 1
        assert worker.poll(op) == OperationStatus(done=False)
        # The machine step stops waiting at workflow.vm_operation_timeout_s and climbs the ladder.
        cfg = StepSettings.of(load_settings())
        now = datetime.now(UTC)
        waited = StepInput(remediation_id=42, node=node, cause="xid 79", ladder=0, context=RemediationContext(),
                           key="r42:vm_restart:1", attempt=1, checks=3, provider_op=op.to_dict(), detail={},
                           started_at=now - timedelta(seconds=cfg.workflow.vm_operation_timeout_s + 1))
        assert isinstance(vm_restart(waited, Adapters(cli, NoopKube(), worker), cfg, now=now), Escalate)
        # slurmctld ends a reboot without a boot at ResumeTimeout (its check runs every half minute or
        # so: too slow here) or when someone resumes the node, as here. Either is an operation error.
        slurm.scontrol("update", f"nodename={node}", "state=resume")
        status = poll_until_done(slurm.settings(), json.dumps(op.to_dict()))
        assert status.done and status.error is not None
        assert requests(slurm, node) == asked_before + 1 and not cli.status(node).flags & REBOOT_FLAGS
    finally:
        marker.unlink()


def test_a_worker_clock_ahead_of_slurmctld_still_proves_a_real_reboot(slurm: SlurmCluster) -> None:
    """Boot proof compares slurmctld's times with slurmctld's own: the worker's clock plays no part."""
    node, key = "gpu-node-3", "r43:vm_restart:1"
    ahead = SystemClock(offset_s=600)  # this worker's clock runs ten minutes ahead of slurmctld's
    cli = CliSlurm(slurm.settings())
    cli.drain(node, f"{PREFIX} xid 79")
    ran_before = reboots(slurm, node)
    machine = Adapters(cli, NoopKube(), SlurmReboot(slurm.settings(), PREFIX, clock=ahead))
    cfg = StepSettings.of(load_settings())
    inp = StepInput(remediation_id=43, node=node, cause="xid 79", ladder=0, context=RemediationContext(),
                    key=key, attempt=1, checks=0, provider_op=None, detail={}, started_at=ahead.now())
    deadline = within(30)
    while isinstance(out := vm_restart(inp, machine, cfg, now=ahead.now()), Wait):  # as the workflow runs it
        assert time.monotonic() < deadline, out
        inp = replace(inp, checks=inp.checks + 1, provider_op=out.provider_op or inp.provider_op,
                      detail={**inp.detail, **dumped(out.detail)})
        time.sleep(0.2)
    assert isinstance(out, Done), out  # the reboot slurmctld saw is proven
    assert reboots(slurm, node) == ran_before + 1
    proved = verify(replace(inp, context=inp.context.merged(out.context), provider_op=None, checks=0, detail={},
                            started_at=ahead.now()), machine, cfg, now=ahead.now())
    assert isinstance(proved, Done), proved  # and so is slurmd's registration after it
