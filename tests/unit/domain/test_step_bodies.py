"""A machine action's boot is proven on slurmctld's clock alone: slurmd's start read before the action,
then a later one. The worker's clock, ahead or behind, plays no part (a cloud's or a BMC's action has
no slurmctld time of its own)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from remediation.adapters.memory import MemorySlurm, MemoryWorld, OpTiming
from remediation.adapters.memory_vm import MemoryVM
from remediation.adapters.noop import NoopKube
from remediation.clock import FakeClock
from remediation.domain.context import RemediationContext
from remediation.domain.outcomes import Adapters, Done, StepInput, StepSettings, Wait
from remediation.domain.step_bodies import verify, vm_restart
from remediation.domain.step_records import dumped
from remediation.settings import Settings

NODE = "gpu-node-1"
T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def restarted(world: MemoryWorld, worker_now: datetime) -> tuple[StepInput, Adapters, StepSettings]:
    """A restart run to its end by a worker whose clock reads ``worker_now``; the input verify gets."""
    world.set_slurm(NODE, flags=["DRAIN"], reason="remediation: software fault")
    ad = Adapters(MemorySlurm(world), NoopKube(), MemoryVM(world))  # no Kubernetes: slurmd's start is the proof
    cfg = StepSettings.of(Settings(machine={"backend": "memory"}))
    inp = StepInput(remediation_id=7, node=NODE, cause="software fault", ladder=0,
                    context=RemediationContext(provider_id=f"memory:///{NODE}"), key="r7:vm_restart:1",
                    attempt=1, checks=0, provider_op=None, detail={}, started_at=worker_now)
    out = vm_restart(inp, ad, cfg, now=worker_now)
    while isinstance(out, Wait):
        inp = replace(inp, checks=inp.checks + 1, provider_op=out.provider_op or inp.provider_op,
                      detail={**inp.detail, **dumped(out.detail)})
        out = vm_restart(inp, ad, cfg, now=worker_now)
    assert isinstance(out, Done), out
    after = replace(inp, context=inp.context.merged(out.context), provider_op=None, checks=0, detail={},
                    started_at=worker_now)
    return after, ad, cfg


@pytest.mark.parametrize("skew_s", [600, -600, 0], ids=["worker-ahead", "worker-behind", "same-clock"])
def test_a_real_boot_is_proven_whatever_the_workers_clock(skew_s: int) -> None:
    world = MemoryWorld(nodes=[NODE], timing=OpTiming(clock=FakeClock(T0).now))
    inp, ad, cfg = restarted(world, T0 + timedelta(seconds=skew_s))
    assert inp.context.slurmd_start_before  # read from slurmctld before the action
    proved = verify(inp, ad, cfg, now=inp.started_at)
    assert isinstance(proved, Done), proved


def test_no_boot_is_no_proof_even_with_a_worker_clock_behind() -> None:
    """The action completed but slurmd never started again: a worker clock ten minutes behind would
    have read slurmd's old start as after the action."""
    world = MemoryWorld(nodes=[NODE], timing=OpTiming(clock=FakeClock(T0).now))
    with world.mutate() as st:  # slurmd last started five minutes before the action
        st["nodes"][NODE]["slurm"]["slurmd_start"] = (T0 - timedelta(minutes=5)).timestamp()
    behind = T0 - timedelta(minutes=10)
    inp, ad, cfg = restarted(world, behind)
    before = inp.context.slurmd_start_before
    with world.mutate() as st:  # the boot never happened: slurmd's start is the one from before
        st["nodes"][NODE]["slurm"]["slurmd_start"] = datetime.fromisoformat(before).timestamp()
    out = verify(inp, ad, cfg, now=behind)
    assert isinstance(out, Wait) and "slurmd started after the action=False" in out.reason, out
