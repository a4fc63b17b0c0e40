"""The three PATCH kinds the kube-apiserver accepts for built-in types, applied to plain dicts: merge (RFC
7386), strategic merge (per-type merge keys; ``spec.taints`` has none, so it is replaced whole) and JSON
patch (RFC 6902; a failing op is a 422).

Why: docs/kubernetes.md#inside-the-local-kube-apiserver
"""

from __future__ import annotations

import copy
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

# patchMergeKey of the lists that have one, per resource, by dotted path.
MERGE_KEYS: dict[str, dict[str, str]] = {
    "nodes": {
        "status.conditions": "type",
        "status.addresses": "type",
        "status.volumesAttached": "name",
        "metadata.ownerReferences": "uid",
    },
    "pods": {
        "spec.containers": "name",
        "spec.volumes": "name",
        "status.conditions": "type",
        "metadata.ownerReferences": "uid",
    },
}


class PatchError(ValueError):
    """A patch the server refuses; ``code`` is the HTTP status it answers with (400, 415 or 422)."""

    def __init__(self, message: str, code: int = 422) -> None:
        super().__init__(message)
        self.code = code


def apply_patch(resource: str, obj: dict[str, Any], patch: Any, *, content_type: str) -> dict[str, Any]:
    """Return a patched deep copy of ``obj``."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == JSON_PATCH:
        if not isinstance(patch, list):
            raise PatchError("json patch must be a list of operations", 400)
        return json_patch(obj, patch)
    if not isinstance(patch, dict):
        raise PatchError("patch body must be a JSON object", 400)
    if kind == MERGE_PATCH:
        return merge_patch(obj, patch)
    if kind == STRATEGIC_PATCH:
        return _strategic(obj, patch, MERGE_KEYS.get(resource, {}), path="")
    raise PatchError(
        f"the body of the request was in an unknown format - accepted media types "
        f"include: {JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_PATCH}",
        415,
    )


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _strategic(target: Any, patch: dict[str, Any], keys: dict[str, str], *, path: str) -> Any:
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):  # $setElementOrder/..., $retainKeys: ordering hints only
            continue
        sub = f"{path}.{key}" if path else key
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _strategic(result.get(key), value, keys, path=sub)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and sub in keys:
            result[key] = _merge_list(result.get(key) or [], value, keys[sub], keys=keys, path=sub)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _merge_list(
    current: list[Any], patch: list[Any], merge_key: str, *, keys: dict[str, str], path: str
) -> list[Any]:
    result = copy.deepcopy(current)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise PatchError(f"map: {item!r} does not contain declared merge key: {merge_key}", 400)
        index = next((i for i, cur in enumerate(result) if cur.get(merge_key) == item[merge_key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append({k: v for k, v in copy.deepcopy(item).items() if not k.startswith("$")})
        else:
            result[index] = _strategic(result[index], item, keys, path=path)
    return result


# ------------------------------------------------------------------------------------ RFC 6902


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    cur = doc
    for part in parts[:-1]:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise PatchError(f"doc is missing path: {path}")
    return cur, parts[-1]


def _read(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchError(f"doc is missing path: {path}")


def _add(doc: Any, path: str, value: Any) -> None:
    parent, last = _parent(doc, _pointer(path), path)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        index = len(parent) if last == "-" else int(last) if last.isdigit() else -1
        if not 0 <= index <= len(parent):
            raise PatchError(f"add operation index out of bounds: {path}")
        parent.insert(index, value)
    else:
        raise PatchError(f"doc is missing path: {path}")


def _remove(doc: Any, path: str) -> Any:
    value = _read(doc, path)
    parent, last = _parent(doc, _pointer(path), path)
    if isinstance(parent, dict):
        del parent[last]
    else:
        del parent[int(last)]
    return value


def json_patch(obj: dict[str, Any], ops: list[Any]) -> dict[str, Any]:
    doc = copy.deepcopy(obj)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError("json patch operations need 'op' and 'path'", 400)
        name, path = op["op"], op["path"]
        if name == "test":
            if _read(doc, path) != op.get("value"):
                raise PatchError(f"testing value {path} failed: test failed")
        elif name == "add":
            _add(doc, path, copy.deepcopy(op.get("value")))
        elif name == "remove":
            _remove(doc, path)
        elif name == "replace":
            _read(doc, path)  # must exist
            parent, last = _parent(doc, _pointer(path), path)
            parent[int(last) if isinstance(parent, list) else last] = copy.deepcopy(op.get("value"))
        elif name in ("move", "copy"):
            value = _remove(doc, op["from"]) if name == "move" else copy.deepcopy(_read(doc, op["from"]))
            _add(doc, path, value)
        else:
            raise PatchError(f"unexpected kind of operation: {name}", 400)
    return doc
