"""kubectl as the oracle: a real client no one here wrote, against the local kube-apiserver.

The fake was written for the Python client's calls; these tests run the real ``kubectl`` (client-go:
TLS with the cluster CA from a generated kubeconfig, a bearer token, aggregated discovery, server-side
Tables, strategic-merge and merge patches, the Eviction API with its own 429 retries, chunked watches)
and check what happened through our own client, never through kubectl's output alone.

kubectl missing: skipped on a developer's machine, a failure in CI and in scripts/test.sh (``CI=true``), where a skipped
oracle would let the fake drift unnoticed.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from remediation.adapters.kube.adapter import make_kube
from remediation.settings import Settings
from remediation.simulator.kube.api import KubeAPIServer
from remediation.simulator.kube.discovery import RESOURCES
from tests.integration.kube.conftest import KUBECTL, Run
from tests.integration.kube.conftest import kubectl_env as _env
from tests.pace import within

SLURMD = {"app.kubernetes.io/component": "slurmd"}


def _wait(predicate: Callable[[], object], what: str, timeout: float = 30) -> None:
    deadline = within(timeout)
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _gpu_node(kube_api: KubeAPIServer, name: str) -> None:
    """A Node with what a Slurm-on-Kubernetes GPU node runs: the slurmd DaemonSet pod, a static
    (mirror) pod, and a training pod with an emptyDir for /dev/shm."""
    kube_api.add_node(name, provider_id=f"gce://proj/us-central1-a/{name}")
    kube_api.add_pod("slurm", f"slurmd-{name}", node_name=name, labels=SLURMD, owner_kind="DaemonSet",
                     owner_name="slurmd")  # fmt: skip
    kube_api.add_pod("kube-system", f"kube-proxy-{name}", node_name=name, mirror=True)
    kube_api.add_pod("training", f"llama-{name}", node_name=name, labels={"app": "llama"},
                     owner_kind="StatefulSet", owner_name="llama", empty_dir=True)  # fmt: skip


# ----------------------------------------------------------------------------------------- get


def test_get_nodes_prints_the_server_table_and_json_matches_our_client(
    kube_api: KubeAPIServer, core: client.CoreV1Api, kubectl: Run
) -> None:
    kube_api.add_node("gke-a3-0")
    kube_api.add_node("gke-a3-1", ready="False", unschedulable=True)
    lines = kubectl("get", "nodes").stdout.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["gke-a3-0"][1] == "Ready" and rows["gke-a3-1"][1] == "NotReady,SchedulingDisabled"
    assert rows["gke-a3-0"][4] == core.read_node("gke-a3-0").status.node_info.kubelet_version

    listed = json.loads(kubectl("get", "nodes", "-o", "json").stdout)
    ours = core.list_node()
    assert listed["kind"] == "List"
    assert {(n["metadata"]["name"], n["metadata"]["resourceVersion"], n["metadata"]["uid"]) for n in listed["items"]} == {
        (n.metadata.name, n.metadata.resource_version, n.metadata.uid) for n in ours.items
    }  # fmt: skip
    one = next(n for n in listed["items"] if n["metadata"]["name"] == "gke-a3-0")
    assert (
        one["status"]["capacity"]["nvidia.com/gpu"]
        == core.read_node("gke-a3-0").status.capacity["nvidia.com/gpu"]
    )


def test_client_go_retries_a_429_with_retry_after_on_its_own(kube_api: KubeAPIServer, kubectl: Run) -> None:
    kube_api.add_node("gke-a3-0")
    kube_api.fail_next(1, 429, retry_after=1, method="GET", path="/api/v1/nodes")
    kube_api.clear_requests()
    assert "gke-a3-0" in kubectl("get", "nodes").stdout
    answers = [r.status for r in kube_api.requests if r.path == "/api/v1/nodes"]
    assert answers == [429, 200]  # the same list, retried by client-go after Retry-After


def test_get_pods_all_namespaces_wide_shows_what_our_client_lists(
    kube_api: KubeAPIServer, core: client.CoreV1Api, kubectl: Run
) -> None:
    _gpu_node(kube_api, "gke-a3-0")
    _gpu_node(kube_api, "gke-a3-1")
    lines = kubectl("get", "pods", "-A", "-o", "wide").stdout.splitlines()
    header = lines[0].split()
    assert header[:6] == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert header[6:8] == ["IP", "NODE"]
    printed = {(c[0], c[1]): (c[3], c[6], c[7]) for c in (line.split() for line in lines[1:])}
    ours = {
        (p.metadata.namespace, p.metadata.name): (p.status.phase, p.status.pod_ip, p.spec.node_name)
        for p in core.list_pod_for_all_namespaces().items
    }
    assert printed == ours and len(ours) == 6


def test_describe_node_shows_capacity_conditions_lease_and_pods(
    kube_api: KubeAPIServer, kubectl: Run
) -> None:
    _gpu_node(kube_api, "gke-a3-0")
    out = kubectl("describe", "node", "gke-a3-0").stdout
    assert "ProviderID:                   gce://proj/us-central1-a/gke-a3-0" in out
    assert "HolderIdentity:  gke-a3-0" in out  # the kubelet's Lease in kube-node-lease
    assert "nvidia.com/gpu:     8" in out
    assert "Non-terminated Pods:          (3 in total)" in out
    for pod in ("slurmd-gke-a3-0", "kube-proxy-gke-a3-0", "llama-gke-a3-0"):
        assert pod in out
    ready = next(line for line in out.splitlines() if line.strip().startswith("Ready "))
    assert ready.split()[1] == "True"
    # describe also lists the Node's Events (field selectors on involvedObject): none here.
    assert any(r.path == "/api/v1/events" and r.status == 200 for r in kube_api.requests)


def test_get_pdb_and_events_show_what_our_client_reads(
    kube_api: KubeAPIServer, core: client.CoreV1Api, kubectl: Run
) -> None:
    _gpu_node(kube_api, "gke-a3-0")
    kube_api.add_pdb("training", "llama", "app=llama", min_available=1)
    kube_api.add_event("gke-a3-0", "Rebooted", "Node gke-a3-0 has been rebooted", type_="Warning")
    lines = kubectl("get", "pdb", "-A").stdout.splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "MIN", "AVAILABLE", "MAX", "UNAVAILABLE", "ALLOWED",
                                "DISRUPTIONS", "AGE"]  # fmt: skip
    pdb = client.PolicyV1Api(core.api_client).read_namespaced_pod_disruption_budget("llama", "training")
    assert lines[1].split()[:5] == ["training", "llama", "1", "N/A", str(pdb.status.disruptions_allowed)]
    assert pdb.status.disruptions_allowed == 0 and pdb.status.current_healthy == 1
    (event,) = core.list_event_for_all_namespaces().items
    printed = kubectl("get", "events", "-A").stdout.splitlines()[1].split()
    assert (
        printed[2:5]
        == [event.type, event.reason, "node/gke-a3-0"]
        == ["Warning", "Rebooted", "node/gke-a3-0"]
    )


# --------------------------------------------------------------------------------------- write


def test_label_and_annotate_reach_the_node(
    kube_api: KubeAPIServer, core: client.CoreV1Api, kubectl: Run
) -> None:
    kube_api.add_node("gke-a3-0")
    kubectl("label", "node", "gke-a3-0", "example.com/rack=r12")
    kubectl("annotate", "node", "gke-a3-0", "example.com/ticket=OPS-4411")
    meta = core.read_node("gke-a3-0").metadata
    assert meta.labels["example.com/rack"] == "r12" and meta.annotations["example.com/ticket"] == "OPS-4411"
    assert meta.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"  # the rest untouched
    refused = kubectl("label", "node", "gke-a3-0", "example.com/rack=r13", check=False)
    assert refused.returncode != 0 and "--overwrite" in refused.stderr  # kubectl's own guard
    kubectl("label", "node", "gke-a3-0", "example.com/rack-")
    assert "example.com/rack" not in core.read_node("gke-a3-0").metadata.labels
    patches = [r for r in kube_api.requests if r.method == "PATCH"]
    assert len(patches) == 3 and {r.content_type for r in patches} == {"application/merge-patch+json"}


def test_cordon_and_uncordon_and_our_adapter_leaves_a_humans_cordon(
    kube_api: KubeAPIServer, core: client.CoreV1Api, kubectl: Run, make_settings: Callable[..., Settings]
) -> None:
    kube_api.add_node("gke-a3-0")
    assert kubectl("cordon", "gke-a3-0").stdout.strip() == "node/gke-a3-0 cordoned"
    assert core.read_node("gke-a3-0").spec.unschedulable is True
    assert "Ready,SchedulingDisabled" in kubectl("get", "node", "gke-a3-0").stdout
    assert [r.content_type for r in kube_api.requests if r.method == "PATCH"] == [
        "application/strategic-merge-patch+json"
    ]
    adapter = make_kube(make_settings(kube={"mapping": "node"}))
    adapter.uncordon("gke-a3-0")  # kubectl's cordon carries no mark of ours: a human's, left alone
    assert core.read_node("gke-a3-0").spec.unschedulable is True
    kubectl("uncordon", "gke-a3-0")
    assert not core.read_node("gke-a3-0").spec.unschedulable


# --------------------------------------------------------------------------------------- drain


def test_drain_retries_a_pdb_429_then_evicts_once_the_budget_allows(
    kube_api: KubeAPIServer, core: client.CoreV1Api, kubeconfig: Path
) -> None:
    _gpu_node(kube_api, "gke-a3-0")
    kube_api.add_node("gke-a3-1")
    kube_api.add_pdb("training", "llama", "app=llama", min_available=1)
    assert KUBECTL is not None
    drain = subprocess.Popen(  # noqa: S603 - fixed argv
        [KUBECTL, "drain", "gke-a3-0", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(kubeconfig),
    )  # fmt: skip
    try:

        def refusals() -> int:
            return sum(1 for r in kube_api.requests if r.path.endswith("/eviction") and r.status == 429)

        _wait(lambda: refusals() >= 2, "kubectl to retry the eviction the budget refused", timeout=60)
        assert drain.poll() is None
        # A replica becomes Ready elsewhere: now the budget allows one disruption.
        kube_api.add_pod("training", "llama-spare", node_name="gke-a3-1", labels={"app": "llama"},
                         owner_kind="StatefulSet", owner_name="llama")  # fmt: skip
        out, err = drain.communicate(timeout=60)
    finally:
        if drain.poll() is None:
            drain.kill()
            drain.communicate()
    assert drain.returncode == 0, out + err
    assert "will retry after 5s): Cannot evict pod as it would violate the pod's disruption budget" in err
    assert "node/gke-a3-0 drained" in out
    left = {(p.metadata.namespace, p.metadata.name) for p in core.list_pod_for_all_namespaces(
        field_selector="spec.nodeName=gke-a3-0").items}  # fmt: skip
    assert left == {("slurm", "slurmd-gke-a3-0"), ("kube-system", "kube-proxy-gke-a3-0")}  # DaemonSet, mirror
    assert core.read_node("gke-a3-0").spec.unschedulable is True
    evictions = [r.status for r in kube_api.requests if r.path.endswith("/eviction")]
    assert evictions[-1] == 201 and set(evictions[:-1]) == {429}
    assert not [r for r in kube_api.requests if r.method == "DELETE"]  # evicted, never deleted


def test_drain_timeout_gives_up_and_leaves_the_pod(
    kube_api: KubeAPIServer, core: client.CoreV1Api, kubectl: Run
) -> None:
    _gpu_node(kube_api, "gke-a3-0")
    kube_api.add_pdb("training", "llama", "app=llama", min_available=1)
    done = kubectl("drain", "gke-a3-0", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=2s",
                   check=False)  # fmt: skip
    assert done.returncode != 0
    assert 'unable to drain node "gke-a3-0"' in done.stderr and "global timeout reached: 2s" in done.stderr
    assert core.read_namespaced_pod("llama-gke-a3-0", "training").metadata.deletion_timestamp is None
    assert core.read_node("gke-a3-0").spec.unschedulable is True  # kubectl leaves its cordon in place
    assert {r.status for r in kube_api.requests if r.path.endswith("/eviction")} == {429}


def test_drain_without_the_emptydir_flag_refuses_before_evicting(
    kube_api: KubeAPIServer, kubectl: Run
) -> None:
    _gpu_node(kube_api, "gke-a3-0")
    done = kubectl("drain", "gke-a3-0", "--ignore-daemonsets", "--timeout=10s", check=False)
    assert done.returncode != 0 and "cannot delete Pods with local storage" in done.stderr
    assert not [r for r in kube_api.requests if r.path.endswith("/eviction")]


# --------------------------------------------------------------------------------------- watch


class Watch:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.lines = proc, queue.Queue[str]()


@pytest.fixture
def watch_nodes(kubeconfig: Path) -> Iterator[Watch]:
    """``kubectl get nodes -w``, its output lines in a queue."""
    assert KUBECTL is not None
    # Leaving the block closes the pipe, once the pump is done with it.
    with subprocess.Popen(  # noqa: S603 - fixed argv
        [KUBECTL, "get", "nodes", "-w"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=_env(kubeconfig),
    ) as proc:  # fmt: skip
        watch = Watch(proc)

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                watch.lines.put(line.rstrip("\n"))

        pumping = threading.Thread(target=pump, daemon=True)
        pumping.start()
        yield watch
        proc.terminate()
        proc.wait(timeout=10)
        pumping.join(timeout=10)


def _next_line(
    lines: queue.Queue[str], predicate: Callable[[list[str]], bool], timeout: float = 20
) -> list[str]:
    deadline = within(timeout)
    while (left := deadline - time.monotonic()) > 0:
        try:
            cells = lines.get(timeout=left).split()
        except queue.Empty:
            break
        if predicate(cells):
            return cells
    raise AssertionError("kubectl printed no such line")


def test_get_watch_streams_a_condition_change_made_through_our_client(
    kube_api: KubeAPIServer, core: client.CoreV1Api, watch_nodes: Watch
) -> None:
    lines = watch_nodes.lines
    kube_api.add_node("gke-a3-0")
    _next_line(lines, lambda c: c[:2] == ["gke-a3-0", "Ready"])  # the initial list
    _wait(lambda: any(r.query.get("watch") == "true" for r in kube_api.requests), "kubectl's watch")
    core.patch_node_status(
        "gke-a3-0",
        {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}},
    )
    assert _next_line(lines, lambda c: c[:1] == ["gke-a3-0"])[1] == "NotReady"
    core.patch_node("gke-a3-0", {"spec": {"unschedulable": True}})
    assert _next_line(lines, lambda c: c[:1] == ["gke-a3-0"])[1] == "NotReady,SchedulingDisabled"


def test_get_watch_prints_410_expired_and_ends_where_our_client_relists(
    kube_api: KubeAPIServer, core: client.CoreV1Api, watch_nodes: Watch
) -> None:
    """kubectl get -w is no informer: a compacted history ends its watch with the Expired Status
    printed (the ERROR event's object is a Status, not a Table), as against a real server."""
    kube_api.add_node("gke-a3-0")
    _next_line(watch_nodes.lines, lambda c: c[:2] == ["gke-a3-0", "Ready"])
    _wait(lambda: any(r.query.get("watch") == "true" for r in kube_api.requests), "kubectl's watch")
    kube_api.set_condition("gke-a3-0", "Ready", "False")  # and the watch is streaming:
    _next_line(watch_nodes.lines, lambda c: c[:2] == ["gke-a3-0", "NotReady"])
    kube_api.compact()
    assert _next_line(watch_nodes.lines, lambda c: "Expired" in c)[:2] == ["Failure", "Expired"]
    watch_nodes.proc.wait(timeout=20)  # the stream closed after the ERROR event; kubectl is done
    listed = core.list_node()  # a relist works from the current resourceVersion
    assert [n.metadata.name for n in listed.items] == ["gke-a3-0"]
    assert int(listed.metadata.resource_version) == kube_api.resource_version


# ----------------------------------------------------------------------------------- discovery


def test_api_resources_lists_exactly_what_the_server_serves(kubectl: Run) -> None:
    lines = kubectl("api-resources", "-o", "wide").stdout.splitlines()
    assert lines[0].split()[:5] == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    printed: dict[str, list[str]] = {}
    for line in lines[1:]:
        cells = line.split()
        name = cells[0]
        resource = next(r for r in RESOURCES if r.name == name)
        printed[name] = cells
        assert resource.api_version in cells and resource.kind in cells
        assert ("true" if resource.namespaced else "false") in cells
        assert ",".join(resource.verbs) in cells  # the VERBS column (-o wide)
    assert set(printed) == {r.name for r in RESOURCES}
    assert kubectl("api-versions").stdout.split() == sorted(
        {r.api_version for r in RESOURCES}
    )  # fmt: skip


def test_get_nodes_in_chunks_lists_every_node_once_across_pages(
    kube_api: KubeAPIServer, core: client.CoreV1Api, kubectl: Run
) -> None:
    """client-go's pager as the oracle of ``limit`` and ``continue``: kubectl lists in chunks of 3,
    follows each page's continue token to the end, and sees every Node once, in both output forms."""
    names = [f"gke-a3-{i:02d}" for i in range(8)]
    for name in names:
        kube_api.add_node(name)
    kube_api.clear_requests()
    table_rows = kubectl("get", "nodes", "--chunk-size=3", "--no-headers").stdout.splitlines()
    assert [row.split()[0] for row in table_rows] == names
    pages = [r for r in kube_api.requests if r.path == "/api/v1/nodes"]
    assert [r.query.get("limit") for r in pages] == ["3", "3", "3"]
    assert [bool(r.query.get("continue")) for r in pages] == [False, True, True]

    listed = json.loads(kubectl("get", "nodes", "--chunk-size=3", "-o", "json").stdout)
    assert [n["metadata"]["name"] for n in listed["items"]] == names
    assert {n["metadata"]["name"] for n in listed["items"]} == {
        n.metadata.name for n in core.list_node().items
    }
