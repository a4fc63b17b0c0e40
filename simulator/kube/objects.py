"""The objects the fake kube-apiserver holds, shaped as a real GPU cluster's are.

Nodes are 15-30 KiB, as a GPU kubelet registers them, with values derived from the name so runs repeat;
pods carry owners, requests, IPs, container statuses and emptyDirs; DaemonSets are objects. Every
builder's output validates against the official schema.

Why: docs/kubernetes.md#inside-the-local-kube-apiserver
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, NamedTuple

Obj = dict[str, Any]

KUBELET_VERSION = "v1.32.4-gke.1106000"

# (repository, tag, size in bytes): what a GKE A3 node pulls for the GPU stack, logging and the job.
_IMAGES = [
    ("nvcr.io/nvidia/pytorch", "24.10-py3", 10_812_345_678),
    ("us-docker.pkg.dev/llm-train/images/llama-trainer", "2026.11.2", 9_634_112_004),
    ("nvcr.io/nvidia/cuda", "12.6.2-devel-ubuntu22.04", 4_512_447_100),
    ("gke.gcr.io/nvidia-gpu-device-plugin", "v1.0.25-gke.56", 62_101_555),
    ("gke.gcr.io/nvidia-driver-installer", "cos-stable-550.90.07", 1_201_883_640),
    ("nvcr.io/nvidia/k8s/dcgm-exporter", "3.3.8-3.6.0-ubuntu22.04", 394_211_876),
    ("registry.k8s.io/nfd/node-feature-discovery", "v0.16.6", 71_234_012),
    ("nvcr.io/nvidia/k8s-device-plugin", "v0.17.0", 212_557_904),
    ("nvcr.io/nvidia/gpu-feature-discovery", "v0.8.2-ubi8", 184_220_101),
    ("ghcr.io/slinkyproject/slurmd", "24.11-ubuntu24.04", 912_440_128),
    ("gke.gcr.io/gke-metrics-agent", "1.15.3-gke.0", 31_556_120),
    ("gke.gcr.io/fluent-bit", "v1.8.12-gke.25", 25_339_877),
    ("gke.gcr.io/fluent-bit-gke-exporter", "v0.28.0-gke.5", 41_117_206),
    ("gke.gcr.io/kube-proxy-amd64", "v1.32.4-gke.1106000", 28_612_904),
    ("gke.gcr.io/netd", "v0.5.0-gke.42", 36_812_006),
    ("gke.gcr.io/gcp-compute-persistent-disk-csi-driver", "v1.15.3-gke.0", 24_770_511),
    ("gke.gcr.io/csi-node-driver-registrar", "v2.11.1-gke.12", 11_990_344),
    ("gke.gcr.io/gcs-fuse-csi-driver", "v1.5.0-gke.8", 43_559_801),
    ("gke.gcr.io/node-problem-detector", "v0.8.19-gke.5", 48_234_612),
    ("gke.gcr.io/ip-masq-agent", "v2.10.0-gke.8", 19_660_218),
    ("gke.gcr.io/prometheus-to-sd", "v0.11.12-gke.27", 21_018_644),
    ("us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/tcpgpudmarxd-dev", "v1.0.12", 1_320_557_611),
    ("us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/nccl-plugin-gpudirecttcpx-dev", "v1.0.6", 702_448_019),
    ("gke.gcr.io/pause", "3.10@sha256", 321_520),
    ("docker.io/library/busybox", "1.37", 2_167_176),
    ("quay.io/prometheus/node-exporter", "v1.8.2", 12_055_411),
    ("ghcr.io/slinkyproject/sackd", "24.11-ubuntu24.04", 402_887_129),
    ("nvcr.io/nvidia/k8s/container-toolkit", "v1.17.0-ubuntu20.04", 143_019_774),
    ("nvcr.io/nvidia/cloud-native/k8s-driver-manager", "v0.7.0", 221_004_658),
    ("gke.gcr.io/gke-node-termination-handler", "v1.4.0-gke.3", 17_330_410),
]


def _h(name: str, salt: str = "") -> int:
    return int.from_bytes(hashlib.sha256(f"{salt}:{name}".encode()).digest()[:8], "big")


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _fields(keys: list[str], prefix: str = "f:") -> Obj:
    return {f"{prefix}{k}": {} for k in keys}


@dataclass(frozen=True)
class NodeState:
    """What the caller sets on a GPU Node; everything else derives from its name."""

    ready: str = "True"
    provider_id: str = ""
    boot_id: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    taints: list[Obj] | None = None


class _NodeLabels(NamedTuple):
    """A Node's labels by the writer that sets them (each writer's managedFields name its own)."""

    base: dict[str, str]
    cloud: dict[str, str]
    gpu: dict[str, str]
    nfd: dict[str, str]


def gpu_node_object(name: str, state: NodeState, *, now: str) -> Obj:
    """A GPU Node as a GKE or AKS kubelet registers it (8 GPUs, 208 vCPU), the caller's labels and
    annotations on top."""
    h = _h(name)
    azure = state.provider_id.startswith("azure://")
    labels = _node_labels(name, h, state.labels, azure=azure)
    capacity, allocatable = _node_resources()
    conditions = _node_conditions(state.ready, now)
    spec = _node_spec(h, state)
    managed = _node_managed_fields(labels, spec, conditions, resources=(capacity, allocatable), azure=azure)
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "labels": {**labels.base, **labels.cloud, **labels.gpu, **labels.nfd, **state.labels},
            "annotations": _node_annotations(name, state, labels),
            "managedFields": [
                {
                    "manager": m,
                    "operation": op,
                    "apiVersion": "v1",
                    "time": now,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": fields,
                    **({"subresource": sub} if sub else {}),
                }
                for m, op, sub, fields in managed
            ],
        },  # fmt: skip
        "spec": spec,
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": _node_ip(h)},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": _node_info(name, h, state.boot_id, azure=azure),
            "images": _node_images(),
            "runtimeHandlers": [
                {"name": "", "features": {"recursiveReadOnlyMounts": True, "userNamespaces": True}},
                {"name": "nvidia", "features": {"recursiveReadOnlyMounts": True, "userNamespaces": True}},
                {"name": "runc", "features": {"recursiveReadOnlyMounts": True, "userNamespaces": True}},
            ],
            "features": {"supplementalGroupsPolicy": True},
        },
    }


def _node_ip(h: int) -> str:
    """The node's internal IP, from its name's hash ``h``."""
    return f"10.{(h >> 8) % 256}.{(h >> 16) % 256}.{2 + (h >> 24) % 250}"


def _node_labels(name: str, h: int, given: dict[str, str], *, azure: bool) -> _NodeLabels:
    """The well-known, cloud, GPU feature discovery and node feature discovery labels, derived from
    the name's hash; a cloud label the caller gives (a topology, say) is the one the cloud applied."""
    zone = f"us-central1-{'abc'[h % 3]}" if not azure else f"eastus-{1 + h % 3}"
    region = zone.rsplit("-", 1)[0] if not azure else "eastus"
    itype = "Standard_ND96asr_v4" if azure else "a3-highgpu-8g"
    base = {
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/instance-type": itype, "beta.kubernetes.io/os": "linux",
        "failure-domain.beta.kubernetes.io/region": region, "failure-domain.beta.kubernetes.io/zone": zone,
        "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": itype, "topology.kubernetes.io/region": region,
        "topology.kubernetes.io/zone": zone,
    }  # fmt: skip
    pool = str(given.get("cloud.google.com/gke-nodepool", "a3-pool"))
    cloud = _azure_labels() if azure else _gke_labels(h, zone, pool)
    cloud = {k: str(given.get(k, v)) for k, v in cloud.items()}
    return _NodeLabels(base, cloud, _gpu_labels(itype), _nfd_labels())


def _nfd_labels() -> dict[str, str]:
    """Node feature discovery's labels: the CPU, kernel and PCI features of an A3 host."""
    return {
        f"feature.node.kubernetes.io/{key}": "true"
        for key in (
            "cpu-cpuid.AVX512F", "cpu-cpuid.AVX512BW", "cpu-cpuid.AMXBF16", "cpu-cpuid.VMX",
            "cpu-hardware_multithreading", "kernel-config.NO_HZ_FULL", "pci-10de.present",
            "pci-15b3.present", "storage-nonrotationaldisk", "system-os_release.VERSION_ID.major",
        )
    }  # fmt: skip


def _gpu_labels(itype: str) -> dict[str, str]:
    """GPU feature discovery's labels for eight H100s on machine type ``itype``."""
    return {
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0", "nvidia.com/cuda.driver.major": "550", "nvidia.com/cuda.driver.minor": "90",
        "nvidia.com/cuda.driver.rev": "07", "nvidia.com/cuda.runtime.major": "12", "nvidia.com/cuda.runtime.minor": "4",
        "nvidia.com/gpu.machine": itype, "nvidia.com/mig.capable": "true", "nvidia.com/mps.capable": "false",
        "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/gfd.timestamp": "1763600000",
    }  # fmt: skip


def _azure_labels() -> dict[str, str]:
    """The labels AKS sets on a node of an ND96asr v4 agent pool."""
    return {
        "kubernetes.azure.com/agentpool": "ndv4", "kubernetes.azure.com/cluster": "MC_sim-gpu-rg_aks_eastus",
        "kubernetes.azure.com/mode": "user", "kubernetes.azure.com/node-image-version": "AKSUbuntu-2204gen2containerd-202511.10.0",
        "kubernetes.azure.com/os-sku": "Ubuntu", "kubernetes.azure.com/role": "agent",
        "kubernetes.azure.com/accelerator": "nvidia", "kubernetes.azure.com/storageprofile": "managed",
        "agentpool": "ndv4",
    }  # fmt: skip


def _gke_labels(h: int, zone: str, pool: str) -> dict[str, str]:
    """The labels GKE sets on an A3 node of ``pool``, its compact-placement topology among them."""
    return {
        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb", "cloud.google.com/gke-boot-disk": "pd-ssd",
        "cloud.google.com/gke-container-runtime": "containerd", "cloud.google.com/gke-cpu-scaling-level": "208",
        "cloud.google.com/gke-gpu": "true", "cloud.google.com/gke-gpu-driver-version": "latest",
        "cloud.google.com/gke-logging-variant": "DEFAULT", "cloud.google.com/gke-max-pods-per-node": "32",
        "cloud.google.com/gke-memory-gb-scaling-level": "1872", "cloud.google.com/gke-nodepool": pool,
        "cloud.google.com/gke-os-distribution": "cos", "cloud.google.com/gke-provisioning": "standard",
        "cloud.google.com/gke-stack-type": "IPV4", "cloud.google.com/machine-family": "a3",
        "cloud.google.com/private-node": "true", "topology.gke.io/zone": zone,
        "cloud.google.com/gce-topology-block": f"block-{h % 4}", "cloud.google.com/gce-topology-subblock": f"sb-{h % 16}",
        "cloud.google.com/gce-topology-host": f"host-{h % 4096:04x}",
    }  # fmt: skip


def _node_annotations(name: str, state: NodeState, labels: _NodeLabels) -> dict[str, str]:
    """What the kubelet, the CSI driver, NFD and GKE annotate, the caller's annotations on top."""
    return {
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "csi.volume.kubernetes.io/nodeid": json.dumps({"pd.csi.storage.gke.io": state.provider_id or name}),
        "nfd.node.kubernetes.io/feature-labels": ",".join(k.split("/", 1)[1] for k in labels.nfd),
        "nfd.node.kubernetes.io/extended-resources": "",
        "node.gke.io/last-applied-node-labels": ",".join(f"{k}={v}" for k, v in labels.cloud.items()),
        "node.gke.io/last-applied-node-taints": "",
        **state.annotations,
    }


def _node_resources() -> tuple[Obj, Obj]:
    """Capacity and allocatable: 208 vCPU, 1.8 TiB of memory, 8 GPUs, 32 pods."""
    gib = 1024 * 1024  # Ki per GiB
    capacity = {
        "cpu": "208", "ephemeral-storage": f"{3_500 * gib}Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0",
        "memory": f"{1_872 * gib}Ki", "nvidia.com/gpu": "8", "pods": "32",
    }  # fmt: skip
    allocatable = {
        **capacity, "cpu": "207690m", "ephemeral-storage": "3403839467326", "memory": f"{1_823 * gib}Ki",
    }  # fmt: skip
    return capacity, allocatable


def _node_conditions(ready: str, now: str) -> list[Obj]:
    """node-problem-detector's five conditions, then the kubelet's, Ready last."""

    def condition(type_: str, status_: str, why: tuple[str, str]) -> Obj:
        reason, message = why
        return {
            "type": type_, "status": status_, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }  # fmt: skip

    return [
        condition("FrequentContainerdRestart", "False", ("NoFrequentContainerdRestart", "containerd is functioning properly")),
        condition("KernelDeadlock", "False", ("KernelHasNoDeadlock", "kernel has no deadlock")),
        condition("ReadonlyFilesystem", "False", ("FilesystemIsNotReadOnly", "Filesystem is not read-only")),
        condition("FrequentKubeletRestart", "False", ("NoFrequentKubeletRestart", "kubelet is functioning properly")),
        condition("FrequentUnregisterNetDevice", "False", ("NoFrequentUnregisterNetDevice", "node is functioning properly")),
        {**condition("NetworkUnavailable", "False", ("RouteCreated", "NodeController create implicit route")),
         "lastHeartbeatTime": now},
        condition("MemoryPressure", "False", ("KubeletHasSufficientMemory", "kubelet has sufficient memory available")),
        condition("DiskPressure", "False", ("KubeletHasNoDiskPressure", "kubelet has no disk pressure")),
        condition("PIDPressure", "False", ("KubeletHasSufficientPID", "kubelet has sufficient PID available")),
        condition("Ready", ready, ("KubeletReady", "kubelet is posting ready status") if ready == "True"
                  else ("KubeletNotReady", "container runtime is down")),
    ]  # fmt: skip


def _node_images() -> list[Obj]:
    """The container images on the node's disk, by digest and by tag."""
    return [
        {
            "names": [f"{repo}@{_digest(repo + tag)}", f"{repo}:{tag.split('@')[0]}"],
            "sizeBytes": size,
        }
        for repo, tag, size in _IMAGES
    ]


def _node_spec(h: int, state: NodeState) -> Obj:
    """The pod CIDR the controller manager assigned, the provider ID, and any cordon and taints."""
    spec: Obj = {"podCIDR": f"10.{64 + h % 64}.{(h >> 4) % 256}.0/26"}
    spec["podCIDRs"] = [spec["podCIDR"]]
    if state.provider_id:
        spec["providerID"] = state.provider_id
    if state.unschedulable:
        spec["unschedulable"] = True
    if state.taints:
        spec["taints"] = state.taints
    return spec


def _node_managed_fields(
    labels: _NodeLabels, spec: Obj, conditions: list[Obj], *, resources: tuple[Obj, Obj], azure: bool
) -> list[tuple[str, str, str | None, Obj]]:
    """Each writer's (manager, operation, subresource, fieldsV1): the fields it owns."""
    capacity, allocatable = resources
    base, cloud, gpu, nfd = labels
    return [
        ("kubelet", "Update", None, {"f:metadata": {"f:annotations": _fields(["node.alpha.kubernetes.io/ttl", "volumes.kubernetes.io/controller-managed-attach-detach"]), "f:labels": _fields(list(base))}, "f:spec": _fields(["podCIDR", "podCIDRs", "providerID"])}),
        ("kube-controller-manager", "Update", None, {"f:spec": {"f:podCIDR": {}, "f:podCIDRs": {".": {}, f'v:"{spec["podCIDR"]}"': {}}}}),
        ("gcp-controller-manager" if not azure else "cloud-node-manager", "Update", None, {"f:metadata": {"f:annotations": _fields(["node.gke.io/last-applied-node-labels", "node.gke.io/last-applied-node-taints"]), "f:labels": _fields(list(cloud))}}),
        ("nfd-master", "Update", None, {"f:metadata": {"f:annotations": _fields(["nfd.node.kubernetes.io/feature-labels", "nfd.node.kubernetes.io/extended-resources"]), "f:labels": _fields(list(nfd))}}),
        ("gpu-feature-discovery", "Update", None, {"f:metadata": {"f:labels": _fields(list(gpu))}}),
        ("node-problem-detector", "Update", "status", {"f:status": {"f:conditions": {f'k:{{"type":"{c["type"]}"}}': {".": {}, "f:lastHeartbeatTime": {}, "f:lastTransitionTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}, "f:type": {}} for c in conditions[:5]}}}),
        ("kubelet", "Update", "status", {"f:status": {"f:allocatable": _fields(list(allocatable)), "f:capacity": _fields(list(capacity)), "f:conditions": {f'k:{{"type":"{c["type"]}"}}': {"f:lastHeartbeatTime": {}, "f:lastTransitionTime": {}, "f:message": {}, "f:reason": {}, "f:status": {}} for c in conditions[6:]}, "f:images": {}, "f:nodeInfo": {"f:bootID": {}, "f:kernelVersion": {}, "f:kubeletVersion": {}}, "f:runtimeHandlers": {}}}),
    ]  # fmt: skip


def _node_info(name: str, h: int, boot_id: str, *, azure: bool) -> Obj:
    """The kubelet's ``nodeInfo``: machine and system IDs from the name, the OS of the cloud's image."""
    return {
        "machineID": uuid.UUID(int=h << 64 | _h(name, "m")).hex,
        "systemUUID": str(uuid.UUID(int=_h(name, "s") << 64 | h)),
        "bootID": boot_id,
        "kernelVersion": "6.1.112+" if not azure else "5.15.0-1079-azure",
        "osImage": "Container-Optimized OS from Google" if not azure else "Ubuntu 22.04.5 LTS",
        "containerRuntimeVersion": "containerd://1.7.24",
        "kubeletVersion": KUBELET_VERSION,
        "kubeProxyVersion": KUBELET_VERSION,
        "operatingSystem": "linux",
        "architecture": "amd64",
    }


@dataclass(frozen=True)
class PodState:
    """What the caller sets on a Pod: where it runs, who owns it (kind, name, uid), its phase."""

    node_name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    owner: tuple[str, str, str] | None = None  # (kind, name, uid)
    mirror: bool = False
    phase: str = "Running"
    terminating: bool = False
    empty_dir: bool = False


def pod_object(namespace: str, name: str, state: PodState, *, now: str) -> Obj:
    """A Pod as the API holds it once scheduled (or pending, without ``node_name``)."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": _pod_metadata(namespace, name, state, now=now),
        "spec": _pod_spec(state),
        "status": _pod_status(f"{namespace}/{name}", name, state, now=now),
    }


def _pod_metadata(namespace: str, name: str, state: PodState, *, now: str) -> Obj:
    """Name, labels, the owner reference, the mirror annotation and a deletion in progress."""
    meta: Obj = {"name": name, "namespace": namespace, "labels": dict(state.labels), "annotations": {}}
    if state.owner:
        kind, owner_name, uid = state.owner
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": kind, "name": owner_name, "uid": uid,
             "controller": True, "blockOwnerDeletion": True},
        ]  # fmt: skip
    if state.mirror:
        meta["annotations"]["kubernetes.io/config.mirror"] = uuid.uuid4().hex
    if state.terminating:
        meta["deletionTimestamp"] = now
        meta["deletionGracePeriodSeconds"] = 30
    return meta


def _pod_spec(state: PodState) -> Obj:
    """One busybox container with requests, the default tolerations and an ``emptyDir`` if asked."""
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}] if state.empty_dir else []
    spec: Obj = {
        "containers": [
            {
                "name": "main",
                "image": "docker.io/library/busybox:1.37",
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "128Mi"}},
                "volumeMounts": mounts,
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "schedulerName": "default-scheduler",
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        ],
    }  # fmt: skip
    if state.empty_dir:
        spec["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if state.node_name:
        spec["nodeName"] = state.node_name
    return spec


def _pod_status(key: str, name: str, state: PodState, *, now: str) -> Obj:
    """The phase and, once scheduled, the IPs (from ``key``'s hash), conditions and container status."""
    h = _h(key)
    phase = state.phase
    running = phase == "Running"
    status: Obj = {"phase": phase, "qosClass": "Burstable"}
    if state.node_name:
        status.update(
            hostIP=f"10.{(h >> 8) % 256}.{(h >> 16) % 256}.{2 + (h >> 24) % 250}",
            podIP=f"10.{64 + h % 64}.{(h >> 4) % 256}.{2 + (h >> 12) % 60}",
            startTime=now,
            conditions=[
                {"type": t, "status": "True" if running or t == "PodScheduled" else "False", "lastTransitionTime": now}
                for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            containerStatuses=[
                {
                    "name": "main", "image": "docker.io/library/busybox:1.37",
                    "imageID": "docker.io/library/busybox@" + _digest("busybox:1.37"),
                    "containerID": f"containerd://{hashlib.sha256(name.encode()).hexdigest()}",
                    "ready": running, "restartCount": 0, "started": running,
                    "state": {"running": {"startedAt": now}} if running else
                    {"terminated": {"exitCode": 0 if phase == "Succeeded" else 1, "reason": "Completed" if phase == "Succeeded" else "Error",
                                    "startedAt": now, "finishedAt": now}},
                }
            ],
        )  # fmt: skip
        status["podIPs"] = [{"ip": status["podIP"]}]
        status["hostIPs"] = [{"ip": status["hostIP"]}]
    return status


def daemonset_object(namespace: str, name: str, labels: dict[str, str]) -> Obj:
    match = dict(labels) or {"app.kubernetes.io/name": name}
    return {
        "kind": "DaemonSet",
        "apiVersion": "apps/v1",
        "metadata": {"name": name, "namespace": namespace, "generation": 1, "labels": dict(match)},
        "spec": {
            "selector": {"matchLabels": match},
            "template": {
                "metadata": {"labels": match},
                "spec": {"containers": [{"name": "main", "image": "docker.io/library/busybox:1.37"}]},
            },
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0},
            },
            "revisionHistoryLimit": 10,
        },
        "status": {
            "currentNumberScheduled": 0,
            "numberMisscheduled": 0,
            "desiredNumberScheduled": 0,
            "numberReady": 0,
            "observedGeneration": 1,
        },
    }


def node_lease_object(name: str, now_micro: str) -> Obj:
    """The kubelet's heartbeat Lease in kube-node-lease (``describe node`` shows its holder)."""
    return {
        "kind": "Lease",
        "apiVersion": "coordination.k8s.io/v1",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now_micro},
    }
