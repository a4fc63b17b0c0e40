"""The Kubernetes watcher's failure domains: configured Node labels in, DOMAINS events out (and, the same
way, the labels the profiles' selectors name: LABELS events).

A Node's values of ``incidents.label_keys`` are its failure domains; on a change (and on the first list)
one ``DOMAINS`` event goes out per Slurm node on it, through :class:`remediation.watchers.kube.mapping.SlurmNames`.
``LABELS`` does the same for the keys profiles select on.

Why: docs/policy.md#correlated-incidents-half-a-domain-or-4-of-its-nodes-within-2-minutes
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.topology import label_domains
from remediation.watchers.kube.mapping import SlurmNames

log = logging.getLogger("remediation.watchers.kube.watcher")


class DomainLabels:
    def __init__(self, keys: list[str], enabled: bool = True, kind: EventKind = EventKind.DOMAINS) -> None:
        self.keys = list(keys) if enabled else []
        self.kind = kind
        self.sent: dict[str, dict[str, str]] = {}  # Node -> domains published
        self.pending: dict[str, tuple[dict[str, str], float]] = {}  # Node -> (domains, since)

    def observe(self, node: dict[str, Any]) -> None:
        if not self.keys:
            return
        name = node["metadata"]["name"]
        labels = (node.get("metadata") or {}).get("labels") or {}
        domains = label_domains(labels, self.keys) if self.kind is EventKind.DOMAINS else {
            k: str(labels[k]) for k in self.keys if k in labels}
        before = self.sent.get(name)
        if before == domains or (before is None and not domains):  # nothing new (a Node without any)
            self.pending.pop(name, None)
        elif self.pending.get(name, ({}, 0.0))[0] != domains or name not in self.pending:
            self.pending[name] = (domains, time.monotonic())

    def forget(self, name: str) -> None:
        self.sent.pop(name, None)
        self.pending.pop(name, None)

    def events(self, names: SlurmNames) -> list[NodeEvent]:
        """DOMAINS events for the changes whose Slurm nodes are known now (the rest keep waiting)."""
        out: list[NodeEvent] = []
        now = datetime.now(UTC)
        for node, (domains, since) in list(self.pending.items()):
            slurm_nodes = names.on(node, since)
            if slurm_nodes is None:
                continue
            del self.pending[node]
            self.sent[node] = domains
            digest = hashlib.sha256(json.dumps(domains, sort_keys=True).encode()).hexdigest()[:16]
            for slurm_node in slurm_nodes:
                try:
                    out.append(NodeEvent(
                        source=Source.KUBERNETES, node=slurm_node, kind=self.kind, state="labels",
                        **{"domains" if self.kind is EventKind.DOMAINS else "labels": domains},
                        observed_at=now, published_at=now,
                        reason=f"Node {node}: " + (", ".join(f"{k}={v}" for k, v in sorted(domains.items()))
                                                   or "no domain labels"),
                        dedupe_key=f"k8s:{slurm_node}@{node}:{self.kind}:{digest}:{now.isoformat()}"))
                except ValueError as exc:  # a label value no event can carry: say which, keep the rest
                    log.warning("Node %s: cannot publish its failure domains for %r: %s", node, slurm_node, exc)
        return out
