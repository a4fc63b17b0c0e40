"""The Kubernetes watcher against the local kube-apiserver and a real Redis stream.

Most tests run with ``kube.mapping=node`` (Slurm node name = Node name) to isolate list+watch, flap
suppression and leadership; the ``mapping=pod`` and ``static`` tests at the end check the translation
of Node names into Slurm node names."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from kubernetes import client

from remediation.adapters.bus import RedisEventBus
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.settings import Settings
from remediation.simulator.kube.api import KubeAPIServer
from remediation.simulator.kube.objects import NodeState, gpu_node_object
from remediation.watchers.kube import watcher as kube_watcher
from remediation.watchers.kube.nodes import decode_page, slim
from remediation.watchers.kube.stream import Item, NodeStream
from remediation.watchers.runtime import Polls, Stopper
from tests.conftest import REDIS_URL
from tests.pace import budget, within

HOLD = 1.0
ROOT = Path(__file__).resolve().parents[3]


def wait_for(predicate: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = within(timeout)
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"condition not met within {timeout}s")


class Watcher:
    """One in-process watcher (run() in a thread) publishing to this test's Redis prefix."""

    def __init__(self, settings: Settings, bus: RedisEventBus, api: client.CoreV1Api) -> None:
        self.stopper = Stopper(install=False)
        self.polls = Polls()
        self.thread = threading.Thread(
            target=kube_watcher.run,
            args=(settings, self.stopper, bus),
            kwargs={"api": api, "polls": self.polls},
            daemon=True,
        )

    def had_its_chance(self, passes: int = 3, at: datetime | None = None, timeout: float = 10) -> None:
        """The barrier before asserting that nothing was published: ``passes`` more passes of the loop
        (and, with ``at``, one that decided at or after ``at`` on the watcher's clock)."""
        assert self.polls.advance(passes, timeout, at), f"the watcher made no {passes} passes in {timeout}s"

    def stop(self) -> None:
        self.stopper.stop()
        self.thread.join(timeout=5)
        assert not self.thread.is_alive(), "watcher did not stop within 5 s"


@pytest.fixture
def settings(make_settings: Callable[..., Settings], redis_prefix: str) -> Settings:
    return make_settings(
        broker={"key_prefix": redis_prefix, "redis_url": REDIS_URL},
        kube={
            "mapping": "node",
            "min_condition_s": HOLD,
            "resync_interval_s": 60,
            "watch_timeout_s": 5,
            "leader_ttl_s": 2,
        },
    )


@pytest.fixture
def start(
    settings: Settings, redis_client: redis.Redis, redis_prefix: str, core: client.CoreV1Api
) -> Iterator[Callable[..., Watcher]]:
    started: list[Watcher] = []

    def go(custom: Settings | None = None) -> Watcher:
        watcher = Watcher(custom or settings, RedisEventBus(redis_client, redis_prefix, kick=None), core)
        watcher.thread.start()
        started.append(watcher)
        return watcher

    yield go
    for watcher in started:
        watcher.stopper.stop()
    for watcher in started:
        watcher.thread.join(timeout=5)


def events(redis_client: redis.Redis, prefix: str) -> list[NodeEvent]:
    return [NodeEvent.parse(fields[b"e"]) for _, fields in redis_client.xrange(f"{prefix}:events:kube")]


def watching(kube_api: KubeAPIServer, count: int = 1) -> bool:
    return sum(1 for r in kube_api.requests if r.query.get("watch") == "true") >= count


def lists(kube_api: KubeAPIServer) -> int:
    return sum(1 for r in kube_api.requests if r.path == "/api/v1/nodes" and "watch" not in r.query)


def test_not_ready_held_for_the_minimum_is_published_exactly_once(
    kube_api: KubeAPIServer, start: Callable[..., Watcher], redis_client: redis.Redis, redis_prefix: str
) -> None:
    kube_api.add_node("n1")
    kube_api.add_node("n2")
    watcher = start()
    wait_for(lambda: watching(kube_api))
    changed = time.monotonic()
    node = kube_api.set_condition("n1", "Ready", "False", message="Kubelet stopped posting node status.")
    (event,) = wait_for(lambda: events(redis_client, redis_prefix), timeout=HOLD + 3)
    assert time.monotonic() - changed >= HOLD  # not before it held
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    transition = datetime.fromisoformat(ready["lastTransitionTime"].replace("Z", "+00:00"))
    assert (event.source, event.node, event.kind, event.state) == (
        Source.KUBERNETES,
        "n1",
        EventKind.UNHEALTHY,
        "Ready=False",
    )
    assert event.reason == "Node n1: Kubelet stopped posting node status."
    assert event.dedupe_key == f"k8s:n1@n1:Ready=False:{transition.isoformat()}"
    # Heartbeats keep modifying the Node; the held condition is not published again.
    for _ in range(3):
        kube_api.set_condition("n1", "Ready", "False", message="Kubelet stopped posting node status.")
        watcher.had_its_chance(passes=1)
    watcher.had_its_chance()
    assert len(events(redis_client, redis_prefix)) == 1


def test_a_flap_shorter_than_the_minimum_is_not_published(
    kube_api: KubeAPIServer, start: Callable[..., Watcher], redis_client: redis.Redis, redis_prefix: str
) -> None:
    kube_api.add_node("n1")
    kube_api.add_node("n2")
    watcher = start()
    wait_for(lambda: watching(kube_api))
    for _ in range(3):
        kube_api.set_condition("n1", "Ready", "False")
        last_bad = datetime.now(UTC)
        time.sleep(HOLD / 4)  # the flap's length: shorter than the hold
        kube_api.set_condition("n1", "Ready", "True")
    # Barrier: a sentinel condition on n2, later in the same watch stream, is published once it held, so
    # the watcher has handled every flap of n1 before it; and a pass decided after the last flap's
    # window ran out on the watcher's clock. A flap that was going to be published has been by then.
    kube_api.set_condition("n2", "Ready", "False")
    sentinel = wait_for(lambda: events(redis_client, redis_prefix), timeout=HOLD + 4)
    watcher.had_its_chance(passes=1, at=last_bad + timedelta(seconds=HOLD))
    assert [e.node for e in events(redis_client, redis_prefix)] == ["n2"], sentinel


def test_problem_condition_and_recovery_are_published(
    kube_api: KubeAPIServer, start: Callable[..., Watcher], redis_client: redis.Redis, redis_prefix: str
) -> None:
    kube_api.add_node("n1")
    start()
    wait_for(lambda: watching(kube_api))
    kube_api.set_condition("n1", "GpuXidError", "True", message="Xid 79: GPU has fallen off the bus")
    wait_for(lambda: events(redis_client, redis_prefix), timeout=HOLD + 3)
    kube_api.set_condition("n1", "GpuXidError", "False", message="no Xid errors")
    bad, good = wait_for(lambda: (e := events(redis_client, redis_prefix)) and len(e) == 2 and e)
    assert (bad.kind, bad.state, bad.reason) == (
        EventKind.UNHEALTHY,
        "GpuXidError=True",
        "Node n1: Xid 79: GPU has fallen off the bus",
    )
    assert (good.kind, good.state, good.node) == (EventKind.HEALTHY, "GpuXidError=False", "n1")
    assert good.dedupe_key != bad.dedupe_key


def test_410_mid_watch_relists_without_losing_the_transition(
    kube_api: KubeAPIServer, start: Callable[..., Watcher], redis_client: redis.Redis, redis_prefix: str
) -> None:
    kube_api.add_node("n1")
    start()
    wait_for(lambda: watching(kube_api))
    assert lists(kube_api) == 1
    # The transition and the expiry happen together: the open watch never delivers the change,
    # it gets 410 Expired instead, and only the relist can see Ready=False.
    with kube_api.store.lock:
        kube_api.set_condition("n1", "Ready", "False")
        kube_api.compact()
    wait_for(lambda: lists(kube_api) == 2)
    (event,) = wait_for(lambda: events(redis_client, redis_prefix), timeout=HOLD + 3)
    assert (event.node, event.state) == ("n1", "Ready=False")


def test_watch_resumes_from_the_last_resource_version_after_a_timeout(
    kube_api: KubeAPIServer,
    make_settings: Callable[..., Settings],
    redis_prefix: str,
    start: Callable[..., Watcher],
) -> None:
    kube_api.add_node("n1")
    start(
        make_settings(
            broker={"key_prefix": redis_prefix},
            kube={"mapping": "node", "watch_timeout_s": 1, "resync_interval_s": 60},
        )
    )
    wait_for(lambda: watching(kube_api, 1))
    kube_api.set_condition("n1", "Ready", "False")
    expected = str(kube_api.resource_version)
    wait_for(lambda: watching(kube_api, 2), timeout=4)
    watches = [r for r in kube_api.requests if r.query.get("watch") == "true"]
    assert watches[1].query["resourceVersion"] >= expected
    assert watches[1].query["timeoutSeconds"] == "1"
    assert lists(kube_api) == 1  # resumed, not relisted


def test_periodic_resync_relists_and_republishes_with_the_same_key(
    kube_api: KubeAPIServer,
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    redis_prefix: str,
    start: Callable[..., Watcher],
) -> None:
    old = (datetime.now(UTC) - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube_api.add_node("n1")
    kube_api.set_condition("n1", "Ready", "Unknown", message="node lease expired", last_transition=old)
    start(
        make_settings(
            broker={"key_prefix": redis_prefix},
            kube={"mapping": "node", "min_condition_s": 60, "resync_interval_s": 1},
        )
    )
    # Bad for ten minutes already: published at once despite the 60 s hold (a restart resumes).
    first = wait_for(lambda: events(redis_client, redis_prefix), timeout=2)
    wait_for(lambda: lists(kube_api) >= 3, timeout=4)
    republished = wait_for(lambda: (e := events(redis_client, redis_prefix)) and len(e) >= 2 and e)
    assert {e.dedupe_key for e in republished} == {first[0].dedupe_key}
    assert first[0].dedupe_key.endswith(old.replace("Z", "+00:00"))


def test_a_restarted_watcher_republishes_the_same_condition_instance(
    kube_api: KubeAPIServer, start: Callable[..., Watcher], redis_client: redis.Redis, redis_prefix: str
) -> None:
    kube_api.add_node("n1")
    first = start()
    wait_for(lambda: watching(kube_api))
    kube_api.set_condition("n1", "Ready", "False")
    (before,) = wait_for(lambda: events(redis_client, redis_prefix), timeout=HOLD + 3)
    first.stop()
    start()
    events_after = wait_for(
        lambda: (e := events(redis_client, redis_prefix)) and len(e) == 2 and e, timeout=HOLD + 4
    )
    assert events_after[1].dedupe_key == before.dedupe_key  # the ingest records it once


def test_only_the_leader_watches_and_publishes(
    kube_api: KubeAPIServer, start: Callable[..., Watcher], redis_client: redis.Redis, redis_prefix: str
) -> None:
    lock_key = f"{redis_prefix}:leader:kube"
    redis_client.set(lock_key, "another-watcher", px=60_000)
    kube_api.add_node("n1")
    kube_api.set_condition("n1", "Ready", "False")
    standby = start()
    standby.had_its_chance(passes=3)  # three tries for the lock, each refused
    assert kube_api.requests == [] and events(redis_client, redis_prefix) == []
    redis_client.delete(lock_key)  # the other leader is gone
    (event,) = wait_for(lambda: events(redis_client, redis_prefix), timeout=HOLD + 4)
    assert event.state == "Ready=False"
    assert redis_client.get(lock_key) not in (None, b"another-watcher")


def test_a_second_watcher_stands_by_while_the_first_leads(
    kube_api: KubeAPIServer, start: Callable[..., Watcher], redis_client: redis.Redis, redis_prefix: str
) -> None:
    kube_api.add_node("n1")
    leader = start()
    wait_for(lambda: watching(kube_api))
    standby = start()
    standby.had_its_chance(passes=1)  # it is running, and refused the lock
    kube_api.set_condition("n1", "Ready", "False")
    wait_for(lambda: events(redis_client, redis_prefix), timeout=HOLD + 3)
    standby.had_its_chance(passes=2)
    leader.had_its_chance(passes=2)
    assert len(events(redis_client, redis_prefix)) == 1 and lists(kube_api) == 1
    leader.stop()  # releases the lock; the standby takes over and relists
    wait_for(lambda: lists(kube_api) == 2, timeout=4)


def test_sigterm_stops_the_watcher_process_cleanly(
    kube_api: KubeAPIServer, redis_client: redis.Redis, redis_prefix: str
) -> None:
    old = (datetime.now(UTC) - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube_api.add_node("n1")
    kube_api.set_condition("n1", "Ready", "False", last_transition=old)
    env = {key: value for key, value in os.environ.items() if not key.startswith("REMEDIATION_")} | {
        "REMEDIATION_KUBE__HOST": kube_api.url,
        "REMEDIATION_KUBE__TOKEN": kube_api.token,
        "REMEDIATION_KUBE__CA_FILE": str(kube_api.ca_file),
        "REMEDIATION_KUBE__MIN_CONDITION_S": "0.5",
        "REMEDIATION_KUBE__MAPPING": "node",
        "REMEDIATION_BROKER__REDIS_URL": REDIS_URL,
        "REMEDIATION_BROKER__KEY_PREFIX": redis_prefix,
    }
    proc = subprocess.Popen(  # noqa: S603 - our own module, fixed argv
        [sys.executable, "-m", "remediation.watchers.kube.watcher"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        # Starting a Python process under the whole suite's load takes seconds: what is timed is the stop.
        (event,) = wait_for(lambda: events(redis_client, redis_prefix), timeout=45)
        assert (event.node, event.state) == ("n1", "Ready=False")
        assert redis_client.get(f"{redis_prefix}:leader:kube") is not None
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # Prompt: within seconds, not at the end of its open watch. Under six xdist workers on two cores
        # a clean exit took 3.6 s once, past an earlier 3 s bound.
        output, _ = proc.communicate(timeout=budget(10))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output.decode()
    assert time.monotonic() - started < budget(10)
    assert redis_client.get(f"{redis_prefix}:leader:kube") is None  # released, a standby need not wait
    assert b"kube watcher stopped" in output


# ------------------------------------------------------------- Node names -> Slurm node names

SLURMD = {"app.kubernetes.io/component": "slurmd"}


def slurmd_pod(kube_api: KubeAPIServer, name: str, node: str, namespace: str = "slurm") -> None:
    kube_api.add_pod(namespace, name, node_name=node, labels=SLURMD, owner_kind="StatefulSet")


def pod_lists(kube_api: KubeAPIServer) -> list[dict[str, str]]:
    return [r.query for r in kube_api.requests if r.path.endswith("/pods") and "watch" not in r.query]


@pytest.fixture
def pod_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"kube": settings.kube.model_copy(update={"mapping": "pod"})})


def test_pod_mapping_publishes_for_the_slurmd_pod_not_the_node(
    kube_api: KubeAPIServer,
    start: Callable[..., Watcher],
    pod_settings: Settings,
    redis_client: redis.Redis,
    redis_prefix: str,
) -> None:
    kube_api.add_node("gke-pool-abc-1")
    slurmd_pod(kube_api, "gpu-node-7", "gke-pool-abc-1")
    kube_api.add_pod("slurm", "slurm-exporter", node_name="gke-pool-abc-1")  # not slurmd: no label
    start(pod_settings)
    wait_for(lambda: watching(kube_api))
    assert pod_lists(kube_api) == []  # a healthy cluster costs no pod requests
    node = kube_api.set_condition(
        "gke-pool-abc-1", "Ready", "False", reason="KubeletNotReady", message="PLEG is not healthy"
    )
    (event,) = wait_for(lambda: events(redis_client, redis_prefix), timeout=HOLD + 3)
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    transition = datetime.fromisoformat(ready["lastTransitionTime"].replace("Z", "+00:00")).isoformat()
    assert (event.node, event.kind, event.state) == ("gpu-node-7", EventKind.UNHEALTHY, "Ready=False")
    assert event.reason == "Node gke-pool-abc-1: KubeletNotReady: PLEG is not healthy"
    assert event.dedupe_key == f"k8s:gpu-node-7@gke-pool-abc-1:Ready=False:{transition}"
    assert pod_lists(kube_api) == [{"labelSelector": "app.kubernetes.io/component=slurmd"}]
    assert all(r.path == "/api/v1/namespaces/slurm/pods" for r in kube_api.requests if "pods" in r.path)


def test_pod_mapping_skips_a_node_that_hosts_no_slurmd_pod(
    kube_api: KubeAPIServer,
    start: Callable[..., Watcher],
    pod_settings: Settings,
    redis_client: redis.Redis,
    redis_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube_api.add_node("system-pool-1")
    kube_api.add_node("gpu-1")
    kube_api.add_pod("kube-system", "gpu-node-9", node_name="system-pool-1", labels=SLURMD)  # other namespace
    slurmd_pod(kube_api, "gpu-node-1", "gpu-1")
    caplog.set_level("INFO", logger="remediation.watchers.kube.watcher")
    watcher = start(pod_settings)
    wait_for(lambda: watching(kube_api))
    kube_api.set_condition("system-pool-1", "Ready", "False")
    wait_for(lambda: "Node system-pool-1 hosts no Slurm node" in caplog.text, timeout=HOLD + 3)
    kube_api.set_condition("system-pool-1", "KernelDeadlock", "True")
    kube_api.set_condition("gpu-1", "Ready", "False")  # published: the watcher is not just slow
    (event,) = wait_for(lambda: events(redis_client, redis_prefix), timeout=HOLD + 4)
    watcher.had_its_chance()
    assert event.node == "gpu-node-1" and len(events(redis_client, redis_prefix)) == 1
    assert caplog.text.count("Node system-pool-1 hosts no Slurm node") == 1  # once per Node


def test_pod_mapping_publishes_once_per_slurm_node_on_the_node(
    kube_api: KubeAPIServer,
    start: Callable[..., Watcher],
    pod_settings: Settings,
    redis_client: redis.Redis,
    redis_prefix: str,
) -> None:
    kube_api.add_node("big-1")
    slurmd_pod(kube_api, "gpu-node-1", "big-1")
    slurmd_pod(kube_api, "gpu-node-2", "big-1")
    start(pod_settings)
    wait_for(lambda: watching(kube_api))
    kube_api.set_condition("big-1", "GpuXidError", "True", message="Xid 79")
    found = wait_for(
        lambda: (e := events(redis_client, redis_prefix)) and len(e) == 2 and e, timeout=HOLD + 3
    )
    assert sorted(e.node for e in found) == ["gpu-node-1", "gpu-node-2"]
    assert {e.reason for e in found} == {"Node big-1: Xid 79"}
    assert len({e.dedupe_key for e in found}) == 2
    kube_api.set_condition("big-1", "GpuXidError", "False")
    healed = wait_for(lambda: (e := events(redis_client, redis_prefix)) and len(e) == 4 and e[2:])
    assert sorted((e.node, e.kind) for e in healed) == [
        ("gpu-node-1", EventKind.HEALTHY),
        ("gpu-node-2", EventKind.HEALTHY),
    ]


def test_pod_mapping_follows_a_slurmd_pod_recreated_on_another_node(
    kube_api: KubeAPIServer,
    start: Callable[..., Watcher],
    pod_settings: Settings,
    redis_client: redis.Redis,
    redis_prefix: str,
) -> None:
    for name in ("node-a", "node-b", "node-c"):
        kube_api.add_node(name)
    slurmd_pod(kube_api, "gpu-node-1", "node-a")
    slurmd_pod(kube_api, "gpu-node-3", "node-c")
    watcher = start(pod_settings)
    wait_for(lambda: watching(kube_api))
    kube_api.set_condition("node-c", "Ready", "False")  # the watcher now holds a map: gpu-node-1 on node-a
    wait_for(lambda: events(redis_client, redis_prefix), timeout=HOLD + 3)
    assert len(pod_lists(kube_api)) == 1
    kube_api.remove_pod("slurm", "gpu-node-1")  # the StatefulSet re-creates it elsewhere
    slurmd_pod(kube_api, "gpu-node-1", "node-b")
    kube_api.set_condition("node-a", "Ready", "False")  # hosts nothing any more
    kube_api.set_condition("node-b", "Ready", "False")
    found = wait_for(
        lambda: (e := events(redis_client, redis_prefix)) and len(e) >= 2 and e, timeout=HOLD + 4
    )
    watcher.had_its_chance()
    assert [(e.node, e.reason) for e in events(redis_client, redis_prefix)][1:] == [
        ("gpu-node-1", "Node node-b: Ready=False")
    ]
    assert found[0].node == "gpu-node-3"
    assert len(pod_lists(kube_api)) == 2


def test_static_mapping_inverts_the_mapping_file(
    kube_api: KubeAPIServer,
    start: Callable[..., Watcher],
    settings: Settings,
    redis_client: redis.Redis,
    redis_prefix: str,
    tmp_path: Path,
) -> None:
    mapping = tmp_path / "map.yaml"
    mapping.write_text("gpu-node-1: aks-gpu-0\ngpu-node-2: aks-gpu-0\ngpu-node-3: aks-gpu-1\n")
    kube = settings.kube.model_copy(update={"mapping": "static", "static_map_file": str(mapping)})
    for name in ("aks-gpu-0", "aks-gpu-1", "aks-system-0"):
        kube_api.add_node(name)
    watcher = start(settings.model_copy(update={"kube": kube}))
    wait_for(lambda: watching(kube_api))
    kube_api.set_condition("aks-system-0", "Ready", "False")  # not in the file: not ours
    kube_api.set_condition("aks-gpu-0", "Ready", "Unknown")
    found = wait_for(
        lambda: (e := events(redis_client, redis_prefix)) and len(e) == 2 and e, timeout=HOLD + 3
    )
    watcher.had_its_chance()
    assert len(events(redis_client, redis_prefix)) == 2
    assert sorted((e.node, e.state) for e in found) == [
        ("gpu-node-1", "Ready=Unknown"),
        ("gpu-node-2", "Ready=Unknown"),
    ]
    assert not any("pods" in r.path for r in kube_api.requests)


def test_node_mapping_publishes_under_the_node_name(
    kube_api: KubeAPIServer,
    start: Callable[..., Watcher],
    settings: Settings,
    redis_client: redis.Redis,
    redis_prefix: str,
) -> None:
    assert settings.kube.mapping == "node"
    kube_api.add_node("gpu-node-5")
    start()
    wait_for(lambda: watching(kube_api))
    kube_api.set_condition("gpu-node-5", "Ready", "False")
    (event,) = wait_for(lambda: events(redis_client, redis_prefix), timeout=HOLD + 3)
    assert (event.node, event.reason) == ("gpu-node-5", "Node gpu-node-5: Ready=False")
    assert not any("pods" in r.path for r in kube_api.requests)


def paged(make_settings: Callable[..., Settings], redis_prefix: str) -> Settings:
    return make_settings(
        broker={"key_prefix": redis_prefix, "redis_url": REDIS_URL},
        kube={"mapping": "node", "min_condition_s": 0, "resync_interval_s": 60, "list_page_size": 2},
    )


def node_lists(kube_api: KubeAPIServer) -> list[tuple[str | None, bool, int]]:
    """(limit, has a continue token, status) of each Node list request."""
    return [
        (r.query.get("limit"), bool(r.query.get("continue")), r.status)
        for r in kube_api.requests
        if r.path == "/api/v1/nodes" and "watch" not in r.query
    ]


def test_a_relist_reads_pages_and_finds_a_bad_node_on_the_last(
    kube_api: KubeAPIServer,
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    redis_prefix: str,
    start: Callable[..., Watcher],
) -> None:
    for i in range(5):
        kube_api.add_node(f"n{i}", ready="False" if i == 4 else "True")
    start(paged(make_settings, redis_prefix))
    (event,) = wait_for(lambda: events(redis_client, redis_prefix), timeout=5)
    assert (event.node, event.kind, event.state) == ("n4", EventKind.UNHEALTHY, "Ready=False")
    assert node_lists(kube_api) == [("2", False, 200), ("2", True, 200), ("2", True, 200)]
    # The watch starts after the event is published: wait for its request rather than race it.
    watch = wait_for(lambda: next((r for r in kube_api.requests if r.query.get("watch") == "true"), None),
                     timeout=5)
    assert watch.query["resourceVersion"] == str(kube_api.resource_version)  # the pages' one snapshot


def test_a_continue_expired_mid_relist_starts_the_list_again(
    kube_api: KubeAPIServer,
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    redis_prefix: str,
    start: Callable[..., Watcher],
) -> None:
    for i in range(5):
        kube_api.add_node(f"n{i}")
    hold = kube_api.delay_next(1, 10, method="GET", path="/api/v1/nodes")
    start(paged(make_settings, redis_prefix))
    assert hold.held.wait(budget(10)), "the first page was never asked for"
    kube_api.set_condition("n4", "Ready", "False")  # after the first page's snapshot
    kube_api.compact()
    hold.release.set()
    (event,) = wait_for(lambda: events(redis_client, redis_prefix), timeout=5)
    assert (event.node, event.state) == ("n4", "Ready=False")
    assert node_lists(kube_api) == [
        ("2", False, 200), ("2", True, 410), ("2", False, 200), ("2", True, 200), ("2", True, 200)
    ]  # fmt: skip


def test_a_full_queue_holds_the_stream_back_and_loses_nothing(
    kube_api: KubeAPIServer, make_settings: Callable[..., Settings], core: client.CoreV1Api
) -> None:
    """Back-pressure: with room for two items and nobody reading, the stream thread waits on the queue
    instead of buffering; once read, every change arrives, in order; stop() ends a waiting thread."""
    kube_api.add_node("n1")
    settings = make_settings(kube={"mapping": "node", "resync_interval_s": 60, "queue_max_items": 2})
    items: queue.Queue[Item] = queue.Queue(maxsize=settings.kube.queue_max_items)
    stream = NodeStream(core, settings, items)
    stream.start()
    try:
        wait_for(lambda: watching(kube_api))
        for status in ("False", "True", "False", "True", "False"):
            kube_api.set_condition("n1", "Ready", status)
        wait_for(items.full)
        seen, ready = [], []
        while len(seen) < 6:
            kind, payload = items.get(timeout=budget(5))
            seen.append(kind)
            if kind == "MODIFIED":
                ready.append({c["type"]: c["status"] for c in payload["status"]["conditions"]}["Ready"])
        assert seen == ["RELIST", *["MODIFIED"] * 5]
        assert ready == ["False", "True", "False", "True", "False"]
        for status in ("True", "False", "True"):
            kube_api.set_condition("n1", "Ready", status)
        wait_for(items.full)  # the stream now waits to queue the third
    finally:
        stream.stop()
        stream.join(timeout=5)
    assert not stream.is_alive()


def test_a_relisted_node_keeps_only_what_the_watcher_reads() -> None:
    state = NodeState(
        ready="True", provider_id="gce://p/z/n1", boot_id="b1",
        labels={"topology.kubernetes.io/zone": "z1", "other": "x"},
    )  # fmt: skip
    node = gpu_node_object("n1", state, now="2026-11-26T00:00:00Z")
    kept = slim(node, ["topology.kubernetes.io/zone", "absent"])
    assert kept["metadata"] == {
        "name": "n1", "resourceVersion": node["metadata"].get("resourceVersion", ""),
        "labels": {"topology.kubernetes.io/zone": "z1"},
    }  # fmt: skip
    assert kept["status"]["conditions"] == [
        {k: c[k] for k in ("type", "status", "reason", "message", "lastTransitionTime") if k in c}
        for c in node["status"]["conditions"]
    ]
    assert len(json.dumps(kept)) * 5 < len(json.dumps(node))
    listed = {"kind": "NodeList", "metadata": {"resourceVersion": "7", "continue": "t"}, "items": [node]}
    assert decode_page(json.dumps(listed).encode(), ["topology.kubernetes.io/zone", "absent"]) == (
        [kept],
        "7",
        "t",
    )
