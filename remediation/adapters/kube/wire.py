"""What the adapter reads of a Node, decoded straight from the apiserver's JSON with msgspec.

Only a handful of fields are decoded; the rest is skipped without making objects. A taint is decoded
whole, because the taint patch writes the list back.

Why: docs/architecture.md#a-mass-failure-is-isolated-in-batches
"""

from __future__ import annotations

from typing import Any

import msgspec


class Taint(msgspec.Struct, omit_defaults=True):
    key: str
    effect: str
    value: str | None = None
    timeAdded: str | None = None  # noqa: N815 - the API's field name


class Condition(msgspec.Struct):
    type: str
    status: str = "Unknown"
    reason: str | None = None
    message: str | None = None

    @property
    def said(self) -> str:
        """What the condition says, as the watcher reads it: "KubeletNotReady: PLEG is not healthy"."""
        return ": ".join(p for p in (self.reason, self.message) if p)


class NodeInfo(msgspec.Struct):
    bootID: str = ""  # noqa: N815


class Meta(msgspec.Struct):
    name: str
    resourceVersion: str = ""  # noqa: N815
    annotations: dict[str, str] | None = None


class Spec(msgspec.Struct):
    unschedulable: bool | None = None
    providerID: str | None = None  # noqa: N815
    taints: list[Taint] | None = None


class Status(msgspec.Struct):
    conditions: list[Condition] | None = None
    nodeInfo: NodeInfo | None = None  # noqa: N815


class Node(msgspec.Struct):
    metadata: Meta
    spec: Spec = msgspec.field(default_factory=Spec)
    status: Status = msgspec.field(default_factory=Status)

    @property
    def annotations(self) -> dict[str, str]:
        return self.metadata.annotations or {}

    @property
    def cordoned(self) -> bool:
        return bool(self.spec.unschedulable)

    @property
    def taints(self) -> list[Taint]:
        return self.spec.taints or []


_decoder = msgspec.json.Decoder(Node)


def decode_node(data: bytes) -> Node:
    return _decoder.decode(data)


def as_json(taints: list[Taint]) -> list[dict[str, Any]]:
    """The taints as the API writes them (absent fields left out)."""
    return [msgspec.to_builtins(t) for t in taints]
