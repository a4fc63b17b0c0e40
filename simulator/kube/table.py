"""Server-side printing: the ``meta.k8s.io/v1`` Table a real apiserver renders for ``kubectl get``.

Columns and cells follow the apiserver's printers for Nodes, Pods, PodDisruptionBudgets and Events; other
kinds get the default table. Rows carry metadata, the object, or nothing (``includeObject``).

Why: docs/kubernetes.md#inside-the-local-kube-apiserver
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from remediation.simulator.kube.discovery import Resource

Obj = dict[str, Any]


def wants_table(accept: str) -> bool:
    return any("as=Table" in part and "g=meta.k8s.io" in part for part in accept.replace(" ", "").split(","))


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery's duration.HumanDuration."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    return f"{hours // 24 // 365}y"


def _age(obj: Obj) -> str:
    created = obj["metadata"].get("creationTimestamp")
    if not created:
        return "<unknown>"
    then = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return human_duration((datetime.now(UTC) - then).total_seconds())


def _col(name: str, type_: str, description: str, *, priority: int = 0, format_: str = "") -> Obj:
    return {"name": name, "type": type_, "format": format_, "description": description, "priority": priority}


NODE_COLUMNS = [
    _col("Name", "string", "Name must be unique within a namespace.", format_="name"),
    _col("Status", "string", "The status of the node"),
    _col("Roles", "string", "The roles of the node"),
    _col("Age", "string", "CreationTimestamp is a timestamp representing the server time when this object was created."),
    _col("Version", "string", "Kubelet Version reported by the node."),
    _col("Internal-IP", "string", "List of addresses reachable to the node.", priority=1),
    _col("External-IP", "string", "List of addresses reachable to the node.", priority=1),
    _col("OS-Image", "string",
         "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).", priority=1),
    _col("Kernel-Version", "string",
         "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).", priority=1),
    _col("Container-Runtime", "string",
         "Container runtime version reported by the node through runtime remote API (e.g. containerd://1.4.2).", priority=1),
]  # fmt: skip

POD_COLUMNS = [
    _col("Name", "string", "Name must be unique within a namespace.", format_="name"),
    _col("Ready", "string", "The aggregate readiness state of this pod for accepting traffic."),
    _col("Status", "string", "The aggregate status of the containers in this pod."),
    _col("Restarts", "string", "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
    _col("Age", "string", "CreationTimestamp is a timestamp representing the server time when this object was created."),
    _col("IP", "string",
         "IP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.", priority=1),
    _col("Node", "string", "NodeName is a request to schedule this pod onto a specific node.", priority=1),
    _col("Nominated Node", "string",
         "nominatedNodeName is set when this pod preempts other pods on the node.", priority=1),
    _col("Readiness Gates", "string",
         "If specified, all readiness gates will be evaluated for pod readiness.", priority=1),
]  # fmt: skip

PDB_COLUMNS = [
    _col("Name", "string", "Name must be unique within a namespace.", format_="name"),
    _col("Min Available", "string", "The minimum number of pods that must be available simultaneously. This can be either an integer or a string specifying a percentage, e.g. \"28%\"."),
    _col("Max Unavailable", "string", "The maximum number of pods that may be unavailable simultaneously. This can be either an integer or a string specifying a percentage, e.g. \"28%\"."),
    _col("Allowed Disruptions", "integer", "Calculated number of pods that may be disrupted at this time."),
    _col("Age", "string", "CreationTimestamp is a timestamp representing the server time when this object was created."),
]  # fmt: skip

EVENT_COLUMNS = [
    _col("Last Seen", "string", "Time when last Event occurred"),
    _col("Type", "string", "Type of this event (Normal, Warning), new types could be added in the future."),
    _col("Reason", "string", "Reason is why the action was taken. It is human-readable. This field can have at most 128 characters."),
    _col("Object", "string", "The object that this event is about."),
    _col("Subobject", "string", "The subobject that this event is about.", priority=1),
    _col("Source", "string",
         "The component reporting this event. Should be a short machine understandable string.", priority=1),
    _col("Message", "string", "A human-readable description of the status of this operation."),
    _col("First Seen", "string", "Time when first Event occurred", priority=1),
    _col("Count", "string", "The number of times this event has occurred.", priority=1),
    _col("Name", "string", "Name must be unique within a namespace.", priority=1, format_="name"),
]  # fmt: skip

DEFAULT_COLUMNS = [
    _col("Name", "string", "Name must be unique within a namespace.", format_="name"),
    _col("Created At", "date", "CreationTimestamp is a timestamp representing the server time when this object was created."),
]  # fmt: skip


def _node_cells(node: Obj) -> list[Any]:
    status = node.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    state = {"True": "Ready", "False": "NotReady"}.get((ready or {}).get("status", ""), "Unknown")
    if (node.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = node["metadata"].get("labels") or {}
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))
    roles += [labels["kubernetes.io/role"]] if "kubernetes.io/role" in labels else []
    addresses = {a["type"]: a["address"] for a in reversed(status.get("addresses") or [])}
    info = status.get("nodeInfo") or {}
    return [
        node["metadata"]["name"], state, ",".join(roles) or "<none>", _age(node), info.get("kubeletVersion", ""),
        addresses.get("InternalIP", "<none>"), addresses.get("ExternalIP", "<none>"),
        info.get("osImage") or "<unknown>", info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]  # fmt: skip


def _pod_cells(pod: Obj) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    reason = status.get("reason") or status.get("phase") or "Unknown"
    for cs in statuses:
        state = cs.get("state") or {}
        if "waiting" in state and state["waiting"].get("reason"):
            reason = state["waiting"]["reason"]
        elif "terminated" in state:
            reason = state["terminated"].get("reason") or f"ExitCode:{state['terminated'].get('exitCode', 0)}"
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    ready = sum(1 for cs in statuses if cs.get("ready"))
    return [
        pod["metadata"]["name"], f"{ready}/{len(spec.get('containers') or [])}", reason,
        str(sum(int(cs.get("restartCount", 0)) for cs in statuses)), _age(pod),
        status.get("podIP") or "<none>", spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>", "<none>",
    ]  # fmt: skip


def _since(stamp: str | None) -> str:
    if not stamp:
        return "<unknown>"
    then = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return human_duration((datetime.now(UTC) - then).total_seconds())


def _pdb_cells(pdb: Obj) -> list[Any]:
    spec, status = pdb.get("spec") or {}, pdb.get("status") or {}
    return [
        pdb["metadata"]["name"], str(spec.get("minAvailable", "N/A")), str(spec.get("maxUnavailable", "N/A")),
        int(status.get("disruptionsAllowed", 0)), _age(pdb),
    ]  # fmt: skip


def _event_cells(event: Obj) -> list[Any]:
    involved = event.get("involvedObject") or {}
    source = event.get("source") or {}
    return [
        _since(event.get("lastTimestamp")), event.get("type", ""), event.get("reason", ""),
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}", involved.get("fieldPath", ""),
        ", ".join(v for v in (source.get("component"), source.get("host")) if v), event.get("message", ""),
        _since(event.get("firstTimestamp")), str(event.get("count", 1)), event["metadata"]["name"],
    ]  # fmt: skip


_CELLS = {
    "nodes": _node_cells,
    "pods": _pod_cells,
    "poddisruptionbudgets": _pdb_cells,
    "events": _event_cells,
}


def _row(res: Resource, obj: Obj, include: str) -> Obj:
    if res.name in _CELLS:
        cells = _CELLS[res.name](obj)
    else:
        cells = [obj["metadata"]["name"], obj["metadata"].get("creationTimestamp")]
    row: Obj = {"cells": cells}
    if include == "Object":
        row["object"] = obj
    elif include != "None":
        row["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"],
        }
    return row


def columns(res: Resource) -> list[Obj]:
    by_resource = {
        "nodes": NODE_COLUMNS,
        "pods": POD_COLUMNS,
        "poddisruptionbudgets": PDB_COLUMNS,
        "events": EVENT_COLUMNS,
    }
    return by_resource.get(res.name, DEFAULT_COLUMNS)


def table(res: Resource, objs: list[Obj], rv: str, *, include: str, with_columns: bool = True) -> Obj:
    out: Obj = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv}}
    out["columnDefinitions"] = columns(res) if with_columns else None
    out["rows"] = [_row(res, o, include) for o in objs]
    return out
