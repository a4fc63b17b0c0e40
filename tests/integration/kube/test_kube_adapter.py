"""KubeAdapter against the local kube-apiserver through the official client: ownership, taints,
PDB-safe eviction, error translation and the Slurm node -> Node mapping strategies."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from remediation.adapters.kube.adapter import KubeAdapter, make_kube
from remediation.domain.providerid import InvalidProviderID, parse_provider_id
from remediation.ports.cluster import KubeNodes
from remediation.ports.errors import (
    ConfigError,
    CredentialError,
    NotFound,
    PermanentError,
    Scope,
    TransientError,
    UnknownNode,
)
from remediation.settings import Settings, SettingsError
from remediation.simulator.kube.api import KubeAPIServer
from tests.pace import budget

OURS = "remediation.gpu.io/cordoned-by"
TAINT = "remediation.gpu.io/quarantined"


@pytest.fixture
def adapter(kube_api: KubeAPIServer, make_settings: Callable[..., Settings]) -> KubeAdapter:
    settings = make_settings(kube={"evict_backoff_s": 3.0, "mapping": "node"})
    kube = make_kube(settings)
    assert isinstance(kube, KubeAdapter) and isinstance(kube, KubeNodes)
    return kube


def test_cordon_marks_ours_and_uncordon_lifts_only_ours(
    kube_api: KubeAPIServer, adapter: KubeAdapter
) -> None:
    kube_api.add_node("n1", annotations={"team": "ml"})
    adapter.cordon("n1", "remediation: xid 79")
    node = kube_api.node("n1")
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["annotations"][OURS] == "remediation"
    assert node["metadata"]["annotations"]["remediation.gpu.io/cordon-reason"] == "remediation: xid 79"
    assert node["metadata"]["annotations"]["team"] == "ml"
    state = adapter.get("n1")
    assert state.unschedulable and state.cordoned_by_us

    rv = kube_api.resource_version
    adapter.cordon("n1", "again")  # idempotent: no second write
    assert kube_api.resource_version == rv

    assert adapter.uncordon("n1") is True
    node = kube_api.node("n1")
    assert node["spec"]["unschedulable"] is False and OURS not in node["metadata"]["annotations"]
    assert adapter.uncordon("n1") is False  # nothing of ours left


def test_a_human_cordon_is_never_claimed_nor_undone(kube_api: KubeAPIServer, adapter: KubeAdapter) -> None:
    kube_api.add_node("n1", unschedulable=True)
    adapter.cordon("n1", "remediation: ecc")
    node = kube_api.node("n1")
    assert OURS not in node["metadata"]["annotations"]
    assert not adapter.get("n1").cordoned_by_us
    assert adapter.uncordon("n1") is False
    assert kube_api.node("n1")["spec"]["unschedulable"] is True
    assert [r.method for r in kube_api.requests].count("PATCH") == 0


def test_cordon_answers_whose_it_is_from_one_read_and_one_write(
    kube_api: KubeAPIServer, adapter: KubeAdapter
) -> None:
    """The patch's answer is the Node as written: no read after it (a mass failure cordons hundreds
    of Nodes at once, and every round trip counts)."""
    kube_api.add_node("n1")
    kube_api.add_node("n2", unschedulable=True)
    kube_api.clear_requests()
    ours = adapter.cordon("n1", "remediation: xid 79")
    assert [r.method for r in kube_api.requests] == ["GET", "PATCH"]
    assert ours.unschedulable and ours.cordoned_by_us and ours.boot_id == adapter.get("n1").boot_id
    kube_api.clear_requests()
    theirs = adapter.cordon("n2", "remediation: xid 79")
    assert [r.method for r in kube_api.requests] == ["GET"]
    assert theirs.unschedulable and not theirs.cordoned_by_us
    assert adapter.cordon("n1", "again").cordoned_by_us  # a second delivery: still ours, not a human's


def test_a_human_uncordon_clears_our_mark_and_reports_nothing_lifted(
    kube_api: KubeAPIServer, adapter: KubeAdapter
) -> None:
    kube_api.add_node("n1")
    adapter.cordon("n1", "remediation: x")
    kube_api.mutate_node("n1", lambda n: n["spec"].__setitem__("unschedulable", False))  # kubectl uncordon
    assert adapter.get("n1").cordoned_by_us is False
    assert adapter.uncordon("n1") is False
    assert OURS not in kube_api.node("n1")["metadata"]["annotations"]
    kube_api.mutate_node("n1", lambda n: n["spec"].__setitem__("unschedulable", True))  # human re-cordons
    assert adapter.get("n1").cordoned_by_us is False and adapter.uncordon("n1") is False


def test_cordon_racing_a_human_does_not_claim_their_cordon(
    kube_api: KubeAPIServer, adapter: KubeAdapter
) -> None:
    """The human cordons between our read and our write: our patch's resourceVersion precondition
    fails (409), we re-read, see their cordon and leave it unmarked."""
    kube_api.add_node("n1")
    real_read = adapter.api.read_node

    def read_then_human_cordons(name: str, **kw: object) -> object:
        answer = real_read(name, **kw)
        if not kube_api.node(name)["spec"].get("unschedulable"):
            kube_api.mutate_node(name, lambda n: n["spec"].__setitem__("unschedulable", True))
        return answer

    adapter.api.read_node = read_then_human_cordons  # type: ignore[method-assign]
    adapter.cordon("n1", "remediation: x")
    assert [r.status for r in kube_api.requests if r.method == "PATCH"] == [409]
    assert OURS not in kube_api.node("n1")["metadata"]["annotations"]


def test_quarantine_taint_round_trip_preserves_other_taints(
    kube_api: KubeAPIServer, adapter: KubeAdapter
) -> None:
    gpu = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    kube_api.add_node("n1", taints=[gpu])
    adapter.set_quarantine_taint("n1", True)
    adapter.set_quarantine_taint("n1", True)  # idempotent
    taints = kube_api.node("n1")["spec"]["taints"]
    assert taints == [gpu, {"key": TAINT, "value": "remediation", "effect": "NoSchedule"}]
    assert adapter.get("n1").quarantine_tainted
    patches = [r for r in kube_api.requests if r.method == "PATCH"]
    assert len(patches) == 1 and patches[0].content_type == "application/json-patch+json"
    assert patches[0].body[0]["op"] == "test"  # guarded by the resourceVersion it read

    adapter.set_quarantine_taint("n1", False)
    assert kube_api.node("n1")["spec"]["taints"] == [gpu]
    assert not adapter.get("n1").quarantine_tainted


def test_taint_write_racing_another_controller_keeps_its_taint(
    kube_api: KubeAPIServer, adapter: KubeAdapter
) -> None:
    kube_api.add_node("n1")
    real_read = adapter.api.read_node
    other = {"key": "example.com/other", "effect": "NoExecute"}

    def read_then_other_taints(name: str, **kw: object) -> object:
        node = real_read(name, **kw)
        if not kube_api.node(name)["spec"].get("taints"):
            kube_api.mutate_node(name, lambda n: n["spec"].__setitem__("taints", [other]))
        return node

    adapter.api.read_node = read_then_other_taints  # type: ignore[method-assign]
    adapter.set_quarantine_taint("n1", True)
    assert [r.status for r in kube_api.requests if r.method == "PATCH"] == [422, 200]
    assert [t["key"] for t in kube_api.node("n1")["spec"]["taints"]] == ["example.com/other", TAINT]


def test_get_reads_ready_problem_conditions_boot_id_and_provider_id(
    kube_api: KubeAPIServer, adapter: KubeAdapter
) -> None:
    kube_api.add_node("n1", provider_id="gce://proj/us-central1-a/n1", boot_id="boot-a")
    kube_api.set_condition("n1", "Ready", "False", message="kubelet stopped posting")
    kube_api.set_condition("n1", "GpuXidError", "True")
    kube_api.set_condition("n1", "MemoryPressure", "False")
    node = adapter.get("n1")
    assert (node.ready, node.boot_id, node.provider_id) == ("False", "boot-a", "gce://proj/us-central1-a/n1")
    # Configured types only: the Node's node-problem-detector KernelDeadlock=False is one, its
    # MemoryPressure, DiskPressure, ReadonlyFilesystem... are not.
    assert node.conditions == {"Ready": "False", "GpuXidError": "True", "KernelDeadlock": "False"}
    # What each says, as the watcher reads it: verify tells a new fault from an application's XID by it.
    assert node.messages["Ready"] == "kubelet stopped posting" and set(node.messages) == set(node.conditions)
    new_boot = kube_api.bump_boot_id("n1")
    assert adapter.get("n1").boot_id == new_boot != "boot-a"
    assert parse_provider_id(node.provider_id).name == "n1"


@pytest.mark.parametrize("provider_id", ["", "kind://docker/kind/n1"], ids=["missing", "unsupported"])
def test_unparseable_provider_id_is_a_permanent_error_not_a_crash(
    kube_api: KubeAPIServer, adapter: KubeAdapter, provider_id: str
) -> None:
    kube_api.add_node("n1", provider_id=provider_id)
    node = adapter.get("n1")  # reading the Node works
    assert node.provider_id == provider_id
    with pytest.raises(InvalidProviderID):
        parse_provider_id(node.provider_id)


def test_eviction_skips_daemonset_mirror_finished_and_terminating_pods(
    kube_api: KubeAPIServer, adapter: KubeAdapter
) -> None:
    kube_api.add_pod("ml", "trainer", node_name="n1")
    kube_api.add_pod("kube-system", "dcgm-exporter", node_name="n1", owner_kind="DaemonSet")
    kube_api.add_pod("kube-system", "kube-proxy-n1", node_name="n1", mirror=True)
    kube_api.add_pod("ml", "leaving", node_name="n1", terminating=True)
    kube_api.add_pod("ml", "finished", node_name="n1", phase="Succeeded")
    kube_api.add_pod("ml", "elsewhere", node_name="n2")
    kube_api.add_pod("ml", "owned-by-rs", node_name="n1", owner_kind="ReplicaSet")

    progress = adapter.evict_pods("n1")
    assert progress.remaining == 3 and progress.blocked == () and progress.retry_after is None
    evicted = sorted(r.path.split("/")[-2] for r in kube_api.requests if r.path.endswith("/eviction"))
    assert evicted == ["owned-by-rs", "trainer"]
    assert all(r.body["apiVersion"] == "policy/v1" for r in kube_api.requests if r.method == "POST")
    left = {p["metadata"]["name"] for p in kube_api.pods()}
    assert left == {"dcgm-exporter", "kube-proxy-n1", "leaving", "finished", "elsewhere"}

    kube_api.remove_pod("ml", "leaving")
    assert adapter.evict_pods("n1").done  # only DaemonSet and mirror pods remain


def test_with_workload_namespaces_the_pods_are_listed_and_evicted_there_only(
    kube_api: KubeAPIServer, make_settings: Callable[..., Settings]
) -> None:
    """kube.workload_namespaces: one namespaced list per namespace (what a Role there grants), never
    the cluster-wide pod list; a pod in another namespace stays on the cordoned Node."""
    kube_api.add_node("n1")
    kube_api.add_pod("ml", "trainer", node_name="n1")
    kube_api.add_pod("slurm", "batch-helper", node_name="n1")
    kube_api.add_pod("team-x", "notebook", node_name="n1")
    adapter = make_kube(make_settings(kube={"workload_namespaces": ["ml", "slurm"]}))
    progress = adapter.evict_pods("n1")
    assert progress.remaining == 2
    evicted = sorted(r.path.split("/")[-2] for r in kube_api.requests if r.path.endswith("/eviction"))
    assert evicted == ["batch-helper", "trainer"]
    lists = [r.path for r in kube_api.requests if r.method == "GET" and r.path.endswith("/pods")]
    assert "/api/v1/pods" not in lists  # the slurm list is also the slurmd pods' (kube.pod_namespace)
    assert set(lists) == {"/api/v1/namespaces/ml/pods", "/api/v1/namespaces/slurm/pods"}
    assert {p["metadata"]["name"] for p in kube_api.pods()} == {"notebook"}


def test_pdb_blocks_with_429_then_eviction_succeeds_once_the_budget_allows(
    kube_api: KubeAPIServer, adapter: KubeAdapter
) -> None:
    kube_api.add_pod("ml", "a", node_name="n1", labels={"app": "ps"})
    kube_api.add_pod("ml", "b", node_name="n2", labels={"app": "ps"})
    kube_api.add_pdb("ml", "ps", "app=ps", min_available=2)

    progress = adapter.evict_pods("n1")
    assert progress.blocked == ("ml/a",) and progress.remaining == 1
    assert progress.retry_after == 3.0  # no Retry-After from the server: our configured backoff
    assert kube_api.requests[-1].status == 429 and len(kube_api.pods()) == 2

    kube_api.add_pod("ml", "c", node_name="n3", labels={"app": "ps"})  # a replacement is up
    assert adapter.evict_pods("n1").blocked == ()
    assert adapter.evict_pods("n1").done
    assert not any(r.method == "DELETE" for r in kube_api.requests)  # never force-deleted


def test_pdb_429_honours_the_servers_retry_after(kube_api: KubeAPIServer, adapter: KubeAdapter) -> None:
    kube_api.add_pod("ml", "a", node_name="n1")
    kube_api.fail_next(1, 429, retry_after=11, path="/eviction")
    # An injected 429 has no DisruptionBudget cause: that is API throttling, a transient error.
    with pytest.raises(TransientError) as info:
        adapter.evict_pods("n1")
    assert info.value.retry_after == 11 and info.value.status == 429


def test_eviction_404_means_the_pod_is_already_gone(kube_api: KubeAPIServer, adapter: KubeAdapter) -> None:
    kube_api.add_pod("ml", "a", node_name="n1")
    kube_api.fail_next(1, 404, path="/eviction")
    assert adapter.evict_pods("n1").done


@pytest.mark.parametrize(
    ("code", "error", "retry_after"),
    [
        (401, CredentialError, None),
        (403, CredentialError, None),
        (404, NotFound, None),
        (410, TransientError, None),
        (422, PermanentError, None),
        (429, TransientError, 4.0),
        (500, TransientError, None),
        (503, TransientError, 4.0),
    ],
    ids=["401", "403", "404", "410", "422", "429", "500", "503"],
)
def test_errors_are_translated(
    kube_api: KubeAPIServer,
    adapter: KubeAdapter,
    code: int,
    error: type[Exception],
    retry_after: float | None,
) -> None:
    kube_api.add_node("n1")
    kube_api.fail_next(1, code, retry_after=int(retry_after) if retry_after else None)
    with pytest.raises(error) as info:
        adapter.get("n1")
    assert info.value.status == code and f"HTTP {code}" in info.value.message
    if isinstance(info.value, TransientError):
        assert info.value.retry_after == retry_after
    if code == 403:
        assert not isinstance(info.value, TransientError)


@pytest.mark.parametrize(
    ("cordoned", "call"),
    [
        (False, lambda k: k.cordon("n1", "r")),
        (True, lambda k: k.uncordon("n1")),
        (False, lambda k: k.set_quarantine_taint("n1", True)),
        (False, lambda k: k.evict_pods("n1")),
    ],
    ids=["cordon", "uncordon", "taint", "evict"],
)
def test_every_write_translates_server_errors_without_sleeping(
    kube_api: KubeAPIServer, adapter: KubeAdapter, cordoned: bool, call: Callable[[KubeAdapter], object]
) -> None:
    kube_api.add_node("n1", unschedulable=cordoned, annotations={OURS: "remediation"} if cordoned else {})
    kube_api.add_pod("ml", "p", node_name="n1")
    kube_api.fail_next(1, 503, retry_after=30, method="PATCH")
    kube_api.fail_next(1, 503, retry_after=30, method="POST")
    started = time.monotonic()
    with pytest.raises(TransientError) as info:
        call(adapter)
    assert info.value.retry_after == 30.0
    assert time.monotonic() - started < budget(5)  # the client did not sleep out Retry-After itself
    assert [r.status for r in kube_api.requests if r.method in ("PATCH", "POST")] == [503]


def test_missing_node_is_not_found_and_bad_token_is_the_systems_fault(
    kube_api: KubeAPIServer, make_settings: Callable[..., Settings]
) -> None:
    adapter = make_kube(make_settings(kube={"token": "wrong"}))
    with pytest.raises(CredentialError) as info:
        adapter.get("n1")
    assert info.value.status == 401 and info.value.component == "kubernetes"
    good = make_kube(make_settings())
    with pytest.raises(NotFound):
        good.get("nope")
    with pytest.raises(NotFound):
        good.cordon("nope", "r")


def test_unreachable_api_is_transient(make_settings: Callable[..., Settings]) -> None:
    adapter = make_kube(make_settings(kube={"host": "https://127.0.0.1:9", "request_timeout_s": 2}))
    with pytest.raises(TransientError, match="cannot reach the Kubernetes API"):
        adapter.get("n1")


def test_tls_is_verified_against_the_configured_ca_and_a_mismatch_is_our_configuration(
    kube_api: KubeAPIServer, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    kube_api.add_node("n1")
    assert make_kube(make_settings()).get("n1").name == "n1"  # the per-run CA verifies the server
    with KubeAPIServer(token="other") as other:  # another cluster's CA: the certificate does not verify
        adapter = make_kube(make_settings(kube={"ca_file": str(other.ca_file)}))
        with pytest.raises(ConfigError, match="TLS to the Kubernetes API failed"):
            adapter.get("n1")
    with pytest.raises(ConfigError, match="kube.ca_file"):
        make_kube(make_settings(kube={"ca_file": str(tmp_path / "missing.crt")}))
    assert not [r for r in kube_api.requests if r.path == "/api/v1/nodes/n1" and r.status != 200]


def test_a_token_is_never_configured_for_plain_http(make_settings: Callable[..., Settings]) -> None:
    with pytest.raises(SettingsError, match="must be https:// to carry a bearer token"):
        make_settings(kube={"host": "http://127.0.0.1:6443"})


# ------------------------------------------------------------------------------------ mapping


def test_pod_mapping_resolves_through_the_slurmd_pod(
    kube_api: KubeAPIServer, make_settings: Callable[..., Settings]
) -> None:
    kube_api.add_node("gke-a3-pool-x1", provider_id="gce://ml/us-central1-a/gke-a3-pool-x1")
    kube_api.add_pod(
        "slurm", "gpu-node-7", node_name="gke-a3-pool-x1", labels={"app.kubernetes.io/component": "slurmd"}
    )
    kube_api.add_pod(
        "slurm", "login-0", node_name="gke-a3-pool-x1", labels={"app.kubernetes.io/component": "login"}
    )
    kube_api.add_pod(
        "other", "gpu-node-8", node_name="gke-a3-pool-x1", labels={"app.kubernetes.io/component": "slurmd"}
    )
    kube_api.add_pod("slurm", "gpu-node-9", labels={"app.kubernetes.io/component": "slurmd"})  # Pending
    kube = make_kube(make_settings(kube={"mapping": "pod"}))

    node = kube.node_for("gpu-node-7")
    assert node == "gke-a3-pool-x1"
    vm = parse_provider_id(kube.get(node).provider_id)
    assert (vm.provider, vm.account, vm.zone, vm.name) == ("gce", "ml", "us-central1-a", "gke-a3-pool-x1")
    with pytest.raises(UnknownNode, match="no pod slurm/login-0 matching"):
        kube.node_for("login-0")  # exists but is not a slurmd pod
    with pytest.raises(UnknownNode, match="no pod slurm/gpu-node-8"):
        kube.node_for("gpu-node-8")  # wrong namespace
    with pytest.raises(UnknownNode, match="not scheduled"):
        kube.node_for("gpu-node-9")
    with pytest.raises(UnknownNode):
        kube.node_for("gpu-node-7,metadata.name=login-0")  # not a node name: no selector injection
    selectors = [r.query for r in kube_api.requests if r.path == "/api/v1/namespaces/slurm/pods"]
    assert selectors[0] == {
        "fieldSelector": "metadata.name=gpu-node-7",
        "labelSelector": "app.kubernetes.io/component=slurmd",
    }


def test_node_mapping_checks_the_node_exists(
    kube_api: KubeAPIServer, make_settings: Callable[..., Settings]
) -> None:
    kube_api.add_node("gpu-node-7")
    kube = make_kube(make_settings(kube={"mapping": "node"}))
    assert kube.node_for("gpu-node-7") == "gpu-node-7"
    with pytest.raises(UnknownNode, match="no Kubernetes Node gpu-node-8"):
        kube.node_for("gpu-node-8")


def test_static_mapping_reads_the_file_and_reloads_it(
    kube_api: KubeAPIServer, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    kube_api.add_node("aks-gpu-0")
    kube_api.add_node("aks-gpu-1")
    mapping = tmp_path / "map.yaml"
    mapping.write_text("gpu-node-1: aks-gpu-0\ngpu-node-2: gone-node\n")
    kube = make_kube(make_settings(kube={"mapping": "static", "static_map_file": str(mapping)}))
    assert kube.node_for("gpu-node-1") == "aks-gpu-0"
    with pytest.raises(UnknownNode, match="not in the mapping file"):
        kube.node_for("gpu-node-3")
    with pytest.raises(UnknownNode, match="no Kubernetes Node gone-node"):
        kube.node_for("gpu-node-2")
    mapping.write_text("gpu-node-1: aks-gpu-1\n")
    os.utime(mapping, (1, 1))  # a new mtime even within the filesystem's timestamp resolution
    assert kube.node_for("gpu-node-1") == "aks-gpu-1"


def test_static_mapping_without_a_readable_file_is_a_config_error(
    kube_api: KubeAPIServer, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    kube = make_kube(
        make_settings(kube={"mapping": "static", "static_map_file": str(tmp_path / "none.yaml")})
    )
    with pytest.raises(ConfigError, match="cannot read kube.static_map_file") as info:
        kube.node_for("gpu-node-1")
    assert info.value.scope is Scope.SYSTEM  # every node would hit it: pause, never a node's fault


def test_factory_backends(make_settings: Callable[..., Settings], kube_api: KubeAPIServer) -> None:
    from remediation.adapters.factory import kube_backend, make_adapters
    from remediation.adapters.memory import MemoryKube
    from remediation.adapters.noop import NoopKube

    assert isinstance(kube_backend(make_settings(kube={"backend": "memory"})), MemoryKube)
    assert isinstance(kube_backend(make_settings(dry_run=True, kube={"backend": "noop"})), NoopKube)
    assert kube_backend(make_settings(kube={"backend": "none"}, machine={"backend": "none"})) is None
    assert isinstance(make_kube(make_settings(kube={"mapping": "node"})), KubeAdapter)
    kube_api.add_node("n1")
    dry = make_adapters(make_settings(dry_run=True, kube={"mapping": "node"})).kube
    assert isinstance(dry, NoopKube)
    assert isinstance(dry.reader, KubeAdapter)  # wrapped once, around the real adapter
    assert dry.node_for("n1") == "n1"  # reads go to the real API
    dry.cordon("n1", "remediation: x")
    assert not kube_api.node("n1")["spec"].get("unschedulable")  # writes are only recorded
    assert not any(r.method == "PATCH" for r in kube_api.requests)


@pytest.mark.parametrize("owner", ["StatefulSet", "NodeSet"], ids=["statefulset", "slinky-nodeset"])
def test_eviction_never_evicts_the_slurmd_pod_it_is_remediating(
    kube_api: KubeAPIServer, make_settings: Callable[..., Settings], owner: str
) -> None:
    """The slurmd pod is the Slurm node: evicting it would recreate the Slurm node on another Node."""
    settings = make_settings(kube={"mapping": "pod", "pod_namespace": "slurm",
                                   "pod_label_selector": "app.kubernetes.io/component=slurmd"})
    adapter = make_kube(settings)
    kube_api.add_pod("slurm", "gpu-node-1", node_name="n1", owner_kind=owner,
                     labels={"app.kubernetes.io/component": "slurmd"})
    kube_api.add_pod("slurm", "login-0", node_name="n1", owner_kind="StatefulSet")  # not slurmd: evicted
    kube_api.add_pod("ml", "trainer", node_name="n1")
    progress = adapter.evict_pods("n1")
    evicted = sorted(r.path.split("/")[-2] for r in kube_api.requests if r.path.endswith("/eviction"))
    assert evicted == ["login-0", "trainer"] and progress.remaining == 2
    assert adapter.evict_pods("n1").done  # the evicted pods are gone; the slurmd pod stays, not waited on
    assert {p["metadata"]["name"] for p in kube_api.pods()} == {"gpu-node-1"}
