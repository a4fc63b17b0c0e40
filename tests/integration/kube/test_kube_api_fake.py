"""The local kube-apiserver answers the official client the way the real one does (docs/wire-protocols.md)."""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from remediation.simulator.kube.api import KubeAPIServer
from tests.integration.kube.conftest import core_for
from tests.pace import budget, within


def eviction(name: str, namespace: str) -> client.V1Eviction:
    return client.V1Eviction(
        api_version="policy/v1", kind="Eviction", metadata=client.V1ObjectMeta(name=name, namespace=namespace)
    )


def body(exc: ApiException) -> dict:
    return json.loads(exc.body)


@pytest.mark.parametrize("token", [None, "wrong"], ids=["no-token", "wrong-token"])
def test_requests_without_a_valid_bearer_token_get_401_status(
    kube_api: KubeAPIServer, token: str | None
) -> None:
    kube_api.add_node("n1")
    with pytest.raises(ApiException) as info:
        core_for(kube_api.url, token, kube_api.ca_file).list_node()
    assert info.value.status == 401
    assert body(info.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }


def test_list_and_get_nodes_carry_resource_versions(kube_api: KubeAPIServer, core: client.CoreV1Api) -> None:
    kube_api.add_node("n1", provider_id="gce://p/z/n1", boot_id="boot-1")
    kube_api.add_node("n2")
    listed = core.list_node()
    assert [n.metadata.name for n in listed.items] == ["n1", "n2"]
    assert int(listed.metadata.resource_version) == kube_api.resource_version
    node = core.read_node("n1")
    assert node.spec.provider_id == "gce://p/z/n1"
    assert node.status.node_info.boot_id == "boot-1"
    assert int(node.metadata.resource_version) < int(listed.metadata.resource_version)
    with pytest.raises(ApiException) as info:
        core.read_node("missing")
    assert info.value.status == 404 and body(info.value)["reason"] == "NotFound"


def test_strategic_cordon_patch_and_taints_list_is_replaced(
    kube_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    kube_api.add_node("n1", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    node = core.patch_node("n1", {"spec": {"unschedulable": True}})  # default: strategic merge
    assert node.spec.unschedulable is True and node.spec.taints[0].key == "nvidia.com/gpu"
    assert kube_api.requests[-1].content_type == "application/strategic-merge-patch+json"
    # spec.taints has no merge key: a strategic patch replaces the whole list (the trap).
    node = core.patch_node("n1", {"spec": {"taints": [{"key": "mine", "effect": "NoSchedule"}]}})
    assert [t.key for t in node.spec.taints] == ["mine"]
    # status.conditions merges on "type": patching one keeps the others.
    before = {c["type"] for c in kube_api.node("n1")["status"]["conditions"]}
    core.patch_node_status("n1", {"status": {"conditions": [{"type": "GpuHealthy", "status": "False"}]}})
    assert {c["type"] for c in kube_api.node("n1")["status"]["conditions"]} == before | {"GpuHealthy"}
    assert {"Ready", "MemoryPressure"} <= before


def test_merge_patch_null_deletes_and_lists_replace(kube_api: KubeAPIServer, core: client.CoreV1Api) -> None:
    kube_api.add_node("n1", annotations={"a": "1", "b": "2"})
    others = {k: v for k, v in kube_api.node("n1")["metadata"]["annotations"].items() if k not in ("a", "b")}
    node = core.patch_node(
        "n1", {"metadata": {"annotations": {"a": None}}}, _content_type="application/merge-patch+json"
    )
    assert node.metadata.annotations == {"b": "2", **others} and others  # the kubelet's stay


def test_json_patch_escapes_pointers_and_test_op_guards(
    kube_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    kube_api.add_node("n1")
    before = kube_api.node("n1")["metadata"]["annotations"]
    rv = core.read_node("n1").metadata.resource_version
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/metadata/annotations/example.io~1owner", "value": "me"},
    ]
    node = core.patch_node("n1", ops)
    assert kube_api.requests[-1].content_type == "application/json-patch+json"
    assert node.metadata.annotations == {**before, "example.io/owner": "me"}
    with pytest.raises(ApiException) as info:
        core.patch_node("n1", ops)  # rv moved on: the test op fails
    assert info.value.status == 422


def test_resource_version_in_a_patch_is_a_precondition(
    kube_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    kube_api.add_node("n1")
    stale = core.read_node("n1").metadata.resource_version
    kube_api.set_condition("n1", "Ready", "False")
    with pytest.raises(ApiException) as info:
        core.patch_node("n1", {"metadata": {"resourceVersion": stale}, "spec": {"unschedulable": True}})
    assert info.value.status == 409 and body(info.value)["reason"] == "Conflict"
    assert not kube_api.node("n1")["spec"].get("unschedulable")


def test_a_patch_that_changes_nothing_keeps_the_resource_version(
    kube_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    kube_api.add_node("n1", unschedulable=True)
    before = kube_api.resource_version
    core.patch_node("n1", {"spec": {"unschedulable": True}})
    assert kube_api.resource_version == before


def test_pod_field_and_label_selectors(kube_api: KubeAPIServer, core: client.CoreV1Api) -> None:
    kube_api.add_pod("slurm", "gpu-0", node_name="n1", labels={"app": "slurmd", "tier": "gpu"})
    kube_api.add_pod("slurm", "gpu-1", node_name="n2", labels={"app": "slurmd"})
    kube_api.add_pod("kube-system", "dcgm", node_name="n1", labels={"app": "dcgm"}, owner_kind="DaemonSet")
    kube_api.add_pod("batch", "done", node_name="n1", phase="Succeeded")

    def names(pods: client.V1PodList) -> list[str]:
        return sorted(p.metadata.name for p in pods.items)

    assert names(core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")) == [
        "dcgm",
        "done",
        "gpu-0",
    ]
    assert names(
        core.list_pod_for_all_namespaces(
            field_selector="spec.nodeName=n1,status.phase!=Succeeded,status.phase!=Failed"
        )
    ) == ["dcgm", "gpu-0"]
    assert names(core.list_namespaced_pod("slurm", field_selector="spec.nodeName=n1")) == ["gpu-0"]
    assert names(core.list_namespaced_pod("slurm", label_selector="app=slurmd,tier!=gpu")) == ["gpu-1"]
    assert names(core.list_pod_for_all_namespaces(label_selector="app in (dcgm, slurmd),tier")) == ["gpu-0"]
    assert names(core.list_pod_for_all_namespaces(label_selector="!app")) == ["done"]
    assert names(core.list_namespaced_pod("slurm", field_selector="metadata.name=gpu-1")) == ["gpu-1"]
    listed = core.list_pod_for_all_namespaces()
    assert listed.kind == "PodList" and int(listed.metadata.resource_version) == kube_api.resource_version
    with pytest.raises(ApiException) as info:
        core.list_pod_for_all_namespaces(field_selector="spec.bogus=x")
    assert info.value.status == 400 and "field label not supported: spec.bogus" in info.value.body


def test_eviction_201_429_with_budget_cause_and_404(kube_api: KubeAPIServer, core: client.CoreV1Api) -> None:
    kube_api.add_pod("web", "a", node_name="n1", labels={"app": "web"})
    kube_api.add_pod("web", "b", node_name="n2", labels={"app": "web"})
    kube_api.add_pdb("web", "web-pdb", "app=web", min_available=2)
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod_eviction("a", "web", eviction("a", "web"))
    status = body(info.value)
    assert info.value.status == 429 and status["reason"] == "TooManyRequests"
    assert status["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert "web-pdb needs 2 healthy pods and has 2 currently" in status["details"]["causes"][0]["message"]
    kube_api.add_pdb("web", "web-pdb", "app=web", min_available=1)  # the budget now allows one
    core.create_namespaced_pod_eviction("a", "web", eviction("a", "web"))
    assert kube_api.requests[-1].status == 201
    assert [p["metadata"]["name"] for p in kube_api.pods()] == ["b"]
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod_eviction("a", "web", eviction("a", "web"))
    assert info.value.status == 404


def test_eviction_with_grace_leaves_the_pod_terminating() -> None:
    with KubeAPIServer(token="t", evict_grace_s=0.3) as api:
        api.add_pod("ns", "p", node_name="n1")
        core_for(api.url, "t", api.ca_file).create_namespaced_pod_eviction("p", "ns", eviction("p", "ns"))
        assert "deletionTimestamp" in api.pods()[0]["metadata"]
        deadline = within(3)
        while api.pods() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert api.pods() == []


def test_watch_streams_changes_after_the_resource_version_with_bookmarks(
    kube_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    kube_api.add_node("n1")
    kube_api.add_node("n2")
    rv = core.list_node().metadata.resource_version
    # Changes made before the watch starts are replayed from ``rv`` in the store's order; no timer
    # decides their order on the stream.
    kube_api.set_condition("n1", "Ready", "False")
    kube_api.remove_node("n1")
    started = time.monotonic()
    events = []
    live_change_made = False
    for event in watch.Watch().stream(
        core.list_node,
        resource_version=rv,
        timeout_seconds=1,
        allow_watch_bookmarks=True,
        deserialize=False,
    ):
        events.append(event)
        if event["type"] == "BOOKMARK" and not live_change_made:
            # Barrier: a bookmark means the stream is established and idle, so a change made now must
            # arrive as the next event, after the replayed ones.
            kube_api.set_condition("n2", "Ready", "False")
            live_change_made = True
    assert 0.9 < time.monotonic() - started < budget(3)  # timeoutSeconds closes the stream
    types = [e["type"] for e in events]
    assert types[:3] == ["MODIFIED", "DELETED", "BOOKMARK"]
    changes = [e for e in events if e["type"] != "BOOKMARK"]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in changes] == [
        ("MODIFIED", "n1"), ("DELETED", "n1"), ("MODIFIED", "n2")
    ]
    assert types[types.index("BOOKMARK") + 1] == "MODIFIED"  # the live change, straight after the barrier
    assert events[0]["object"]["status"]["conditions"][0]["status"] == "False"
    assert changes[2]["object"]["status"]["conditions"][0]["status"] == "False"
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)
    request = [r for r in kube_api.requests if r.query.get("watch") == "true"][-1]
    assert request.query["resourceVersion"] == rv and request.query["allowWatchBookmarks"] == "true"


def test_watch_without_resource_version_starts_with_synthetic_added(
    kube_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    kube_api.add_node("n1")
    kube_api.add_node("n2")
    events = list(watch.Watch().stream(core.list_node, timeout_seconds=1))
    assert [(e["type"], e["object"].metadata.name) for e in events] == [("ADDED", "n1"), ("ADDED", "n2")]


def test_watch_from_a_compacted_resource_version_gets_410(
    kube_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    kube_api.add_node("n1")
    rv = core.list_node().metadata.resource_version
    kube_api.set_condition("n1", "Ready", "False")
    kube_api.compact()
    with pytest.raises(ApiException) as info:
        list(watch.Watch().stream(core.list_node, resource_version=rv, timeout_seconds=1))
    assert info.value.status == 410 and "Expired" in info.value.reason


def test_bounded_history_expires_old_resource_versions() -> None:
    with KubeAPIServer(token="t", history=5) as api:
        api.add_node("n1")
        old = str(api.resource_version)
        for i in range(10):
            api.set_condition("n1", "Ready", "False" if i % 2 else "True")
        core = core_for(api.url, "t", api.ca_file)
        with pytest.raises(ApiException) as info:
            list(watch.Watch().stream(core.list_node, resource_version=old, timeout_seconds=1))
        assert info.value.status == 410
        recent = str(api.resource_version - 3)
        events = list(watch.Watch().stream(core.list_node, resource_version=recent, timeout_seconds=1))
        assert len(events) == 3


@pytest.mark.parametrize("code", [429, 500, 503, 403], ids=["429", "500", "503", "403"])
def test_injected_faults_answer_with_status_and_retry_after(
    kube_api: KubeAPIServer, core: client.CoreV1Api, code: int
) -> None:
    kube_api.add_node("n1")
    kube_api.fail_next(1, code, retry_after=7, method="GET", path="/nodes/n1")
    with pytest.raises(ApiException) as info:
        core.read_node("n1")
    assert info.value.status == code and info.value.headers["Retry-After"] == "7"
    assert body(info.value)["code"] == code
    assert core.read_node("n1").metadata.name == "n1"  # only the next request failed


def test_request_log_records_method_path_and_status(kube_api: KubeAPIServer, core: client.CoreV1Api) -> None:
    kube_api.add_node("n1")
    core.read_node("n1")
    with pytest.raises(ApiException):
        core.delete_namespaced_pod("p", "ns")  # not served: the fake never deletes pods
    assert [(r.method, r.path, r.status) for r in kube_api.requests] == [
        ("GET", "/api/v1/nodes/n1", 200),
        ("DELETE", "/api/v1/namespaces/ns/pods/p", 405),
    ]
