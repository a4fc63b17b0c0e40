"""Node -> Slurm node translation in the Kubernetes watcher: the pure map building and inverting, the
event it yields, and SlurmNames' freshness rule and rate limit (fake API client and clock)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from remediation.domain.events import EventKind, Source
from remediation.domain.flap import Change
from remediation.settings import KubeSettings, load_settings
from remediation.watchers.kube.mapping import POD_LIST_INTERVAL_S, SlurmNames, invert, pod_placement, to_event

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def pod(name: str, node: str | None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "slurm"}, "spec": {"nodeName": node} if node else {}}


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        ([], {}),
        ([pod("gpu-node-1", "gke-a")], {"gpu-node-1": "gke-a"}),
        (
            [pod("gpu-node-1", "gke-a"), pod("gpu-node-2", "gke-a")],
            {"gpu-node-1": "gke-a", "gpu-node-2": "gke-a"},
        ),
        ([pod("gpu-node-1", None), pod("gpu-node-2", "gke-b")], {"gpu-node-2": "gke-b"}),
        ([{"metadata": {}, "spec": {"nodeName": "gke-a"}}], {}),
    ],
    ids=["none", "one", "two-on-one-node", "unscheduled-runs-nowhere", "nameless-ignored"],
)
def test_pod_placement(pods: list[dict[str, Any]], expected: dict[str, str]) -> None:
    assert pod_placement(pods) == expected


@pytest.mark.parametrize(
    ("placement", "expected"),
    [
        ({}, {}),
        ({"gpu-node-1": "gke-a"}, {"gke-a": ("gpu-node-1",)}),
        ({"gpu-node-2": "gke-a", "gpu-node-1": "gke-a"}, {"gke-a": ("gpu-node-1", "gpu-node-2")}),
        (
            {"gpu-node-1": "gke-a", "gpu-node-2": "gke-b"},
            {"gke-a": ("gpu-node-1",), "gke-b": ("gpu-node-2",)},
        ),
    ],
    ids=["empty", "one", "several-on-one-node-sorted", "one-each"],
)
def test_invert(placement: dict[str, str], expected: dict[str, tuple[str, ...]]) -> None:
    assert invert(placement) == expected


def test_event_names_the_slurm_node_and_mentions_the_kubernetes_node() -> None:
    change = Change(
        "gke-a",
        EventKind.UNHEALTHY,
        "Ready=False",
        "KubeletNotReady: PLEG",
        f"k8s:gke-a:Ready=False:{T0}",
        T0,
    )
    one, two = to_event(change, "gpu-node-1"), to_event(change, "gpu-node-2")
    assert (one.source, one.node, one.kind, one.state) == (
        Source.KUBERNETES,
        "gpu-node-1",
        EventKind.UNHEALTHY,
        "Ready=False",
    )
    assert one.reason == "Node gke-a: KubeletNotReady: PLEG"
    assert one.dedupe_key == f"k8s:gpu-node-1@gke-a:Ready=False:{T0}"
    assert to_event(change, "gpu-node-1").dedupe_key == one.dedupe_key  # stable per condition instance
    assert two.dedupe_key != one.dedupe_key
    silent = Change("gke-a", EventKind.HEALTHY, "Ready=True", "", "k8s:gke-a:Ready=True:x", T0)
    assert to_event(silent, "gpu-node-1").reason == "Node gke-a: Ready=True"


class FakeCore:
    """Just list_namespaced_pod, answering raw JSON as the watcher asks (_preload_content=False)."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []
        self.calls: list[tuple[str, str]] = []
        self.fail: ApiException | None = None

    def list_namespaced_pod(self, namespace: str, *, label_selector: str, **_: Any) -> Any:
        self.calls.append((namespace, label_selector))
        if self.fail is not None:
            raise self.fail
        return SimpleNamespace(data=json.dumps({"items": self.pods}).encode())


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def names_for(kube: KubeSettings, core: FakeCore, clock: Clock) -> SlurmNames:
    return SlurmNames(kube, lambda: core, timeout_s=1.0, clock=clock)  # type: ignore[arg-type, return-value]


def kube_settings(**kube: Any) -> KubeSettings:
    return load_settings(kube=kube).kube


def test_pod_mapping_lists_only_for_changes_newer_than_its_map_and_rate_limits() -> None:
    core, clock = FakeCore(), Clock()
    core.pods = [pod("gpu-node-1", "gke-a")]
    names = names_for(kube_settings(mapping="pod", pod_namespace="sl"), core, clock)
    assert names.on("gke-a", since=clock.now) == ("gpu-node-1",)
    assert core.calls == [("sl", "app.kubernetes.io/component=slurmd")]
    assert names.on("gke-b", since=clock.now) == ()  # listed at or after since: a true answer
    assert len(core.calls) == 1
    core.pods = [pod("gpu-node-1", "gke-b")]  # re-created on another Node
    clock.now += 1
    assert names.on("gke-b", since=clock.now) is None  # the map predates the change; rate-limited
    assert len(core.calls) == 1
    clock.now += POD_LIST_INTERVAL_S
    assert names.on("gke-b", since=clock.now - POD_LIST_INTERVAL_S) == ("gpu-node-1",)
    assert names.on("gke-a", since=clock.now - POD_LIST_INTERVAL_S) == ()
    assert len(core.calls) == 2


def test_pod_mapping_api_errors_mean_wait_not_skip() -> None:
    core, clock = FakeCore(), Clock()
    core.pods = [pod("gpu-node-1", "gke-a")]
    core.fail = ApiException(status=503, reason="Service Unavailable")
    names = names_for(kube_settings(mapping="pod"), core, clock)
    assert names.on("gke-a", since=clock.now) is None
    core.fail = None
    assert names.on("gke-a", since=clock.now) is None  # not before the rate limit allows
    clock.now += POD_LIST_INTERVAL_S
    assert names.on("gke-a", since=clock.now - POD_LIST_INTERVAL_S) == ("gpu-node-1",)


def test_node_mapping_is_the_identity_without_any_request() -> None:
    core = FakeCore()
    names = names_for(kube_settings(mapping="node"), core, Clock())
    assert names.on("gpu-node-7", since=1e9) == ("gpu-node-7",)
    assert core.calls == []


def test_static_mapping_inverts_the_file_and_waits_while_it_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "map.yaml"
    core = FakeCore()
    names = names_for(kube_settings(mapping="static", static_map_file=str(path)), core, Clock())
    assert names.on("aks-0", since=0) is None  # no file yet: wait, do not drop
    path.write_text("gpu-node-1: aks-0\ngpu-node-2: aks-0\ngpu-node-3: aks-1\n")
    assert names.on("aks-0", since=0) == ("gpu-node-1", "gpu-node-2")
    assert names.on("aks-9", since=0) == ()
    assert core.calls == []
