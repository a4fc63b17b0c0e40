"""The domain check on Kubernetes: one Indexed Job, one pod per Node of the domain, against the local
kube-apiserver, read back through our client and through kubectl.

The simulated apiserver places a pod without ``nodeName`` by the scheduler's filters (required node
affinity, taints and the cordon, required pod anti-affinity) and runs it as a kubelet would; the
check's outcome per Node is the test's ``jobs.outcome``. The domain's Nodes are cordoned and tainted
by us, as a domain under remediation is; one more Node outside the domain is open to anything.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from remediation.adapters.factory import validator_backend
from remediation.adapters.kube.adapter import make_kube
from remediation.adapters.kube.validator import KubeValidator
from remediation.settings import Settings
from remediation.simulator.kube.api import KubeAPIServer
from remediation.validation.port import ValidationCheck
from tests.integration.kube.conftest import Run
from tests.integration.workerproc import wait_for

DOMAIN = ("gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3")
OUTSIDE = "gpu-node-4"
NS = "node-remediation-validation"
INDEX = "batch.kubernetes.io/job-completion-index"


@pytest.fixture
def validator(make_settings: Callable[..., Settings], kube_api: KubeAPIServer) -> KubeValidator:
    settings = make_settings(kube={"mapping": "node"},
                             validation={"backend": "kubernetes", "poll_interval_s": 0.05, "kube_image": "nccl:test"})
    kube = make_kube(settings)
    for node in (*DOMAIN, OUTSIDE):
        kube_api.add_node(node)
    for node in DOMAIN:
        kube.cordon(node, "remediation: nvswitch sxid")
        kube.set_quarantine_taint(node, True)
    made = validator_backend(settings)
    assert isinstance(made, KubeValidator)
    return made


def check(name: str, nodes: tuple[str, ...] = DOMAIN, timeout_s: float = 30) -> ValidationCheck:
    return ValidationCheck(nodes[0], name, ("srun-less-launcher", "all_reduce_perf", "-g", "4"), timeout_s,
                           cause_class="nvswitch", purpose="run domain check", nodes=nodes)


def pods(kubectl: Run, job: str) -> dict[int, str]:
    """Each pod's index and Node, as kubectl reads them."""
    out = json.loads(kubectl("get", "pods", "-n", NS, "-l", f"job-name={job}", "-o", "json").stdout)
    return {int(p["metadata"]["annotations"][INDEX]): p["spec"].get("nodeName", "") for p in out["items"]}


def test_one_pod_per_node_of_the_domain_and_every_index_passes(
    validator: KubeValidator, kube_api: KubeAPIServer, kubectl: Run,
) -> None:
    kube_api.jobs.outcome = lambda node, argv: (0, f"rank on {node}: {' '.join(argv)}\n# Avg bus bandwidth : 0\n", 0.1)
    ref = validator.start(check("nr-domain-r5-a1"))
    assert ref["k8s_nodes"] == list(DOMAIN)
    wait_for(lambda: validator.poll(ref).done, 15, "the domain check to end")
    result = validator.poll(ref)
    assert result.passed and result.exit_code == 0 and result.state == "Complete"
    ranks = [line.split(":")[0] for line in result.output.splitlines() if line.startswith("rank on")]
    assert sorted(ranks) == [f"rank on {node}" for node in DOMAIN]  # every pod's log, each Node once
    placed = pods(kubectl, "nr-domain-r5-a1")
    assert sorted(placed) == [0, 1, 2, 3] and sorted(placed.values()) == list(DOMAIN)  # one per Node, none outside
    job = json.loads(kubectl("get", "job", "-n", NS, "nr-domain-r5-a1", "-o", "json").stdout)
    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == ("Indexed", 4, 4)
    assert (job["status"]["completedIndexes"], job["status"]["succeeded"]) == ("0-3", 4)
    assert validator.start(check("nr-domain-r5-a1"))["job"] == ref["job"]  # a repeat adopts the Job: it is ours
    assert validator.finish(ref) == f"Job {NS}/nr-domain-r5-a1 deleted"
    assert kubectl("get", "jobs", "-n", NS, "-o", "name").stdout.strip() == ""
    # What ran where outlives the deleted Job: the kubelets' record of its pods, one per index and Node.
    runs = sorted((r.index, r.node) for r in kube_api.jobs.runs if r.job == "nr-domain-r5-a1")
    assert runs == sorted(placed.items())


def test_a_pod_failing_on_one_node_fails_the_check_with_its_exit_code(
    validator: KubeValidator, kube_api: KubeAPIServer, kubectl: Run,
) -> None:
    """gpu-node-2's pod exits 3 while the others still run: the check is done, failed with 3 and that
    pod's log; the Job controller fails the Job and ends the others."""
    kube_api.jobs.outcome = lambda node, argv: (3, "#  Out of bounds values : 1 FAILED\n", 0.05) \
        if node == "gpu-node-2" else (0, "fine\n", 5.0)
    ref = validator.start(check("nr-domain-r6-a1"))
    wait_for(lambda: validator.poll(ref).done, 15, "the domain check to end")
    result = validator.poll(ref)
    assert result.done and not result.passed and result.exit_code == 3
    assert "on gpu-node-2" in result.state and "Out of bounds values : 1 FAILED" in result.output
    job = json.loads(kubectl("get", "job", "-n", NS, "nr-domain-r6-a1", "-o", "json").stdout)
    assert [(c["type"], c["reason"]) for c in job["status"]["conditions"]] == [("Failed", "BackoffLimitExceeded")]
    assert list(pods(kubectl, "nr-domain-r6-a1").values()) == ["gpu-node-2"]  # the others ended
    validator.finish(ref)


def test_an_unreachable_node_leaves_its_index_pending_never_doubled_up(
    validator: KubeValidator, kube_api: KubeAPIServer, kubectl: Run,
) -> None:
    """A domain of five whose fifth Node is unreachable (the node controller's NoExecute taint): four
    pods run, one per Node; the fifth may go on no other (affinity to the domain, anti-affinity to its
    siblings) and waits, unschedulable, until the deadline fails the check."""
    kube_api.add_node("gpu-node-5")
    kube_api.mutate_node("gpu-node-5", lambda n: n["spec"].__setitem__(
        "taints", [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]))
    kube_api.jobs.outcome = lambda node, argv: (None, "", 0)  # the ranks wait for the fifth
    ref = validator.start(check("nr-domain-r7-a1", (*DOMAIN, "gpu-node-5"), timeout_s=2))
    first = validator.poll(ref)
    assert not first.done and first.state == "4/5 RUNNING"
    assert "index 4 unschedulable: 0/6 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, " \
        "4 node(s) didn't match pod anti-affinity rules, 1 node(s) had untolerated taint." in first.waiting
    placed = pods(kubectl, "nr-domain-r7-a1")
    assert placed[4] == "" and sorted(n for n in placed.values() if n) == list(DOMAIN)
    wait_for(lambda: validator.poll(ref).done, 15, "the deadline to end the check")
    result = validator.poll(ref)
    assert result.timed_out and not result.passed and result.state == "DeadlineExceeded"
    validator.finish(ref)
