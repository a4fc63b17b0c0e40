"""The scheduler's filters for a pod the fake kube-apiserver places itself: a pod without ``nodeName``.

A Node fits when it matches the pod's required node affinity (``In``, ``NotIn``, ``Exists``,
``DoesNotExist``), the pod tolerates its NoSchedule/NoExecute taints and cordon, and no running or
pending pod its required pod anti-affinity selects sits in the same topology domain. The first Node
by name that fits is taken; none: the pod stays Pending, ``PodScheduled`` False, reason Unschedulable.

Why: docs/kubernetes.md#inside-the-local-kube-apiserver
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Obj = dict[str, Any]
UNSCHEDULABLE = "node.kubernetes.io/unschedulable"


def tolerated(spec: Obj, node: Obj) -> bool:
    """Whether the pod tolerates every NoSchedule and NoExecute taint of ``node`` and its cordon."""
    tolerations = spec.get("tolerations") or []
    taints = list(node["spec"].get("taints") or [])
    if node["spec"].get("unschedulable"):
        taints.append({"key": UNSCHEDULABLE, "effect": "NoSchedule"})
    for taint in taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            return False
    return True


def _tolerates(toleration: Obj, taint: Obj) -> bool:
    if toleration.get("effect") not in (None, "", taint["effect"]):
        return False
    if toleration.get("operator") == "Exists":
        return toleration.get("key") in (None, "", taint["key"])
    return bool(toleration.get("key") == taint["key"] and toleration.get("value", "") == taint.get("value", ""))


def pick(spec: Obj, nodes: dict[str, Obj], pods: Iterable[Obj], *, namespace: str) -> tuple[str | None, str]:
    """The Node the pod goes to, or None and the scheduler's message saying why none fits."""
    placed = [p for p in pods if p["spec"].get("nodeName") and p["status"].get("phase") in ("Pending", "Running")
              and p["metadata"].get("namespace") == namespace]
    reasons: dict[str, int] = {}
    for name in sorted(nodes):
        why = _misfit(spec, nodes[name], nodes=nodes, placed=placed)
        if why is None:
            return name, ""
        reasons[why] = reasons.get(why, 0) + 1
    said = ", ".join(f"{n} node(s) {why}" for why, n in sorted(reasons.items()))
    return None, f"0/{len(nodes)} nodes are available: {said}."


def _misfit(spec: Obj, node: Obj, *, nodes: dict[str, Obj], placed: list[Obj]) -> str | None:
    labels = node["metadata"].get("labels") or {}
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required and not any(_matches(term.get("matchExpressions") or [], labels)
                            for term in required.get("nodeSelectorTerms") or []):
        return "didn't match Pod's node affinity/selector"
    if not tolerated(spec, node):
        return "had untolerated taint"
    for term in (((spec.get("affinity") or {}).get("podAntiAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution") or []):
        key = term["topologyKey"]
        here = labels.get(key)
        for pod in placed:
            there = (nodes.get(pod["spec"]["nodeName"]) or {}).get("metadata", {}).get("labels", {}).get(key)
            if here is not None and there == here and _selects(term.get("labelSelector") or {}, pod):
                return "didn't match pod anti-affinity rules"
    return None


def _matches(expressions: list[Obj], labels: dict[str, str]) -> bool:
    for e in expressions:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}.get(op, False)
        if not ok:
            return False
    return True


def _selects(selector: Obj, pod: Obj) -> bool:
    labels = pod["metadata"].get("labels") or {}
    wanted = selector.get("matchLabels") or {}
    return all(labels.get(k) == v for k, v in wanted.items()) and _matches(
        selector.get("matchExpressions") or [], labels)
