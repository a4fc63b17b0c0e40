"""The domain ladder's rules: the rungs a site can climb, the step after each, and admission that
counts a domain as all its trays. Why: docs/policy.md#the-domain-ladder-one-repair-per-nvlink-domain"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from remediation.domain.policy import ClusterView
from remediation.domain_repair.rules import DomainStep as S
from remediation.domain_repair.rules import Next, admit_domain, after, ladder
from remediation.settings import PolicySettings

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
FULL = (S.FABRIC_RESTART, S.CHASSIS_RESET, S.QUARANTINE)


def test_the_rungs_a_site_can_climb() -> None:
    assert ladder(runs_jobs=True, chassis=True) == FULL
    assert ladder(runs_jobs=True, chassis=False) == (S.FABRIC_RESTART, S.QUARANTINE)
    # Nothing can prove a domain without a job: a human gets it at once, power cycle or not.
    assert ladder(runs_jobs=False, chassis=True) == (S.QUARANTINE,)


@pytest.mark.parametrize(("step", "ok", "rung", "want"), [
    (S.DRAIN, True, 0, Next(S.JOBS, 0)),
    (S.JOBS, True, 0, Next(S.FABRIC_RESTART, 0)),
    (S.JOBS, False, 0, Next(S.QUARANTINE, 2)),  # nobody can tell whether a job runs: nothing acts
    (S.FABRIC_RESTART, True, 0, Next(S.DOMAIN_CHECK, 0)),
    (S.FABRIC_RESTART, False, 0, Next(S.CHASSIS_RESET, 1)),
    (S.DOMAIN_CHECK, True, 0, Next(S.RETURN, 0)),
    (S.DOMAIN_CHECK, False, 0, Next(S.CHASSIS_RESET, 1)),
    (S.CHASSIS_RESET, True, 1, Next(S.DOMAIN_CHECK, 1)),
    (S.DOMAIN_CHECK, False, 1, Next(S.QUARANTINE, 2)),
    (S.CHASSIS_RESET, False, 1, Next(S.QUARANTINE, 2)),
    (S.QUARANTINE, True, 2, Next(S.DONE, 2)),
    (S.RETURN, True, 0, Next(S.DONE, 0)),
])
def test_the_step_after(step: S, ok: bool, rung: int, want: Next) -> None:
    assert after(step, ok=ok, rung=rung, rungs=FULL) == want


def _view(active: int = 0, *, last: datetime | None = None, paused: bool = False) -> ClusterView:
    return ClusterView(paused=paused, pool_size=100, failed_in_window=0, machine_active=active,
                       last_machine_action_at=last)


def test_a_domain_counts_as_all_its_trays_for_max_concurrent() -> None:
    policy = PolicySettings()  # max_concurrent 4
    assert admit_domain(_view(), policy, trays=18, now=NOW).ok  # alone, a rack larger than the limit goes
    refused = admit_domain(_view(1), policy, trays=4, now=NOW)
    assert not refused.ok and "counts as its 4 trays" in refused.reason
    assert admit_domain(_view(1), policy, trays=3, now=NOW).ok


def test_the_pause_and_the_gap_hold_a_domain() -> None:
    policy = PolicySettings()
    assert "paused" in admit_domain(_view(paused=True), policy, trays=4, now=NOW).reason
    recent = _view(last=NOW - timedelta(seconds=1))
    assert "minimum gap" in admit_domain(recent, policy, trays=4, now=NOW).reason
