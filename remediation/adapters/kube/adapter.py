"""KubeNodes over the official ``kubernetes`` client: cordon, taint, evict, read, and name mapping.

Our cordon carries ``<domain>/cordoned-by`` and we only lift a cordon with that mark. Writes carry the
``resourceVersion`` read, so a concurrent change is re-read, never overwritten. Eviction goes through the
Eviction API only, one pass per call. With ``workflow.checkpoint_pods`` each pod gets the checkpoint
annotations once. SDK errors are translated in :mod:`remediation.adapters.kube.client`.

Why: docs/kubernetes.md#how-the-adapter-acts-on-nodes
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from remediation.adapters.kube.client import (
    api_errors,
    is_budget_refusal,
    kube_client,
    retry_after,
    translate,
)
from remediation.adapters.kube.mapping import NodeMapping
from remediation.adapters.kube.wire import Node, Taint, as_json, decode_node
from remediation.ports.cluster import EvictionProgress, KubeNode
from remediation.ports.errors import (
    NotFound,
    TransientError,
)
from remediation.settings import KubeSettings, Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
CONFLICT_RETRIES = 5


# ----------------------------------------------------------------------------------- adapter


class KubeAdapter:
    def __init__(
        self,
        api: client.CoreV1Api,
        settings: KubeSettings,
        *,
        actor: str = "remediation",
        condition_types: Iterable[str] = (),
    ) -> None:
        self.api = api
        self.s = settings
        self.actor = actor
        self.condition_types = {"Ready", *(c.split("=", 1)[0] for c in condition_types)}
        self.cordoned_by = f"{settings.annotation_domain}/cordoned-by"
        self.cordon_reason = f"{settings.annotation_domain}/cordon-reason"
        self.taint_key = f"{settings.annotation_domain}/quarantined"
        # The checkpoint request on a pod (docs/kubernetes.md): when it was asked, when eviction starts.
        self.checkpoint_at = f"{settings.annotation_domain}/checkpoint-requested-at"
        self.checkpoint_deadline = f"{settings.annotation_domain}/checkpoint-deadline"
        self._mapping = NodeMapping(api, settings, self._read)

    # ---------------------------------------------------------------------------- reading
    def _read(self, name: str) -> Node:
        with api_errors(f"read Node {name}"):
            # Raw bytes, decoded to the fields we read (remediation.adapters.kube.wire says why).
            return _decoded(self.api.read_node(name, _preload_content=False,
                                               _request_timeout=self.s.request_timeout_s))

    def get(self, name: str) -> KubeNode:
        return self._as_kube_node(name, self._read(name))

    def _as_kube_node(self, name: str, node: Node) -> KubeNode:
        conditions = {c.type: c.status for c in node.status.conditions or []}
        info = node.status.nodeInfo
        return KubeNode(
            name=name,
            ready=conditions.get("Ready", "Unknown"),
            boot_id=info.bootID if info else "",
            provider_id=node.spec.providerID or "",
            unschedulable=node.cordoned,
            cordoned_by_us=node.cordoned and self.cordoned_by in node.annotations,
            quarantine_tainted=any(self._is_ours(t) for t in node.taints),
            conditions={k: v for k, v in conditions.items() if k in self.condition_types},
            messages={c.type: c.said for c in node.status.conditions or [] if c.type in self.condition_types},
        )

    def _is_ours(self, taint: Taint) -> bool:
        return taint.key == self.taint_key and taint.effect == "NoSchedule"

    # ----------------------------------------------------------------------------- cordon
    def _with_conflicts(self, name: str, attempt: Callable[[Node], T]) -> T:
        """Run read-decide-write until the write lands on the version it read."""
        for _ in range(CONFLICT_RETRIES):
            node = self._read(name)
            try:
                return attempt(node)
            except ApiException as exc:
                if exc.status not in (409, 422) or (exc.status == 422 and "test" not in (exc.body or "")):
                    raise translate(exc, f"patch Node {name}") from exc
                log.info("Node %s changed while we patched it; re-reading", name)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise translate(exc, f"patch Node {name}") from exc
        raise TransientError(f"Node {name} kept changing under us ({CONFLICT_RETRIES} conflicts)", status=409)

    def _patch(self, name: str, body: Any) -> Node:
        return _decoded(self.api.patch_node(name, body, _preload_content=False,
                                            _request_timeout=self.s.request_timeout_s))

    def cordon(self, name: str, reason: str) -> KubeNode:
        # One read and one write: the patch answers with the Node as written, which says whose the
        # cordon is (a mass failure cordons hundreds of Nodes at once; each round trip counts).
        def attempt(node: Node) -> KubeNode:
            if node.cordoned:
                return self._as_kube_node(name, node)  # already cordoned: ours (idempotent) or a human's
            return self._as_kube_node(name, self._patch(
                name,
                {
                    "metadata": {
                        "resourceVersion": node.metadata.resourceVersion,
                        "annotations": {self.cordoned_by: self.actor, self.cordon_reason: reason[:1024]},
                    },
                    "spec": {"unschedulable": True},
                },
            ))

        return self._with_conflicts(name, attempt)

    def uncordon(self, name: str) -> bool:
        def attempt(node: Node) -> bool:
            ours = self.cordoned_by in node.annotations
            cordoned = node.cordoned
            if not ours:
                return False  # a human's cordon, or none: not ours to lift
            patch: dict[str, Any] = {
                "metadata": {
                    "resourceVersion": node.metadata.resourceVersion,
                    "annotations": {self.cordoned_by: None, self.cordon_reason: None},
                }
            }
            if cordoned:
                patch["spec"] = {"unschedulable": False}
            # A human uncordoned meanwhile: drop our stale mark so a later human cordon is not
            # mistaken for ours, and report that we lifted nothing.
            self._patch(name, patch)
            return cordoned

        return self._with_conflicts(name, attempt)

    def set_quarantine_taint(self, name: str, on: bool) -> None:
        def attempt(node: Node) -> None:
            present = any(self._is_ours(t) for t in node.taints)
            if present == on:
                return
            if on:
                taints = [*node.taints, Taint(key=self.taint_key, value=self.actor, effect="NoSchedule")]
            else:
                taints = [t for t in node.taints if not self._is_ours(t)]
            self._patch(
                name,
                [
                    {
                        "op": "test",
                        "path": "/metadata/resourceVersion",
                        "value": node.metadata.resourceVersion,
                    },
                    {"op": "add", "path": "/spec/taints", "value": as_json(taints)},
                ],
            )

        self._with_conflicts(name, attempt)

    # --------------------------------------------------------------------------- eviction
    def _slurmd_pods(self, name: str) -> set[tuple[str, str]]:
        """The slurmd pods on this Node (mapping=pod). They are the Slurm nodes being remediated: Slurm
        has drained them, and evicting one would let its controller (a StatefulSet, Slinky's NodeSet...)
        recreate the Slurm node on another Node, so verify could never see it come back here."""
        if self.s.mapping != "pod":
            return set()
        with api_errors(f"list slurmd pods on Node {name}"):
            pods = self.api.list_namespaced_pod(
                self.s.pod_namespace, label_selector=self.s.pod_label_selector,
                field_selector=f"spec.nodeName={name}", _request_timeout=self.s.request_timeout_s,
            ).items
        return {(p.metadata.namespace, p.metadata.name) for p in pods}

    def _leaving(self, name: str) -> list[client.V1Pod]:
        """The pods an eviction of Node ``name`` removes: not the slurmd pod (:meth:`_slurmd_pods` says
        why), not a static
        pod's mirror (the kubelet owns it, the API cannot remove it), not a DaemonSet's (it would be
        recreated; it tolerates the cordon by design)."""
        pods = self._pods_on(name)
        slurmd = self._slurmd_pods(name)
        return [
            pod for pod in pods
            if (pod.metadata.namespace, pod.metadata.name) not in slurmd
            and MIRROR_ANNOTATION not in (pod.metadata.annotations or {})
            and not any(ref.kind == "DaemonSet" and ref.controller for ref in pod.metadata.owner_references or [])
        ]

    def _pods_on(self, name: str) -> list[client.V1Pod]:
        """The running pods on Node ``name``: in each of ``kube.workload_namespaces`` (what a Role per
        namespace allows), or with none configured, in every namespace at once."""
        where = f"spec.nodeName={name},status.phase!=Succeeded,status.phase!=Failed"
        timeout = self.s.request_timeout_s
        with api_errors(f"list pods on Node {name}"):
            if not self.s.workload_namespaces:
                return list(self.api.list_pod_for_all_namespaces(field_selector=where, _request_timeout=timeout).items)
            return [pod for ns in self.s.workload_namespaces
                    for pod in self.api.list_namespaced_pod(ns, field_selector=where, _request_timeout=timeout).items]

    def request_checkpoint(self, name: str, requested_at: datetime, deadline: datetime) -> list[str]:
        """A merge patch of two annotations on each pod that does not carry our request yet (a
        terminating pod is leaving anyway); a pod gone meanwhile (404) is left out."""
        asked = {self.checkpoint_at: requested_at.isoformat(), self.checkpoint_deadline: deadline.isoformat()}
        out = []
        for pod in self._leaving(name):
            meta = pod.metadata
            out.append(f"{meta.namespace}/{meta.name}")
            if self.checkpoint_at in (meta.annotations or {}) or meta.deletion_timestamp is not None:
                continue
            try:
                with api_errors(f"annotate pod {meta.namespace}/{meta.name} with a checkpoint request"):
                    self.api.patch_namespaced_pod(meta.name, meta.namespace, {"metadata": {"annotations": asked}},
                                                  _request_timeout=self.s.request_timeout_s)
            except NotFound:
                out.pop()  # gone already: nothing left to ask
        return out

    def evict_pods(self, name: str) -> EvictionProgress:
        remaining, blocked, delay = 0, [], 0.0
        for pod in self._leaving(name):
            meta = pod.metadata
            remaining += 1
            if meta.deletion_timestamp is not None:
                continue  # already leaving; evicting again changes nothing
            try:
                self.api.create_namespaced_pod_eviction(
                    meta.name,
                    meta.namespace,
                    client.V1Eviction(
                        api_version="policy/v1",
                        kind="Eviction",
                        metadata=client.V1ObjectMeta(name=meta.name, namespace=meta.namespace),
                    ),
                    _request_timeout=self.s.request_timeout_s,
                )
            except ApiException as exc:
                if exc.status == 404:
                    remaining -= 1  # gone already: that is what we wanted
                elif exc.status == 429 and is_budget_refusal(exc):
                    blocked.append(f"{meta.namespace}/{meta.name}")
                    delay = max(delay, retry_after(exc) or self.s.evict_backoff_s)
                else:
                    raise translate(exc, f"evict pod {meta.namespace}/{meta.name}") from exc
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise translate(exc, f"evict pod {meta.namespace}/{meta.name}") from exc
        return EvictionProgress(remaining, tuple(blocked), delay if blocked else None)

    # ---------------------------------------------------------------------------- mapping
    def node_for(self, slurm_node: str) -> str:
        return self._mapping.node_for(slurm_node)


def _decoded(resp: Any) -> Node:
    """A Node from a raw answer (an urllib3 response: ``_preload_content=False``)."""
    try:
        return decode_node(resp.data)
    finally:
        resp.release_conn()


def make_kube(settings: Settings) -> KubeAdapter:
    """The real Kubernetes adapter (backend selection and dry-run: :mod:`remediation.adapters.factory`)."""
    return KubeAdapter(
        kube_client(settings.kube),
        settings.kube,
        actor=settings.actor,
        condition_types=settings.policy.kube_conditions,
    )
