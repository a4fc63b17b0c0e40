"""KubeNodes over the official ``kubernetes`` client: cordon, taint, evict, read, and name mapping.

Acting the way a careful controller does:

- **Ownership.** A cordon we make carries ``<domain>/cordoned-by`` (and the reason). A Node that is
  already unschedulable without that mark is a human's: ``cordon`` leaves it as it is, and
  ``uncordon`` only ever lifts a cordon that carries our mark. Both writes are strategic merge patches
  that carry the ``resourceVersion`` we read, so the server refuses them (409) if anyone changed the
  Node in between; we re-read and decide again rather than overwrite a human's concurrent change.
- **Taints.** ``spec.taints`` has no merge key, so any patch replaces the whole list. We read the list,
  add or remove only our ``<domain>/quarantined:NoSchedule`` entry, and write it back with a JSON patch
  whose first op tests ``/metadata/resourceVersion``: another controller's taint added meanwhile makes
  the test fail (422) and we start over, instead of silently dropping it.
- **Eviction** goes through the Eviction API only, which enforces PodDisruptionBudgets. One call is one
  pass: DaemonSet and mirror pods are skipped (they cannot leave), terminating pods are counted but not
  evicted again, a 429 with a ``DisruptionBudget`` cause is reported as blocked with a retry delay, a
  404 means the pod is already gone. Waiting and escalation belong to the workflow; nothing here
  deletes a pod.

Every SDK error is translated at this boundary (:func:`translate`): 429, 5xx, conflicts and connection
errors are transient (keeping Retry-After); 401/403 and other 4xx are permanent; 404 is NotFound.

RBAC this module needs: nodes get+patch, pods list (all namespaces, and the slurmd namespace for the
``pod`` mapping), pods/eviction create.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from remediation.domain.events import NODE_NAME
from remediation.ports.cluster import EvictionProgress, KubeNode
from remediation.ports.errors import (
    ConfigError,
    NotFound,
    PermanentError,
    RemediationError,
    TransientError,
    UnknownNode,
    error_for_status,
)
from remediation.settings import KubeSettings, Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
CONFLICT_RETRIES = 5


# ------------------------------------------------------------------------------------ errors


def retry_after(exc: ApiException) -> float | None:
    """The server's Retry-After (seconds or an HTTP date), else the Status' retryAfterSeconds."""
    value = (exc.headers or {}).get("Retry-After")
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                return max(0.0, (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds())
            except (TypeError, ValueError):
                pass
    seconds = (_status_body(exc).get("details") or {}).get("retryAfterSeconds")
    return float(seconds) if isinstance(seconds, int | float) and seconds > 0 else None


def _status_body(exc: ApiException) -> dict[str, Any]:
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def translate(exc: BaseException, what: str) -> RemediationError:
    """Map an SDK or transport error onto the workflow's error types, keeping the server's message."""
    if isinstance(exc, ApiException):
        code = int(exc.status or 0)
        message = f"{what}: HTTP {code} {_status_body(exc).get('message') or exc.reason or ''}".rstrip()
        # The one table (remediation.ports.errors): 401/403 pause automation, 404 is NotFound, 409/410/429/5xx
        # retry; code 0 is the client's "no HTTP answer at all".
        return error_for_status(code or None, message, retry_after=retry_after(exc), component="kubernetes")
    reason = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) else exc
    if isinstance(reason, urllib3.exceptions.SSLError | ssl.SSLCertVerificationError):
        # The server's certificate does not verify against kube.ca_file (or its name does not match):
        # our configuration, not the node and not a blip; retrying cannot fix it.
        return ConfigError(f"{what}: TLS to the Kubernetes API failed (kube.ca_file, kube.host?): {reason}",
                           component="kubernetes")  # fmt: skip
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return TransientError(f"{what}: cannot reach the Kubernetes API: {exc}")
    return PermanentError(f"{what}: {exc}")


@contextmanager
def _api(what: str) -> Iterator[None]:
    try:
        yield
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
        raise translate(exc, what) from exc


def _is_budget(exc: ApiException) -> bool:
    causes = (_status_body(exc).get("details") or {}).get("causes") or []
    return any(c.get("reason") == "DisruptionBudget" for c in causes if isinstance(c, dict))


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
        self._static = StaticMap(settings.static_map_file)

    # ---------------------------------------------------------------------------- reading
    def _read(self, name: str) -> client.V1Node:
        with _api(f"read Node {name}"):
            return self.api.read_node(name, _request_timeout=self.s.request_timeout_s)

    def get(self, name: str) -> KubeNode:
        node = self._read(name)
        conditions = {c.type: c.status for c in (node.status.conditions or []) if node.status}
        info = node.status.node_info if node.status else None
        annotations = node.metadata.annotations or {}
        unschedulable = bool(node.spec.unschedulable) if node.spec else False
        return KubeNode(
            name=name,
            ready=conditions.get("Ready", "Unknown"),
            boot_id=info.boot_id if info else "",
            provider_id=(node.spec.provider_id if node.spec else None) or "",
            unschedulable=unschedulable,
            cordoned_by_us=unschedulable and self.cordoned_by in annotations,
            quarantine_tainted=any(self._is_ours(t) for t in (node.spec.taints or []))
            if node.spec
            else False,
            conditions={k: v for k, v in conditions.items() if k in self.condition_types},
        )

    def _is_ours(self, taint: client.V1Taint) -> bool:
        return taint.key == self.taint_key and taint.effect == "NoSchedule"

    # ----------------------------------------------------------------------------- cordon
    def _with_conflicts(self, name: str, attempt: Callable[[client.V1Node], T]) -> T:
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

    def _patch(self, name: str, body: Any) -> None:
        self.api.patch_node(name, body, _request_timeout=self.s.request_timeout_s)

    def cordon(self, name: str, reason: str) -> None:
        def attempt(node: client.V1Node) -> None:
            if node.spec and node.spec.unschedulable:
                return  # already cordoned: ours (idempotent) or a human's (never claim it)
            self._patch(
                name,
                {
                    "metadata": {
                        "resourceVersion": node.metadata.resource_version,
                        "annotations": {self.cordoned_by: self.actor, self.cordon_reason: reason[:1024]},
                    },
                    "spec": {"unschedulable": True},
                },
            )

        self._with_conflicts(name, attempt)

    def uncordon(self, name: str) -> bool:
        def attempt(node: client.V1Node) -> bool:
            ours = self.cordoned_by in (node.metadata.annotations or {})
            cordoned = bool(node.spec and node.spec.unschedulable)
            if not ours:
                return False  # a human's cordon, or none: not ours to lift
            patch: dict[str, Any] = {
                "metadata": {
                    "resourceVersion": node.metadata.resource_version,
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
        def attempt(node: client.V1Node) -> None:
            raw = self.api.api_client.sanitize_for_serialization(
                (node.spec.taints if node.spec else None) or []
            )
            present = any(t.get("key") == self.taint_key and t.get("effect") == "NoSchedule" for t in raw)
            if present == on:
                return
            if on:
                taints = [*raw, {"key": self.taint_key, "value": self.actor, "effect": "NoSchedule"}]
            else:
                taints = [
                    t for t in raw if not (t.get("key") == self.taint_key and t.get("effect") == "NoSchedule")
                ]
            self._patch(
                name,
                [
                    {
                        "op": "test",
                        "path": "/metadata/resourceVersion",
                        "value": node.metadata.resource_version,
                    },
                    {"op": "add", "path": "/spec/taints", "value": taints},
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
        with _api(f"list slurmd pods on Node {name}"):
            pods = self.api.list_namespaced_pod(
                self.s.pod_namespace, label_selector=self.s.pod_label_selector,
                field_selector=f"spec.nodeName={name}", _request_timeout=self.s.request_timeout_s,
            ).items
        return {(p.metadata.namespace, p.metadata.name) for p in pods}

    def evict_pods(self, name: str) -> EvictionProgress:
        with _api(f"list pods on Node {name}"):
            pods = self.api.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={name},status.phase!=Succeeded,status.phase!=Failed",
                _request_timeout=self.s.request_timeout_s,
            ).items
        slurmd = self._slurmd_pods(name)
        remaining, blocked, delay = 0, [], 0.0
        for pod in pods:
            meta = pod.metadata
            if (meta.namespace, meta.name) in slurmd:
                continue  # the Slurm node itself: drained already, it restarts with the VM (see below)
            if MIRROR_ANNOTATION in (meta.annotations or {}):
                continue  # a static pod's mirror: the kubelet owns it, the API cannot remove it
            if any(ref.kind == "DaemonSet" and ref.controller for ref in meta.owner_references or []):
                continue  # the DaemonSet would recreate it; it tolerates the cordon by design
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
                elif exc.status == 429 and _is_budget(exc):
                    blocked.append(f"{meta.namespace}/{meta.name}")
                    delay = max(delay, retry_after(exc) or self.s.evict_backoff_s)
                else:
                    raise translate(exc, f"evict pod {meta.namespace}/{meta.name}") from exc
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise translate(exc, f"evict pod {meta.namespace}/{meta.name}") from exc
        return EvictionProgress(remaining, tuple(blocked), delay if blocked else None)

    # ---------------------------------------------------------------------------- mapping
    def node_for(self, slurm_node: str) -> str:
        if not NODE_NAME.fullmatch(slurm_node):
            raise UnknownNode(f"{slurm_node!r} is not a valid node name")
        if self.s.mapping == "pod":
            return self._node_of_pod(slurm_node)
        name = self._static_map().get(slurm_node) if self.s.mapping == "static" else slurm_node
        if name is None:
            raise UnknownNode(f"{slurm_node} is not in the mapping file {self.s.static_map_file}")
        try:
            self._read(name)
        except NotFound as exc:
            raise UnknownNode(f"Slurm node {slurm_node}: no Kubernetes Node {name} ({exc.message})") from exc
        return name

    def _node_of_pod(self, slurm_node: str) -> str:
        ns, selector = self.s.pod_namespace, self.s.pod_label_selector
        with _api(f"find the pod of Slurm node {slurm_node}"):
            pods = self.api.list_namespaced_pod(
                ns,
                field_selector=f"metadata.name={slurm_node}",
                label_selector=selector,
                _request_timeout=self.s.request_timeout_s,
            ).items
        if not pods:
            raise UnknownNode(f"no pod {ns}/{slurm_node} matching {selector!r}")
        node_name = pods[0].spec.node_name if pods[0].spec else None
        if not node_name:
            raise UnknownNode(f"pod {ns}/{slurm_node} is not scheduled on any Node")
        return str(node_name)

    def _static_map(self) -> dict[str, str]:
        return self._static.load()


class StaticMap:
    """``kube.static_map_file``: YAML ``{slurm_node: k8s_node}``, shared by this adapter and the
    Kubernetes watcher (which inverts it). Re-read when its mtime changes, so edits apply without a
    restart; an unset, unreadable or malformed file is a ConfigError (the system's fault: it pauses
    automation rather than count against a node) that names the setting."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._cache: tuple[float, dict[str, str]] | None = None

    def load(self) -> dict[str, str]:
        path = self.path
        if not path:
            raise ConfigError("kube.mapping is 'static' but kube.static_map_file is not set", component="kubernetes")
        try:
            mtime = os.stat(path).st_mtime
            if self._cache is None or self._cache[0] != mtime:
                with open(path, encoding="utf-8") as fh:
                    data = yaml.safe_load(fh) or {}
                if not isinstance(data, dict):
                    raise ConfigError(f"{path}: expected a mapping of Slurm node to Kubernetes Node",
                                      component="kubernetes")
                self._cache = (mtime, {str(k): str(v) for k, v in data.items()})
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read kube.static_map_file {path}: {exc}", component="kubernetes") from exc
        return self._cache[1]


# ----------------------------------------------------------------------------------- factory


def kube_client(settings: KubeSettings) -> client.CoreV1Api:
    """host+token(+ca_file) when configured, else in-cluster service account, else kubeconfig."""
    cfg = client.Configuration()
    if settings.host:
        cfg.host = settings.host.rstrip("/")
        if settings.token is not None:
            cfg.api_key = {"authorization": f"Bearer {settings.token.get_secret_value()}"}
        if settings.ca_file:
            # Read now: the client would only fail at its first call, as an unreachable server.
            try:
                with open(settings.ca_file, "rb"):
                    pass
            except OSError as exc:
                raise ConfigError(
                    f"kube.ca_file {settings.ca_file}: {exc.strerror or exc}", component="kubernetes"
                ) from exc
            cfg.ssl_ca_cert = settings.ca_file
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
    # urllib3's default Retry would sleep out a 429/503's Retry-After (three times) inside the call,
    # blocking a worker for minutes. Only connection failures are retried here, briefly; every HTTP
    # status comes back to translate(), and the workflow schedules the retry with Retry-After.
    cfg.retries = urllib3.Retry(
        connect=2, read=0, redirect=0, status=0, other=0, backoff_factor=0.1, respect_retry_after_header=False
    )
    return client.CoreV1Api(client.ApiClient(cfg))


def make_kube(settings: Settings) -> KubeAdapter:
    """The real Kubernetes adapter (backend selection and dry-run: :mod:`remediation.adapters.factory`)."""
    return KubeAdapter(
        kube_client(settings.kube),
        settings.kube,
        actor=settings.actor,
        condition_types=settings.policy.kube_conditions,
    )
