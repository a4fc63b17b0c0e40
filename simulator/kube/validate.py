"""Write-time validation of Nodes, as the apiserver's registry strategy does before storing a patch: a wrong
JSON type or a bad taint or label is a 422 in the apiserver's ``field: reason`` form. Only the fields
clients write are checked.

Why: docs/kubernetes.md#inside-the-local-kube-apiserver
"""

from __future__ import annotations

import re
from typing import Any

Obj = dict[str, Any]

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_QUALIFIED = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _key_errors(field: str, key: object) -> list[str]:
    if not isinstance(key, str):
        return [f"{field}: Invalid value: {key!r}: must be a string"]
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return [f"{field}: Invalid value: {key!r}: prefix part must be a lowercase RFC 1123 subdomain"]
    if not name or len(name) > 63 or not _QUALIFIED.match(name):
        return [
            f"{field}: Invalid value: {key!r}: name part must consist of alphanumeric characters, '-', '_' "
            "or '.', and must start and end with an alphanumeric character"
        ]
    return []


def _string_map(field: str, value: object, *, labels: bool) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, dict):
        return [f"{field}: Invalid value: must be an object of strings"]
    errors: list[str] = []
    for key, item in value.items():
        errors += _key_errors(f"{field}", key)
        if not isinstance(item, str):
            errors.append(f"{field}[{key}]: Invalid value: {item!r}: must be a string")
        elif labels and (len(item) > 63 or (item and not _QUALIFIED.match(item))):
            errors.append(
                f"{field}[{key}]: Invalid value: {item!r}: a valid label must be 63 characters or less"
            )
    return errors


def metadata_errors(obj: Obj) -> list[str]:
    """What the apiserver would refuse in any object's labels and annotations."""
    meta = obj.get("metadata") or {}
    return [*_string_map("metadata.labels", meta.get("labels"), labels=True),
            *_string_map("metadata.annotations", meta.get("annotations"), labels=False)]


def node_errors(node: Obj) -> list[str]:
    """What the apiserver would refuse in this Node; empty when it is valid."""
    spec, status = node.get("spec") or {}, node.get("status") or {}
    errors = metadata_errors(node)
    if not isinstance(spec, dict) or not isinstance(status, dict):
        return [*errors, "spec, status: Invalid value: must be objects"]
    if "unschedulable" in spec and not isinstance(spec["unschedulable"], bool):
        errors.append(f"spec.unschedulable: Invalid value: {spec['unschedulable']!r}: must be a boolean")
    taints = spec.get("taints") or []
    if not isinstance(taints, list):
        errors.append("spec.taints: Invalid value: must be a list")
        taints = []
    for i, taint in enumerate(taints):
        where = f"spec.taints[{i}]"
        if not isinstance(taint, dict):
            errors.append(f"{where}: Invalid value: must be an object")
            continue
        errors += _key_errors(f"{where}.key", taint.get("key"))
        if taint.get("effect") not in TAINT_EFFECTS:
            errors.append(
                f"{where}.effect: Unsupported value: {taint.get('effect')!r}: supported values: "
                + ", ".join(f'"{e}"' for e in TAINT_EFFECTS)
            )
        if not isinstance(taint.get("value", ""), str):
            errors.append(f"{where}.value: Invalid value: must be a string")
        if set(taint) - {"key", "value", "effect", "timeAdded"}:
            errors.append(
                f"{where}: unknown field(s) {sorted(set(taint) - {'key', 'value', 'effect', 'timeAdded'})}"
            )
    conditions = status.get("conditions") or []
    if not isinstance(conditions, list):
        return [*errors, "status.conditions: Invalid value: must be a list"]
    for i, cond in enumerate(conditions):
        where = f"status.conditions[{i}]"
        if not isinstance(cond, dict) or not isinstance(cond.get("type"), str) or not cond["type"]:
            errors.append(f"{where}.type: Required value")
            continue
        if not isinstance(cond.get("status"), str):
            errors.append(f"{where}.status: Required value")
        allowed = {"type", "status", "reason", "message", "lastHeartbeatTime", "lastTransitionTime"}
        for key in set(cond) - allowed:
            errors.append(f"{where}: unknown field {key!r}")
        for key in set(cond) & {"reason", "message", "lastHeartbeatTime", "lastTransitionTime"}:
            if not isinstance(cond[key], str):
                errors.append(f"{where}.{key}: Invalid value: must be a string")
    return errors
