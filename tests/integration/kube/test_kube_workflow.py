"""End to end: the workflow engine acting through the real KubeNodes adapter on the local kube-apiserver.

Postgres is real (rolled-back ``sessions``) and the clock is fake, so the engine is driven
synchronously and every timeout is instant. Kubernetes is the official client against the local API
server, so every cordon, eviction and uncordon is a real request in the server's log. Slurm is
:class:`MemorySlurm`. The VM provider is :class:`RebootingVM`, a fake at our own boundary. When one of
its operations completes, it does to the Node what a real reboot does: the kubelet comes back and
posts Ready=True with a new ``status.nodeInfo.bootID``, and slurmd re-registers. verify therefore reads
its reboot proof through the real client.

The cluster is a Slinky-style layout: the slurmd of Slurm node ``gpu-node-7`` is the pod
``slurm/gpu-node-7`` (selected by label) on a cloud Node whose name and providerID have nothing to do
with the Slurm name. A pod of the same name in another namespace sits on a decoy Node, so the mapping
must honour the namespace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.kube.adapter import KubeAdapter, make_kube
from remediation.adapters.memory import MemorySlurm, MemoryWorld
from remediation.clock import FakeClock
from remediation.domain.events import Source
from remediation.domain.step_bodies import Adapters
from remediation.ports.cluster import Operation, OperationStatus, VMAction, VMRef
from remediation.ports.dispatch import FollowUp
from remediation.ports.errors import NotFound
from remediation.services.workflow import Workflow
from remediation.settings import Settings
from remediation.simulator.kube.api import KubeAPIServer, Request
from tests.faults import SOFTWARE_FAULT
from tests.integration.test_workflow_engine import drive, publish, rem_for, steps_of

SLURM = "gpu-node-7"
SLURMD_LABEL = "app.kubernetes.io/component=slurmd"
OURS = "remediation.gpu.io/cordoned-by"
TAINT = "remediation.gpu.io/quarantined"
EVICT_TIMEOUT_S = 300

GCE_ID = "gce://hpc-prod-4821/us-central1-a/gke-slurm-gpu-pool-7f3a9c1e-x2k9"
AWS_ID = "aws:///us-east-1b/i-0a1b2c3d4e5f67890"
AZURE_SUB = "0b7c6e1a-3f7d-4c2e-9a51-5d8e2f9c1b4a"
AZURE_ID = (
    f"azure:///subscriptions/{AZURE_SUB}/resourceGroups/mc_hpc-prod_aks-gpu_eastus"
    "/providers/Microsoft.Compute/virtualMachineScaleSets/aks-gpu-12345678-vmss/virtualMachines/3"
)

# (Node name the cloud gave the VM, its providerID, the VMRef the provider must receive)
CLOUDS = [
    (
        "gke-slurm-gpu-pool-7f3a9c1e-x2k9",
        GCE_ID,
        VMRef(
            "gce",
            "gke-slurm-gpu-pool-7f3a9c1e-x2k9",
            zone="us-central1-a",
            account="hpc-prod-4821",
            provider_id=GCE_ID,
        ),
    ),
    (
        "ip-10-0-12-34.ec2.internal",
        AWS_ID,
        VMRef("aws", "i-0a1b2c3d4e5f67890", zone="us-east-1b", provider_id=AWS_ID),
    ),
    (
        "aks-gpu-12345678-vmss000003",
        AZURE_ID,
        VMRef(
            "azure",
            "3",
            account=AZURE_SUB,
            group="mc_hpc-prod_aks-gpu_eastus",
            scale_set="aks-gpu-12345678-vmss",
            provider_id=AZURE_ID,
        ),
    ),
]
NODE, PROVIDER_ID, VM = CLOUDS[0]  # the cluster most tests use
DECOY = "gke-slurm-cpu-pool-0c1d2e3f-a1b2"


# ----------------------------------------------------------------------------------- the VM fake


class RebootingVM:
    """A MachineProvider whose completed operation reboots the Node on the local API server.

    ``start`` takes the VM down (Ready=Unknown, slurmd NOT_RESPONDING); the operation completes on
    the ``polls``-th poll, when the kubelet comes back with Ready=True and, if ``reboot``, a new bootID
    (``reboot=False`` is a provider that reports success for a VM that never went down). Every start is
    kept in ``started``, so tests see the exact VMRef the workflow resolved from the providerID.
    """

    def __init__(
        self,
        api: KubeAPIServer,
        world: MemoryWorld,
        nodes: dict[str, tuple[str, str]],
        polls: int = 2,
        reboot: bool = True,
    ) -> None:
        self.api, self.world, self.nodes = api, world, nodes  # VM name -> (Node, Slurm node)
        self.polls, self.reboot = polls, reboot
        self.started: list[tuple[VMRef, VMAction, str]] = []
        self._by_key: dict[str, Operation] = {}
        self._polled: dict[str, int] = {}

    def start(self, vm: VMRef, action: VMAction, idempotency_key: str) -> Operation:
        if idempotency_key in self._by_key:
            return self._by_key[idempotency_key]
        if vm.name not in self.nodes:
            raise NotFound(f"VM {vm.name} not found")
        k8s, slurm = self.nodes[vm.name]
        self.started.append((vm, action, idempotency_key))
        self.api.set_condition(
            k8s,
            "Ready",
            "Unknown",
            reason="NodeStatusUnknown",
            message="Kubelet stopped posting node status.",
        )
        self._slurm_flags(slurm, add={"NOT_RESPONDING"})
        op = Operation(vm.provider, f"op-{len(self.started)}", action, vm)
        self._by_key[idempotency_key], self._polled[op.ref] = op, 0
        return op

    def poll(self, op: Operation) -> OperationStatus:
        self._polled[op.ref] += 1
        if self._polled[op.ref] < self.polls:
            return OperationStatus(done=False)
        if self._polled[op.ref] == self.polls:
            k8s, slurm = self.nodes[op.vm.name]
            if self.reboot:
                self.api.bump_boot_id(k8s)
                with self.world.mutate() as st:  # the VM booted: its slurmd started (and registered) now
                    st["nodes"][slurm]["slurm"]["slurmd_start"] = time.time()
            self.api.set_condition(k8s, "Ready", "True", reason="KubeletReady", message="kubelet is posting")
            self._slurm_flags(slurm, remove={"NOT_RESPONDING"})
        return OperationStatus(done=True)

    def _slurm_flags(self, slurm: str, add: set[str] = set(), remove: set[str] = set()) -> None:  # noqa: B006
        flags = set(self.world.node(slurm)["slurm"]["flags"])
        self.world.set_slurm(slurm, flags=sorted((flags | add) - remove))


# ------------------------------------------------------------------------------------- fixtures


@dataclass
class Cluster:
    api: KubeAPIServer
    world: MemoryWorld
    vm: RebootingVM
    engine: Workflow
    settings: Settings
    clock: FakeClock
    sessions: sessionmaker[Session]
    node: str = NODE
    boot_id: str = ""

    def publish(self) -> FollowUp:
        """A researcher marks the node failed in Slurm (``scontrol update state=fail``); the watcher
        publishes what Slurm now shows."""
        flags = set(self.world.node(SLURM)["slurm"]["flags"]) | {"FAIL"}
        self.world.set_slurm(SLURM, flags=sorted(flags), reason=SOFTWARE_FAULT, user="researcher")
        (f,) = publish(self.sessions, self.settings, self.clock, SLURM, reason=SOFTWARE_FAULT)
        return f

    def run_until(self, f: FollowUp, step: str, limit: int = 200) -> FollowUp:
        """Run the workflow (advancing the clock by each countdown) until ``step`` is next."""
        for _ in range(limit):
            if f.step == step:
                return f
            self.clock.advance(f.countdown)
            f = self.step(f)
        raise AssertionError(f"never reached {step}")

    def step(self, f: FollowUp) -> FollowUp:
        """Run one step that must leave the remediation open."""
        nxt = self.engine.run(f.remediation_id, f.step)
        assert nxt is not None, f"{f.step} closed the remediation"
        return nxt

    def k8s(self) -> dict[str, Any]:
        return self.api.node(self.node)

    def pod_names(self) -> set[str]:
        return {f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in self.api.pods()}


def by(api: KubeAPIServer, method: str, path_part: str = "") -> list[Request]:
    return [r for r in api.requests if r.method == method and path_part in r.path]


def cordon_patches(api: KubeAPIServer, node: str) -> list[Request]:
    """PATCHes of the Node that set spec.unschedulable=true."""
    return [
        r
        for r in by(api, "PATCH", f"/nodes/{node}")
        if isinstance(r.body, dict) and (r.body.get("spec") or {}).get("unschedulable") is True
    ]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2026, 3, 1, tzinfo=UTC))


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(
        kube={
            "mapping": "pod",
            "pod_namespace": "slurm",
            "pod_label_selector": SLURMD_LABEL,
            "evict_backoff_s": 5.0,
        },
        policy={"min_restart_gap_s": 0, "breaker_min_failures": 3},
        workflow={
            "poll_interval_s": 5,
            "max_wait_s": 60,
            "evict_timeout_s": EVICT_TIMEOUT_S,
            "verify_timeout_s": 120,
            "lease_s": 30,
        },
    )


@pytest.fixture
def build(
    kube_api: KubeAPIServer, settings: Settings, clock: FakeClock, sessions: sessionmaker[Session]
) -> Callable[..., Cluster]:
    """A cluster on one cloud: the slurmd pod, a workload, a DaemonSet pod and a mirror pod on the
    Node; a decoy Node carrying a same-named pod in another namespace."""

    def go(
        cloud: tuple[str, str, VMRef] = CLOUDS[0], *, human_cordon: bool = False, reboot: bool = True
    ) -> Cluster:
        node, provider_id, vm_ref = cloud
        kube_api.add_node(
            node,
            provider_id=provider_id,
            unschedulable=human_cordon,
            annotations={"ops.example.com/cordoned-for": "PSU swap, ticket 4711"} if human_cordon else None,
        )
        kube_api.add_node(DECOY, provider_id="gce://hpc-prod-4821/us-central1-a/" + DECOY)
        kube_api.add_pod(
            "slurm",
            SLURM,
            node_name=node,
            labels={"app.kubernetes.io/component": "slurmd"},
            owner_kind="DaemonSet",
        )
        kube_api.add_pod("default", SLURM, node_name=DECOY, labels={"app.kubernetes.io/component": "slurmd"})
        kube_api.add_pod(
            "default", "trainer-0", node_name=node, labels={"app": "trainer"}, owner_kind="ReplicaSet"
        )
        kube_api.add_pod("kube-system", "nvidia-device-plugin-x7k2p", node_name=node, owner_kind="DaemonSet")
        kube_api.add_pod("kube-system", f"kube-proxy-{node}", node_name=node, mirror=True)
        kube_api.add_pod(
            "default", "web-decoy", node_name=DECOY, labels={"app": "web"}, owner_kind="ReplicaSet"
        )
        world = MemoryWorld(nodes=[SLURM])
        vm = RebootingVM(kube_api, world, {vm_ref.name: (node, SLURM)}, reboot=reboot)
        kube = make_kube(settings)
        assert isinstance(kube, KubeAdapter)  # the real adapter over the official client
        engine = Workflow(sessions, Adapters(MemorySlurm(world), kube, vm), settings, clock=clock)
        boot_id = kube_api.node(node)["status"]["nodeInfo"]["bootID"]
        kube_api.clear_requests()
        return Cluster(kube_api, world, vm, engine, settings, clock, sessions, node, boot_id)

    return go


# ---------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("cloud", CLOUDS, ids=["gce", "aws", "azure-vmss"])
def test_slurm_node_to_vm_then_cordon_evict_restart_verify_uncordon(
    build: Callable[..., Cluster], cloud: tuple[str, str, VMRef]
) -> None:
    c = build(cloud)
    node, _, expected_vm = cloud
    f = c.publish()

    f = c.run_until(f, "k8s_evict")  # drained in Slurm, cordoned in Kubernetes
    (pod_query,) = [r for r in by(c.api, "GET", "/namespaces/slurm/pods")]
    assert pod_query.query == {"fieldSelector": f"metadata.name={SLURM}", "labelSelector": SLURMD_LABEL}
    context = rem_for(c.sessions, SLURM).context
    assert {k: context[k] for k in ("k8s_node", "boot_id_before", "provider_id", "we_cordoned")} == {
        "k8s_node": node,
        "boot_id_before": c.boot_id,
        "provider_id": cloud[1],
        "we_cordoned": True,
    }
    assert c.k8s()["spec"]["unschedulable"] is True
    assert c.k8s()["metadata"]["annotations"][OURS] == "remediation"
    assert DECOY not in {r.path.rsplit("/", 1)[-1] for r in by(c.api, "PATCH")}

    f = c.run_until(f, "vm_restart")  # the workload evicted; DaemonSet and mirror pods stay
    assert c.pod_names() == {
        f"slurm/{SLURM}",
        f"default/{SLURM}",
        "kube-system/nvidia-device-plugin-x7k2p",
        f"kube-system/kube-proxy-{node}",
        "default/web-decoy",
    }
    assert [(r.path, r.status) for r in by(c.api, "POST", "/eviction")] == [
        ("/api/v1/namespaces/default/pods/trainer-0/eviction", 201)
    ]

    f = c.run_until(f, "verify")  # the VM the providerID names was restarted, and it rebooted
    rid = f.remediation_id
    assert c.vm.started == [(expected_vm, VMAction.RESTART, f"r{rid}:vm_restart:1")]
    new_boot_id = c.k8s()["status"]["nodeInfo"]["bootID"]
    assert new_boot_id != c.boot_id

    f = c.run_until(f, "return")
    verify_row = [r for r in steps_of(c.sessions, rid) if r.step == "verify"][-1]
    assert verify_row.detail["boot_id"] == new_boot_id

    drive(c.engine, c.clock, [f])
    rem = rem_for(c.sessions, SLURM)
    assert rem.status == "succeeded"
    assert [r.step for r in steps_of(c.sessions, rid)] == [
        "slurm_drain",
        "k8s_cordon",
        "k8s_evict",
        "vm_restart",
        "verify",
        "return",
    ]
    assert c.k8s()["spec"]["unschedulable"] is False
    assert OURS not in c.k8s()["metadata"]["annotations"]
    assert c.world.node(SLURM)["slurm"]["flags"] == []  # resumed in Slurm
    assert by(c.api, "DELETE") == []


def test_verify_does_not_pass_without_a_new_boot_id(build: Callable[..., Cluster]) -> None:
    c = build(reboot=False)  # the provider says done; the Node is Ready but never rebooted
    drive(c.engine, c.clock, [c.publish()], limit=2000)
    rem = rem_for(c.sessions, SLURM)
    assert rem.status == "quarantined"
    assert "ladder exhausted" in rem.context["quarantine_reason"]
    assert "new bootID=False" in rem.context["quarantine_reason"]
    assert [a for _, a, _ in c.vm.started] == [VMAction.RESTART, VMAction.STOP_START]  # GCE has no reimage
    assert c.k8s()["status"]["nodeInfo"]["bootID"] == c.boot_id
    assert any(t["key"] == TAINT for t in c.k8s()["spec"]["taints"])
    assert c.k8s()["spec"]["unschedulable"] is True  # quarantined: our cordon stays


FATAL_XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."
APP_XID = "NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, Graphics SM Warp Exception"


@pytest.mark.parametrize(("said", "returned"), [(FATAL_XID, False), (APP_XID, True)], ids=["fatal-xid", "app-xid"])
def test_a_fault_that_arrives_during_verify_is_never_returned_with_the_node(
    build: Callable[..., Cluster], kube_api: KubeAPIServer, said: str, returned: bool
) -> None:
    c = build()
    f = c.run_until(c.publish(), "verify")  # the VM restarted and the Node came back with a new bootID
    kube_api.set_condition(c.node, "GpuXidError", "True", reason="XidError", message=said)
    # The watcher's event is recorded as part of the open remediation: it opens nothing of its own.
    assert publish(c.sessions, c.settings, c.clock, SLURM, state="GpuXidError=True", reason=f"XidError: {said}",
                   source=Source.KUBERNETES) == []
    c.clock.advance(f.countdown)
    f = c.step(f)
    rid = f.remediation_id
    if returned:  # an application's XID is the workload's, not the node's
        assert f.step == "return"
        drive(c.engine, c.clock, [f])
        assert rem_for(c.sessions, SLURM).status == "succeeded"
        assert c.k8s()["spec"]["unschedulable"] is False
        return
    rem = rem_for(c.sessions, SLURM)
    assert f.step == "verify" and "a new fault: GpuXidError=True" in rem.wait_reason and "Xid" in rem.wait_reason
    drive(c.engine, c.clock, [f], limit=2000)
    rem = rem_for(c.sessions, SLURM)
    assert rem.status != "succeeded" and "return" not in [r.step for r in steps_of(c.sessions, rid)]
    verifies = [r for r in steps_of(c.sessions, rid) if r.step == "verify"]
    assert all("a new fault: GpuXidError=True" in (r.error or "") for r in verifies if r.status == "failed")
    assert len(c.vm.started) >= 2  # the ladder climbed past the restart that did not clear it
    assert c.k8s()["spec"]["unschedulable"] is True  # never handed back with the fault


def test_eviction_waits_while_a_budget_forbids_it_then_succeeds(
    build: Callable[..., Cluster], kube_api: KubeAPIServer
) -> None:
    c = build()
    kube_api.add_pod("default", "web-0", node_name=c.node, labels={"app": "web"}, owner_kind="ReplicaSet")
    kube_api.remove_pod("default", "web-decoy")
    kube_api.add_pdb("default", "web", "app=web", min_available=1)
    f = c.run_until(c.publish(), "k8s_evict")
    for _ in range(2):
        f = c.step(f)
        assert f.step == "k8s_evict" and f.countdown >= 5
        rem = rem_for(c.sessions, SLURM)
        assert rem.status == "waiting" and "1 blocked by a disruption budget" in str(rem.wait_reason)
        c.clock.advance(f.countdown)
    assert "default/web-0" in c.pod_names()

    # A second replica comes up elsewhere: the budget now allows one disruption.
    kube_api.add_pod("default", "web-1", node_name=DECOY, labels={"app": "web"}, owner_kind="ReplicaSet")
    drive(c.engine, c.clock, [f])
    assert rem_for(c.sessions, SLURM).status == "succeeded"
    assert [r.status for r in by(c.api, "POST", "/pods/web-0/eviction")] == [429, 429, 201]
    pods = c.pod_names()
    assert "default/web-0" not in pods and "default/trainer-0" not in pods and "default/web-1" in pods
    # One step attempt: two blocked passes, one that evicts, one that sees the pod gone.
    (evict_row,) = [r for r in steps_of(c.sessions, f.remediation_id) if r.step == "k8s_evict"]
    assert (evict_row.attempt, evict_row.checks, evict_row.status) == (1, 3, "done")
    assert by(c.api, "DELETE") == []


def test_a_budget_that_never_allows_quarantines_after_the_timeout_and_forces_nothing(
    build: Callable[..., Cluster], kube_api: KubeAPIServer
) -> None:
    c = build()
    kube_api.add_pod("default", "web-0", node_name=c.node, labels={"app": "web"}, owner_kind="ReplicaSet")
    kube_api.remove_pod("default", "web-decoy")
    kube_api.add_pdb("default", "web", "app=web", min_available=1)
    f = c.run_until(c.publish(), "k8s_evict")
    evict_started = c.clock.now()
    drive(c.engine, c.clock, [f], limit=1000)

    rem = rem_for(c.sessions, SLURM)
    assert rem.status == "quarantined"
    assert rem.context["quarantine_reason"] == (
        f"eviction still blocked after {EVICT_TIMEOUT_S}s (default/web-0); not forcing"
    )
    assert (c.clock.now() - evict_started).total_seconds() > EVICT_TIMEOUT_S
    refused = by(c.api, "POST", "/pods/web-0/eviction")
    assert len(refused) > 2 and {r.status for r in refused} == {429}  # retried, never forced
    assert by(c.api, "DELETE") == []
    assert "default/web-0" in c.pod_names()
    assert c.vm.started == []
    node = c.k8s()
    assert node["spec"]["unschedulable"] is True and OURS in node["metadata"]["annotations"]
    assert [t["key"] for t in node["spec"]["taints"]] == [TAINT]
    assert c.world.node(SLURM)["slurm"]["reason"].startswith(
        "remediation: quarantined: eviction still blocked"
    )


def test_a_human_cordon_placed_before_us_is_never_undone(build: Callable[..., Cluster]) -> None:
    c = build(human_cordon=True)
    drive(c.engine, c.clock, [c.publish()])
    rem = rem_for(c.sessions, SLURM)
    assert rem.status == "succeeded" and rem.context["we_cordoned"] is False
    node = c.k8s()
    assert node["spec"]["unschedulable"] is True
    assert OURS not in node["metadata"]["annotations"]
    assert node["metadata"]["annotations"]["ops.example.com/cordoned-for"] == "PSU swap, ticket 4711"
    assert by(c.api, "PATCH") == []  # we never wrote the Node at all
    assert "cordon not ours, left as is" in str(steps_of(c.sessions, rem.id)[-1].outcome)
    assert len(c.vm.started) == 1 and "default/trainer-0" not in c.pod_names()  # the rest still ran


def kubectl_uncordon(core: client.CoreV1Api, node: str) -> None:
    """What ``kubectl uncordon`` sends: a strategic merge patch of spec.unschedulable only."""
    core.patch_node(node, {"spec": {"unschedulable": False}})


@pytest.mark.parametrize(
    ("during", "pdb_blocks", "restarts"),
    [("k8s_evict", True, 0), ("vm_restart", False, 0), ("verify", False, 1)],
    ids=["while-eviction-is-blocked", "before-the-restart", "while-verifying"],
)
def test_a_human_uncordon_mid_remediation_cancels_it_and_we_never_recordon(
    build: Callable[..., Cluster],
    kube_api: KubeAPIServer,
    core: client.CoreV1Api,
    during: str,
    pdb_blocks: bool,
    restarts: int,
) -> None:
    c = build()
    if pdb_blocks:
        kube_api.add_pod("default", "web-0", node_name=c.node, labels={"app": "web"}, owner_kind="ReplicaSet")
        kube_api.remove_pod("default", "web-decoy")
        kube_api.add_pdb("default", "web", "app=web", min_available=1)
    f = c.run_until(c.publish(), during)
    if pdb_blocks:
        f = c.step(f)  # blocked: the workflow is waiting
        assert f.step == during
    rid = f.remediation_id
    assert len(cordon_patches(c.api, c.node)) == 1

    kubectl_uncordon(core, c.node)
    assert c.engine.run(rid, f.step) is None
    rem = rem_for(c.sessions, SLURM)
    assert rem.status == "cancelled"
    assert f"a human uncordoned {c.node} during the remediation" in str(rem.outcome)
    assert c.world.node(SLURM)["slurm"]["flags"] == []  # our Slurm drain given back
    assert len(c.vm.started) == restarts

    # Late and duplicate deliveries of any step, and the sweeper, change nothing.
    for step in ("k8s_cordon", during, "vm_restart", "verify", "return"):
        assert c.engine.run(rid, step) is None
    c.clock.advance(3600)
    assert [x for x in c.engine.sweep() if x.remediation_id == rid] == []
    assert c.k8s()["spec"]["unschedulable"] is False
    assert len(cordon_patches(c.api, c.node)) == 1  # only our original cordon, never again
    assert len(c.vm.started) == restarts


def test_a_human_cordon_after_a_cancelled_remediation_is_not_taken_for_ours(
    build: Callable[..., Cluster], kube_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    c = build()
    f = c.run_until(c.publish(), "vm_restart")
    kubectl_uncordon(core, c.node)
    assert c.engine.run(f.remediation_id, f.step) is None
    assert rem_for(c.sessions, SLURM).status == "cancelled"

    core.patch_node(c.node, {"spec": {"unschedulable": True}})  # later: kubectl cordon, by a human
    c.clock.advance(3600)
    drive(c.engine, c.clock, [c.publish()])
    rem = rem_for(c.sessions, SLURM)
    assert rem.status == "succeeded"
    assert c.k8s()["spec"]["unschedulable"] is True  # the human's cordon outlives our remediation
    assert rem.context["we_cordoned"] is False
    assert len(cordon_patches(c.api, c.node)) == 2  # ours (first remediation) and the human's
