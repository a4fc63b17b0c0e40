"""The latching storm breaker's pure decisions (remediation.domain.policy), table-driven."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from remediation.domain.policy import ClusterView, admit, breaker_holds, breaker_may_auto_close
from remediation.domain.statemachine import Step
from remediation.settings import PolicySettings

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def view(failed: int = 0, latched: bool = False, quiet_s: float | None = None) -> ClusterView:
    return ClusterView(paused=False, pool_size=20, failed_in_window=failed, machine_active=0, last_machine_action_at=None,
                       breaker_latched=latched, breaker_reason="5/20 nodes failed within 600s (limit 10%)",
                       last_failure_at=None if quiet_s is None else NOW - timedelta(seconds=quiet_s))


@pytest.mark.parametrize("v,holds", [
    (view(failed=1), False),
    (view(failed=5), True),  # tripped by the window right now
    (view(failed=0, latched=True), True),  # the window slid past: latched, still holds
    (view(failed=1, latched=True), True),
], ids=["quiet", "tripped", "latched-after-slide", "latched-below-threshold"])
def test_breaker_holds(v: ClusterView, holds: bool) -> None:
    assert breaker_holds(v, PolicySettings()) is holds


@pytest.mark.parametrize("auto,v,closes", [
    (None, view(latched=True, quiet_s=10**6), False),  # off by default: only a human closes it
    (900, view(latched=True, quiet_s=899), False),
    (900, view(latched=True, quiet_s=900), True),
    (900, view(failed=5, latched=True, quiet_s=10**6), False),  # the window still trips it
    (900, view(latched=False, quiet_s=10**6), False),  # nothing to close
], ids=["off", "not-quiet-yet", "quiet", "still-tripped", "not-open"])
def test_auto_close_is_opt_in_and_needs_quiet(auto: float | None, v: ClusterView, closes: bool) -> None:
    assert breaker_may_auto_close(v, PolicySettings(breaker_auto_close_s=auto), NOW) is closes


@pytest.mark.parametrize("step,ok", [(Step.SLURM_DRAIN, True), (Step.K8S_CORDON, True), (Step.K8S_EVICT, False),
                                     (Step.VM_RESTART, False)], ids=["drain", "cordon", "evict", "vm"])
def test_a_latched_breaker_refuses_disruptive_steps_and_says_how_to_close(step: Step, ok: bool) -> None:
    verdict = admit(step, view(latched=True), PolicySettings(), now=NOW, new_machine_action=True)
    assert verdict.ok is ok
    if not ok:
        assert "until a human closes it: remediation breaker close -r REASON" in verdict.reason


def test_polling_a_started_vm_action_is_never_held() -> None:
    assert admit(Step.VM_RESTART, view(latched=True), PolicySettings(), now=NOW, new_machine_action=False).ok
