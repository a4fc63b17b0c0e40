"""What the Kubernetes watcher reads of a Node, and nothing more: name, resourceVersion, the domain and
profile labels, conditions. A relist page is decoded straight into those with msgspec; :func:`slim` cuts a
watch event to the same shape. Repeated strings are shared across Nodes.

Why: docs/architecture.md#the-kubernetes-watchers-memory-does-not-grow-with-the-answer
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from typing import Any

import msgspec

CONDITION_FIELDS = ("type", "status", "reason", "message", "lastTransitionTime")


class _Condition(msgspec.Struct):
    type: str
    status: str = ""
    reason: str | None = None
    message: str | None = None
    lastTransitionTime: str | None = None  # noqa: N815 - the API's field name


class _Meta(msgspec.Struct):
    name: str
    resourceVersion: str = ""  # noqa: N815
    labels: dict[str, str] = {}


class _Status(msgspec.Struct):
    conditions: list[_Condition] | None = None


class _Node(msgspec.Struct):
    metadata: _Meta
    status: _Status | None = None


class _ListMeta(msgspec.Struct):
    resourceVersion: str = ""  # noqa: N815
    next: str | None = msgspec.field(name="continue", default=None)


class _NodeList(msgspec.Struct):
    metadata: _ListMeta
    items: list[_Node] | None = None


_decoder = msgspec.json.Decoder(_NodeList)


def _shared(text: str | None) -> str | None:
    return None if text is None else sys.intern(text)


def _kept(meta: _Meta, conditions: list[_Condition], label_keys: Collection[str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": meta.name,
            "resourceVersion": meta.resourceVersion,
            "labels": {k: sys.intern(meta.labels[k]) for k in label_keys if k in meta.labels},
        },
        "status": {
            "conditions": [
                {
                    k: v
                    for k, v in zip(
                        CONDITION_FIELDS,
                        (sys.intern(c.type), sys.intern(c.status), _shared(c.reason), _shared(c.message),
                         _shared(c.lastTransitionTime)),
                        strict=True,
                    )
                    if v is not None
                }
                for c in conditions
            ]
        },
    }  # fmt: skip


def decode_page(data: bytes, label_keys: Collection[str]) -> tuple[list[dict[str, Any]], str, str | None]:
    """A NodeList page's Nodes (as :func:`slim` keeps them), resourceVersion and continue token.
    A body that is not a NodeList raises ``ValueError`` (msgspec's DecodeError is one)."""
    page = _decoder.decode(data)
    nodes = [
        _kept(n.metadata, (n.status and n.status.conditions) or [], label_keys) for n in page.items or []
    ]
    return nodes, page.metadata.resourceVersion, page.metadata.next


def slim(node: dict[str, Any], label_keys: Collection[str]) -> dict[str, Any]:
    """The parts of a parsed Node the watcher reads; the rest of its JSON is let go at once."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    conditions = (node.get("status") or {}).get("conditions") or []
    return {
        "metadata": {
            "name": meta["name"],
            "resourceVersion": meta.get("resourceVersion", ""),
            "labels": {k: labels[k] for k in label_keys if k in labels},
        },
        "status": {"conditions": [{k: c[k] for k in CONDITION_FIELDS if k in c} for c in conditions]},
    }
