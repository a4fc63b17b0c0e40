"""What a watcher's /livez and /readyz say (watchers/health.py), on a clock the test moves."""

from __future__ import annotations

import pytest

from remediation.settings import Settings
from remediation.watchers.health import WatcherHealth


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def health(clock: Clock) -> WatcherHealth:
    settings = Settings(health={"liveness_stale_s": 60, "readiness_stale_s": 300})
    return WatcherHealth("slurm", settings, clock=clock)


def test_a_standby_is_live_and_ready_however_long_it_waits(health: WatcherHealth, clock: Clock) -> None:
    for _ in range(10):
        clock.now += 50
        health.turned()
    assert health.live() == (True, {"watcher": "slurm", "role": "standby", "loop_age_s": 0.0})
    assert health.ready() == (True, {"watcher": "slurm", "role": "standby"})


def test_a_leader_is_unready_once_its_last_success_is_stale_but_stays_live(
    health: WatcherHealth, clock: Clock
) -> None:
    health.leading(True)
    clock.now += 299  # no poll has succeeded yet: counted from taking the lead
    health.turned()
    assert health.ready()[0] is True
    clock.now += 2
    health.turned()
    ok, body = health.ready()
    assert (ok, body["role"], body["last_success_age_s"]) == (False, "leader", 301.0)
    assert health.live()[0] is True  # its loop turns: Slurm failing is not the process's fault
    health.succeeded(0.01)
    assert health.ready() == (True, {"watcher": "slurm", "role": "leader", "last_success_age_s": 0.0})


def test_a_loop_that_stopped_turning_is_not_live(health: WatcherHealth, clock: Clock) -> None:
    clock.now += 59
    assert health.live()[0] is True
    clock.now += 2
    ok, body = health.live()
    assert (ok, body["loop_age_s"]) == (False, 61.0)


def test_losing_the_lead_makes_it_a_ready_standby_again(health: WatcherHealth, clock: Clock) -> None:
    health.leading(True)
    clock.now += 1000
    assert health.ready()[0] is False
    health.leading(False)
    assert health.ready() == (True, {"watcher": "slurm", "role": "standby"})
    health.leading(True)  # a new lead starts a fresh allowance
    assert health.ready()[0] is True
