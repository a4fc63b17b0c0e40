"""The Slurm watcher against the real slurmctld and a real Redis stream (no Celery: kick=None)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import redis

from remediation.adapters.bus import RedisEventBus
from remediation.adapters.factory import make_lock
from remediation.adapters.slurm.backend import close_slurm, make_slurm
from remediation.adapters.slurm.cli import CliSlurm
from remediation.domain.events import EventKind, NodeEvent
from remediation.settings import Settings, load_settings
from remediation.watchers.runtime import Polls, Stopper
from remediation.watchers.slurm import watcher as slurm_watcher
from tests.conftest import REDIS_URL
from tests.integration.slurm.conftest import ROOT, SlurmCluster
from tests.pace import budget, within

# Each test once per Slurm release and backend (cli, rest): see conftest. The tests that wait on
# slurmctld's own timers (a killed slurmd turns NOT_RESPONDING, then DOWN) run once per release with
# a watcher on each backend at once, so both read the same outage and the wait is paid once.
pytestmark = pytest.mark.slurm
per_backend = pytest.mark.usefixtures("slurm_backend")
BACKENDS = ("cli", "rest")


def settings_for(cluster: SlurmCluster, prefix: str, **slurm: object) -> Settings:
    return load_settings(
        broker={"redis_url": REDIS_URL, "key_prefix": prefix},
        slurm=cluster.slurm_options(**slurm),
    )


def events(client: redis.Redis, prefix: str) -> list[NodeEvent]:
    """What the watcher published: on its own stream when fenced by its lock (as it runs), on the
    workers' stream when a test drives it with a bare bus."""
    return [NodeEvent.parse(fields[b"e"]) for stream in (f"{prefix}:events:slurm", f"{prefix}:events")
            for _, fields in client.xrange(stream)]


# A bound on waiting for what must come, never a latency goal (bench.slurm_detect measures those): generous,
# so a loaded machine (the whole suite at -n 3) is not a failure.
EVENT_WAIT_S = 30.0


def wait_for(
    client: redis.Redis, prefix: str, match: Callable[[NodeEvent], bool], timeout: float
) -> NodeEvent:
    deadline = within(timeout)
    while True:
        for event in events(client, prefix):
            if match(event):
                return event
        if time.monotonic() > deadline:
            seen = [(e.node, e.kind, e.state, e.reason) for e in events(client, prefix)]
            raise AssertionError(f"no matching event within {timeout}s; stream has {seen}")
        time.sleep(0.02)


class Running:
    """A watcher thread: stop it, or wait until it had its chance to publish (``polls`` passes)."""

    def __init__(self) -> None:
        self.stopper, self.polls = Stopper(install=False), Polls()

    def stop(self) -> None:
        self.stopper.stop()

    def had_its_chance(self, passes: int = 3, timeout: float = 15) -> None:
        """The barrier before asserting that nothing was published: ``passes`` more polls."""
        assert self.polls.advance(passes, timeout), f"the watcher made no {passes} polls in {timeout}s"


@contextmanager
def watcher(settings: Settings, client: redis.Redis, stream_prefix: str) -> Iterator[Running]:
    """A watcher thread publishing to ``stream_prefix``; its lock key follows settings' prefix."""
    running = Running()
    bus = RedisEventBus(client, stream_prefix, kick=None)
    slurm = make_slurm(settings)
    thread = threading.Thread(
        target=slurm_watcher.run,
        args=(settings, running.stopper, bus),
        kwargs={"slurm": slurm, "polls": running.polls},
        daemon=True,
    )
    thread.start()
    try:
        yield running
    finally:
        running.stop()
        thread.join(timeout=10)
        assert not thread.is_alive(), "watcher did not stop"
        close_slurm(slurm)


@contextmanager
def on_both_backends(cluster: SlurmCluster, client: redis.Redis, prefix: str, **slurm: object) -> Iterator[dict[str, str]]:
    """A leading watcher per backend, each publishing to its own stream (backend -> stream prefix)."""
    streams = {backend: f"{prefix}-{backend}" for backend in BACKENDS}
    with ExitStack() as stack:
        for backend, stream in streams.items():
            settings = load_settings(broker={"redis_url": REDIS_URL, "key_prefix": stream},
                                     slurm=cluster.options_for(backend, **slurm))
            stack.enter_context(watcher(settings, client, stream))
        for stream in streams.values():
            started(client, stream, cluster.nodes)
        yield streams


def started(client: redis.Redis, prefix: str, nodes: list[str]) -> None:
    """The first resync publishes an INVENTORY event per node: the watcher is up and leading."""
    deadline = within(10)
    while {e.node for e in events(client, prefix) if e.kind == EventKind.INVENTORY} != set(nodes):
        assert time.monotonic() < deadline, "watcher never published its first resync"
        time.sleep(0.05)


@per_backend
def test_fail_is_published_within_two_seconds_and_healthy_after_resume(
    slurm: SlurmCluster, redis_client: redis.Redis, redis_prefix: str
) -> None:
    settings = settings_for(slurm, redis_prefix)
    with watcher(settings, redis_client, redis_prefix) as running:
        started(redis_client, redis_prefix, slurm.nodes)
        t0 = time.monotonic()
        slurm.scontrol("update", "nodename=gpu-node-1", "state=fail", "reason=xid 79")
        event = wait_for(
            redis_client, redis_prefix, lambda e: e.kind == EventKind.UNHEALTHY and e.node == "gpu-node-1", 2.0
        )
        assert time.monotonic() - t0 <= 2.0
        assert (event.state, event.reason, event.reason_user) == ("FAIL", "xid 79", "root")
        assert event.dedupe_key.startswith("slurm:gpu-node-1:FAIL:")
        slurm.scontrol("update", "nodename=gpu-node-1", "state=resume")
        healthy = wait_for(
            redis_client, redis_prefix, lambda e: e.kind == EventKind.HEALTHY and e.node == "gpu-node-1", 3.0
        )
        assert healthy.state == "IDLE"
        assert healthy.dedupe_key == event.dedupe_key.replace(":FAIL:", ":healthy:FAIL:", 1)
        # The resume's NOT_RESPONDING blip (until slurmctld pings the node) was not published: once
        # Slurm shows it over, the watcher polled a few more times.
        deadline = within(15)
        while "NOT_RESPONDING" in slurm.nodes_now()["gpu-node-1"][1]:
            assert time.monotonic() < deadline, slurm.nodes_now()["gpu-node-1"]
            time.sleep(0.2)
        running.had_its_chance()
        unhealthy = [e for e in events(redis_client, redis_prefix) if e.kind == EventKind.UNHEALTHY]
        assert [e.state for e in unhealthy] == ["FAIL"]


@per_backend
def test_maintenance_drain_is_published_with_its_reason(
    slurm: SlurmCluster, redis_client: redis.Redis, redis_prefix: str
) -> None:
    with watcher(settings_for(slurm, redis_prefix), redis_client, redis_prefix) as running:
        started(redis_client, redis_prefix, slurm.nodes)
        slurm.scontrol("update", "nodename=gpu-node-2", "state=drain", "reason=maintenance: PSU swap")
        event = wait_for(redis_client, redis_prefix, lambda e: e.kind == EventKind.UNHEALTHY, EVENT_WAIT_S)
        assert (event.node, event.state, event.reason) == ("gpu-node-2", "DRAIN", "maintenance: PSU swap")
        running.had_its_chance(passes=5)  # several more polls: the unchanged drain is not published again
        drains = [e for e in events(redis_client, redis_prefix) if e.kind == EventKind.UNHEALTHY]
        assert len(drains) == 1


def test_an_old_reason_kept_after_resume_is_not_the_reason_of_a_new_fault(
    slurm: SlurmCluster, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """24.11 keeps a resumed node's last reason, and slurmctld's own NOT_RESPONDING/DOWN of that node
    later still shows it: our old "remediation:" reason must not make a new fault look like ours."""
    node = "gpu-node-2"
    slurm.scontrol("update", f"nodename={node}", "state=drain", "reason=remediation: old episode")
    slurm.scontrol("update", f"nodename={node}", "state=resume")
    deadline = within(10)
    while slurm.nodes_now()[node][1]:  # the resume's NOT_RESPONDING, until slurmctld pings the node
        assert time.monotonic() < deadline, slurm.nodes_now()[node]
        time.sleep(0.2)
    with watcher(settings_for(slurm, redis_prefix, not_responding_grace_s=2), redis_client, redis_prefix):
        started(redis_client, redis_prefix, slurm.nodes)
        pid = slurm.slurmd_pid(node)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        bad = wait_for(redis_client, redis_prefix, lambda e: e.node == node and e.kind == EventKind.UNHEALTHY, 60.0)
        assert bad.state in ("NOT_RESPONDING", "DOWN")
        assert not bad.reason.startswith("remediation:"), bad.reason
        if slurm.keeps_reason_on_resume:  # what Slurm itself shows: the old reason, still there
            assert slurm.nodes_now()[node][2] == "remediation: old episode"


def test_a_watcher_started_while_a_node_only_stops_responding_learns_its_kept_reason(
    slurm: SlurmCluster, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """The order-dependent case: a node kept "Not responding" from an earlier outage (24.11), its slurmd
    dies, and the watcher's first read sees it idle* before DOWN. slurmctld then writes "Not responding :
    Not responding"; the watcher publishes only the new fault's reason, on every release."""
    node = "gpu-node-1"
    slurm.scontrol("update", f"nodename={node}", "state=down", "reason=Not responding")
    slurm.scontrol("update", f"nodename={node}", "state=resume")
    slurm.wait_idle(node)  # only this node's state matters here
    pid = slurm.slurmd_pid(node)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = within(40)
    while (now := slurm.nodes_now()[node])[1] != {"NOT_RESPONDING"} or now[0] != "IDLE":
        assert time.monotonic() < deadline, now
        time.sleep(0.2)
    assert now[2] == ("Not responding" if slurm.keeps_reason_on_resume else "")
    with watcher(settings_for(slurm, redis_prefix), redis_client, redis_prefix):
        started(redis_client, redis_prefix, slurm.nodes)
        down = wait_for(
            redis_client, redis_prefix,
            lambda e: e.node == node and e.kind == EventKind.UNHEALTHY and e.state == "DOWN", 60.0,
        )  # fmt: skip
        assert down.reason == "Not responding", down.reason
        if slurm.keeps_reason_on_resume:  # what slurmctld itself shows: the kept reason and its own
            assert slurm.nodes_now()[node][2] == "Not responding : Not responding"


def test_killed_slurmd_is_detected_and_its_return_too(
    slurm: SlurmCluster, redis_client: redis.Redis, redis_prefix: str
) -> None:
    with watcher(settings_for(slurm, redis_prefix), redis_client, redis_prefix):
        started(redis_client, redis_prefix, slurm.nodes)
        pid = slurm.slurmd_pid("gpu-node-3")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        down = wait_for(
            redis_client,
            redis_prefix,
            lambda e: e.node == "gpu-node-3" and e.kind == EventKind.UNHEALTHY and e.state == "DOWN",
            60.0,
        )
        # 24.11 keeps earlier reasons: the watcher cuts a kept "Not responding" (an earlier test's) to "".
        expected = ("Not responding", "") if slurm.keeps_reason_on_resume else ("Not responding",)
        assert down.reason in expected, down.reason
        assert time.monotonic() - killed < budget(45)
        states = [e.state for e in events(redis_client, redis_prefix) if e.kind == EventKind.UNHEALTHY]
        assert states[0] in ("NOT_RESPONDING", "DOWN")  # idle* (~13 s) first, then DOWN (~26 s)
        slurm.start_slurmd("gpu-node-3")  # "the VM came back"; ReturnToService=1 returns it to IDLE
        reason = slurm.nodes_now()["gpu-node-3"][2]
        if slurm.keeps_reason_on_resume and reason != "Not responding":
            # 24.11 returns a node to service only when its reason is exactly "Not responding"; a node
            # that kept an older reason is DOWN "OLD : Not responding" and waits for a resume.
            slurm.scontrol("update", "nodename=gpu-node-3", "state=resume")
        wait_for(redis_client, redis_prefix, lambda e: e.node == "gpu-node-3" and e.kind == EventKind.HEALTHY, 30.0)


@per_backend
def test_restart_resync_republishes_the_bad_set_with_the_same_keys(
    slurm: SlurmCluster, redis_client: redis.Redis, redis_prefix: str
) -> None:
    settings = settings_for(slurm, redis_prefix)
    with watcher(settings, redis_client, redis_prefix):
        started(redis_client, redis_prefix, slurm.nodes)
        slurm.scontrol("update", "nodename=gpu-node-0", "state=drain", "reason=remediation: xid 79")
        edge = wait_for(redis_client, redis_prefix, lambda e: e.kind == EventKind.UNHEALTHY, EVENT_WAIT_S)
    first_run = len(events(redis_client, redis_prefix))
    # A new watcher (as after a crash or a Redis outage): its first poll is a full resync.
    with watcher(settings, redis_client, redis_prefix):
        deadline = within(EVENT_WAIT_S)
        while len(events(redis_client, redis_prefix)) < first_run + 1 + len(slurm.nodes):
            assert time.monotonic() < deadline, "no resync after restart"
            time.sleep(0.05)
    after = events(redis_client, redis_prefix)[first_run:]
    again = [e for e in after if e.kind == EventKind.UNHEALTHY]
    assert [(e.node, e.state, e.dedupe_key) for e in again] == [("gpu-node-0", "DRAIN", edge.dedupe_key)]
    inventory = {e.node: e for e in after if e.kind == EventKind.INVENTORY}
    assert sorted(inventory) == slurm.nodes
    assert inventory["gpu-node-0"].state == "DRAIN" and inventory["gpu-node-1"].state == "IDLE"
    # The same inventory facts carry the same keys as in the first run, so the ingest records them once.
    first = {e.node: e.dedupe_key for e in events(redis_client, redis_prefix)[:first_run] if e.kind == EventKind.INVENTORY}
    assert inventory["gpu-node-1"].dedupe_key == first["gpu-node-1"]


@per_backend
def test_a_resync_sends_the_whole_inventory_three_times_within_pool_stale_and_changes_between(
    slurm: SlurmCluster, redis_client: redis.Redis, redis_prefix: str
) -> None:
    settings = load_settings(broker={"redis_url": REDIS_URL, "key_prefix": redis_prefix},
                             slurm=slurm.slurm_options(resync_interval_s=60), policy={"pool_stale_s": 900})
    assert slurm_watcher.full_inventory_every(settings) == 5  # 900 s / (3 x 60 s)
    backend, now = make_slurm(settings), [0.0]
    live = RedisEventBus(redis_client, redis_prefix, kick=None)
    w = slurm_watcher.SlurmWatcher(settings, live, slurm_watcher.as_source(backend), clock=lambda: now[0])

    def resync() -> dict[str, NodeEvent]:
        """One resync (the clock past its interval): the inventory events it published, by node."""
        before = len(events(redis_client, redis_prefix))
        now[0] += 61
        w.step()
        return {e.node: e for e in events(redis_client, redis_prefix)[before:] if e.kind == EventKind.INVENTORY}

    try:
        assert sorted(resync()) == slurm.nodes  # the first: every node, each confirmed in the pool
        assert resync() == {}  # nothing changed: nothing to send
        slurm.scontrol("update", "nodename=gpu-node-1", "state=drain", "reason=maintenance: fans")
        w.bus = RedisEventBus(redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2), redis_prefix,
                              kick=None)
        with pytest.raises(slurm_watcher.BusUnavailable):
            resync()
        w.bus = live
        changed = resync()  # what could not be sent goes out with the next one
        assert sorted(changed) == ["gpu-node-1"] and changed["gpu-node-1"].state == "DRAIN"
        assert resync() == {}
        assert sorted(resync()) == slurm.nodes  # the 5th since the first whole one: every node again
    finally:
        close_slurm(backend)
        slurm.scontrol("update", "nodename=gpu-node-1", "state=resume")


@per_backend
def test_only_the_leader_publishes(slurm: SlurmCluster, redis_client: redis.Redis, redis_prefix: str) -> None:
    settings = settings_for(slurm, redis_prefix)
    leader_stream, standby_stream = f"{redis_prefix}:a", f"{redis_prefix}:b"
    with watcher(settings, redis_client, leader_stream) as leader:
        started(redis_client, leader_stream, slurm.nodes)
        with watcher(settings, redis_client, standby_stream) as standby:
            slurm.scontrol("update", "nodename=gpu-node-1", "state=drain", "reason=maintenance: fans")
            wait_for(redis_client, leader_stream, lambda e: e.kind == EventKind.UNHEALTHY, EVENT_WAIT_S)
            standby.had_its_chance()  # it polled for the lock three times since, and published nothing
            assert events(redis_client, standby_stream) == []
            # The leader stops and releases the lock: the standby takes over with a full resync.
            leader.stop()
            event = wait_for(redis_client, standby_stream, lambda e: e.kind == EventKind.UNHEALTHY, EVENT_WAIT_S)
            assert (event.node, event.state) == ("gpu-node-1", "DRAIN")


@per_backend
def test_sigterm_exits_cleanly_and_releases_the_lock(
    slurm: SlurmCluster, redis_client: redis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    env = dict(os.environ)
    env.update(
        REMEDIATION_BROKER__REDIS_URL=REDIS_URL,
        REMEDIATION_BROKER__KEY_PREFIX=redis_prefix,
        PYTHONPATH=str(ROOT),
        **{f"REMEDIATION_SLURM__{k.upper()}": str(v) for k, v in slurm.slurm_options().items()},
    )
    env.pop("REMEDIATION_CONFIG", None)
    proc = subprocess.Popen(  # noqa: S603 - fixed argv
        [sys.executable, "-m", "remediation.watchers.slurm.watcher"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        started(redis_client, redis_prefix, slurm.nodes)
        lock_key = f"{redis_prefix}:leader:slurm"
        assert redis_client.get(lock_key) is not None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    _, stderr = proc.communicate()
    assert "slurm watcher stopped" in stderr
    assert redis_client.get(lock_key) is None
    # And a lock held by nobody can be taken at once by the next watcher.
    assert make_lock(load_settings(broker={"redis_url": REDIS_URL, "key_prefix": redis_prefix}), "slurm",
                     client=redis_client).acquire_or_renew()


@per_backend
def test_failed_publish_is_retried_on_the_next_poll(
    slurm: SlurmCluster, redis_client: redis.Redis, redis_prefix: str
) -> None:
    """Redis down during a transition: the snapshot is kept, and the transition goes out later."""
    settings = settings_for(slurm, redis_prefix)
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    source = slurm_watcher.as_source(CliSlurm(settings.slurm))
    live = slurm_watcher.SlurmWatcher(settings, RedisEventBus(redis_client, redis_prefix, kick=None), source)
    live.step()  # first resync
    slurm.scontrol("update", "nodename=gpu-node-2", "state=fail", "reason=xid 48")
    live.bus = RedisEventBus(dead, redis_prefix, kick=None)
    with pytest.raises(slurm_watcher.BusUnavailable):
        live.step()
    live.bus = RedisEventBus(redis_client, redis_prefix, kick=None)
    assert live.step() >= 1
    event = wait_for(redis_client, redis_prefix, lambda e: e.kind == EventKind.UNHEALTHY, 1.0)
    assert (event.node, event.state, event.reason) == ("gpu-node-2", "FAIL", "xid 48")
