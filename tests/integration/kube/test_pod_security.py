"""Pod Security admission on the local apiserver, and the check Job against the namespaces deploy/ ships.

The check needs a privileged container (DCGM, GPU reset): the ``restricted`` level of the service's own
namespace must refuse it, as a real cluster does, and the validation's own namespace must admit exactly
the Job the adapter builds. Every Deployment deploy/ ships must pass ``restricted`` where it runs.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import Any

import pytest
import yaml
from kubernetes import client

from remediation.adapters.kube.validator import job_manifest
from remediation.settings import ValidationSettings
from remediation.simulator.kube.api import KubeAPIServer
from remediation.simulator.kube.podsecurity import violations
from remediation.simulator.kube.store import ApiError
from remediation.validation.port import ValidationCheck
from tests.integration.kube.conftest import ROOT, shipped_namespaces
from tests.pace import within

NODE = "gke-a3-0"
CHECK = ValidationCheck("gpu-node-0", "nr-gate-r1-a1", ("dcgmi", "diag", "-r", "2"), 600)
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
HARDENED: dict[str, Any] = {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [{"name": "app", "image": "x", "securityContext": {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
}


def check_job(namespace: str, deadline_s: int = 600) -> dict[str, Any]:
    cfg = ValidationSettings(kube_namespace=namespace)
    job = job_manifest(CHECK, [NODE], cfg, taint_key="example.com/quarantined")
    job["spec"]["activeDeadlineSeconds"] = deadline_s
    return job


def job_pods(api: KubeAPIServer, namespace: str) -> list[dict[str, Any]]:
    return [p for p in api.pods() if p["metadata"]["namespace"] == namespace]


def test_a_privileged_check_pod_is_refused_in_a_restricted_namespace(kube_api: KubeAPIServer,
                                                                     core: client.CoreV1Api) -> None:
    kube_api.add_node(NODE)
    kube_api.add_namespace("locked", RESTRICTED)
    batch = client.BatchV1Api(core.api_client)
    batch.create_namespaced_job("locked", check_job("locked", deadline_s=1))  # the Job itself is admitted
    assert job_pods(kube_api, "locked") == []
    (event,) = [e for e in kube_api.store.list("events")[0] if e["involvedObject"].get("kind") == "Job"]
    assert (event["reason"], event["type"]) == ("FailedCreate", "Warning")
    assert 'violates PodSecurity "restricted:latest"' in event["message"]
    assert 'privileged (container "check" must not set securityContext.privileged=true)' in event["message"]
    deadline = within(10)
    while not (batch.read_namespaced_job(CHECK.name, "locked").status.conditions or []):
        assert time.monotonic() < deadline, "the Job never failed"
        time.sleep(0.05)
    (cond,) = batch.read_namespaced_job(CHECK.name, "locked").status.conditions
    assert (cond.type, cond.reason) == ("Failed", "DeadlineExceeded")  # the validation holds at its timeout


def test_the_check_job_runs_in_the_shipped_validation_namespace(kube_api: KubeAPIServer,
                                                               core: client.CoreV1Api) -> None:
    kube_api.add_node(NODE)
    default = ValidationSettings().kube_namespace
    assert kube_api.pod_security_level(default) == "privileged"
    client.BatchV1Api(core.api_client).create_namespaced_job(default, check_job(default))
    (pod,) = job_pods(kube_api, default)
    assert pod["spec"]["automountServiceAccountToken"] is False
    # ... and the same Job in the service's own namespace would be refused, as production refuses it.
    assert kube_api.pod_security_level("node-remediation") == "restricted"
    assert violations("restricted", check_job("node-remediation")["spec"]["template"]["spec"])


def test_pods_are_admitted_by_the_level_of_their_namespace(kube_api: KubeAPIServer) -> None:
    kube_api.add_namespace("locked", RESTRICTED)
    kube_api.add_pod("open", "anything", node_name=NODE)  # no label: the cluster default, privileged
    with pytest.raises(ApiError) as refused:
        kube_api.add_pod("locked", "plain", node_name=NODE)  # no securityContext at all
    assert refused.value.code == 403 and refused.value.body["reason"] == "Forbidden"
    assert 'pods "plain" is forbidden: violates PodSecurity "restricted:latest"' in refused.value.body["message"]


PRIVILEGED_CONTAINER = {"containers": [{"name": "c", "securityContext": {"privileged": True}}]}


@pytest.mark.parametrize(("level", "spec", "check"), [
    ("baseline", PRIVILEGED_CONTAINER, "privileged"),
    ("baseline", {"hostPID": True, "containers": [{"name": "c"}]}, "host namespaces"),
    ("baseline", {"hostNetwork": True, "containers": [{"name": "c"}]}, "host namespaces"),
    ("baseline", {"hostIPC": True, "containers": [{"name": "c"}]}, "host namespaces"),
    ("baseline", {"volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}], "containers": [{"name": "c"}]},
     "hostPath volumes"),
    ("baseline", {"containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]},
     "non-default capabilities"),
    ("baseline", {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}]}]}, "hostPort"),
    ("baseline", {"securityContext": {"seccompProfile": {"type": "Unconfined"}}, "containers": [{"name": "c"}]},
     "seccompProfile"),
    ("restricted", {**HARDENED, "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}},
     "runAsNonRoot != true"),
    ("restricted", {**HARDENED, "securityContext": {"runAsNonRoot": True}}, "seccompProfile"),
    ("restricted", {**HARDENED, "containers": [{"name": "app", "securityContext": {
        "capabilities": {"drop": ["ALL"]}}}]}, "allowPrivilegeEscalation != false"),
    ("restricted", {**HARDENED, "containers": [{"name": "app", "securityContext": {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}}}]},
     "unrestricted capabilities"),
    ("restricted", {**HARDENED, "securityContext": {**HARDENED["securityContext"], "runAsUser": 0}}, "runAsUser=0"),
    ("restricted", {**HARDENED, "volumes": [{"name": "n", "nfs": {"server": "s", "path": "/"}}]},
     "restricted volume types"),
], ids=["privileged", "hostPID", "hostNetwork", "hostIPC", "hostPath", "capability", "hostPort", "unconfined",
        "runAsNonRoot", "seccomp", "escalation", "caps-add", "root-uid", "nfs-volume"])
def test_each_control_refuses_what_the_standard_forbids(level: str, spec: dict[str, Any], check: str) -> None:
    assert any(v.startswith(check) for v in violations(level, spec)), violations(level, spec)
    assert violations("privileged", spec) == []


def test_what_the_levels_allow() -> None:
    assert violations("restricted", HARDENED) == []
    assert violations("baseline", {"containers": [{"name": "c"}]}) == []  # the default pod
    assert violations("baseline", {"containers": [{"name": "c", "securityContext": {
        "capabilities": {"add": ["NET_BIND_SERVICE", "CHOWN"]}}}]}) == []


def test_every_shipped_workload_passes_its_namespace() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not installed (scripts/setup.sh installs it)")
    out = subprocess.run([kubectl, "kustomize", str(ROOT / "deploy/overlays/gcp")], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    levels = {name: labels.get("pod-security.kubernetes.io/enforce") for name, labels in shipped_namespaces().items()}
    workloads = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment"]
    assert workloads
    for w in workloads:
        level = levels[w["metadata"]["namespace"]]
        assert level == "restricted" and violations(level, w["spec"]["template"]["spec"]) == [], w["metadata"]["name"]


def test_the_domain_ladders_jobs_run_in_the_shipped_validation_namespace(kube_api: KubeAPIServer,
                                                                         core: client.CoreV1Api) -> None:
    """The fabric restart (a Job bound to its Node) and the domain check (an Indexed Job over the
    domain's Nodes) are the check's pod in all that Pod Security reads: the shipped namespace admits
    them, one pod per Node; the service's own restricted namespace would refuse them."""
    cfg = ValidationSettings()
    domain = [f"{NODE}-{i}" for i in range(4)]
    for node in domain:
        kube_api.add_node(node)
    restart = ValidationCheck("gpu-node-0", "nr-fab-d1-3-0-ab12", tuple(cfg.fabric_restart), 300)
    check = ValidationCheck("gpu-node-0", "nr-dom-d1-4-0-ab12", tuple(cfg.domain_check_for("imex")), 900,
                            nodes=tuple(f"gpu-node-{i}" for i in range(4)))
    batch = client.BatchV1Api(core.api_client)
    for job in (job_manifest(restart, domain[:1], cfg, taint_key="example.com/quarantined"),
                job_manifest(check, domain, cfg, taint_key="example.com/quarantined")):
        assert violations("restricted", job["spec"]["template"]["spec"])
        batch.create_namespaced_job(cfg.kube_namespace, job)
    placed = sorted((p["metadata"]["labels"]["job-name"], p["spec"].get("nodeName", ""))
                    for p in job_pods(kube_api, cfg.kube_namespace))
    assert len(placed) == 5
    assert [n for j, n in placed if j == restart.name] == [domain[0]]
    assert sorted(n for j, n in placed if j == check.name) == domain
