"""A small, faithful kube-apiserver for tests and the demo: nodes, pods, pods/eviction, jobs and node
watches.

``KubeAPIServer().start()`` returns its ``https://`` URL; trust :attr:`KubeAPIServer.ca_file` or use
:meth:`KubeAPIServer.write_kubeconfig`. State lives in :mod:`remediation.simulator.kube.store`, HTTP in
:mod:`remediation.simulator.kube.http`. Test hooks: ``fail_next``, ``delay_next`` and ``requests``.

Why: docs/kubernetes.md#inside-the-local-kube-apiserver
"""

from __future__ import annotations

import secrets
import ssl
import tempfile
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from remediation.simulator.fakehttp import Fault, Faults, Hold, RequestLog, _Server
from remediation.simulator.kube.http import Handler, Request
from remediation.simulator.kube.jobs import JobRunner
from remediation.simulator.kube.objects import (
    NodeState,
    PodState,
    daemonset_object,
    gpu_node_object,
    node_lease_object,
    pod_object,
)
from remediation.simulator.kube.pages import Snapshots
from remediation.simulator.kube.podsecurity import forbidden, level_of
from remediation.simulator.kube.select import to_label_selector
from remediation.simulator.kube.store import ApiError, Obj, Store, now_micro, now_rfc3339, status
from remediation.simulator.kube.tls import write_cluster_pki

__all__ = ["KubeAPIServer", "Request"]

NODE_LEASE_NAMESPACE = "kube-node-lease"


class _TLSServer(_Server):
    """HTTPS only; the handshake runs in the connection's thread (see :mod:`remediation.simulator.fakehttp`)."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that refuses our certificate (the point of a test about trust) or hangs up
        # mid-handshake is not a server bug; anything else still prints its traceback.
        import sys

        if not isinstance(sys.exc_info()[1], ssl.SSLError | ConnectionError):
            super().handle_error(request, client_address)


@dataclass(frozen=True)
class ServingPki:
    """The fake's certificates: kept in ``tls_dir`` (None: a temp dir, removed by
    :meth:`KubeAPIServer.stop`), naming ``hosts`` besides 127.0.0.1 and localhost, valid ``valid_days``."""

    tls_dir: Path | None = None
    hosts: Sequence[str] = ()
    valid_days: int = 1


class KubeAPIServer:
    """The fake API server plus the methods tests use to change the world behind it.

    ``pki`` says where its certificates are kept and what they name (:class:`ServingPki`)."""

    def __init__(
        self,
        token: str | None = None,
        history: int = 1000,
        bookmark_interval_s: float = 1.0,
        *,
        evict_grace_s: float = 0.0,
        default_watch_timeout_s: float = 1800.0,
        pki: ServingPki = ServingPki(),
    ) -> None:
        self.token = token if token is not None else secrets.token_hex(8)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        tls_dir, hosts, valid_days = pki.tls_dir, pki.hosts, pki.valid_days
        if tls_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="kube-api-")
            tls_dir = Path(self._tmp.name)
        self.pki = write_cluster_pki(tls_dir, hosts, valid_days=valid_days)
        self.ca_file = self.pki.ca_file
        self.ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ssl_context.load_cert_chain(self.pki.cert_file, self.pki.key_file)
        self.store = Store(history)
        self.pages = Snapshots()  # the snapshots behind paged lists' continue tokens
        # Namespaces by name, with their labels: only Pod Security admission reads them (kube_podsecurity).
        self.namespaces: dict[str, dict[str, str]] = {}
        self.jobs = JobRunner(self.store, self.pod_security_level)  # what a check does: ``jobs.outcome``
        self.bookmark_interval_s = bookmark_interval_s
        self.evict_grace_s = evict_grace_s
        self.default_watch_timeout_s = default_watch_timeout_s
        # Injected failures and held answers, and the request log: the same machinery as every fake.
        self.faults = Faults()
        self._log: RequestLog[Request] = RequestLog()
        self._httpd: _TLSServer | None = None
        self._closing = threading.Event()
        self.url = ""

    # ------------------------------------------------------------------------ lifecycle
    def start(self) -> str:
        handler = type("Handler", (Handler,), {"api": self})
        self._httpd = _TLSServer(("127.0.0.1", 0), handler)
        self._httpd.ssl_context = self.ssl_context
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="kube-api", daemon=True).start()
        self.url = f"https://127.0.0.1:{self._httpd.server_address[1]}"
        return self.url

    def stop(self) -> None:
        self._closing.set()
        self.jobs.stop()
        with self.store.lock:
            self.store.changed.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def kubeconfig(self, *, user: str = "remediation") -> Obj:
        """A kubeconfig for this server (the CA by path, the bearer token), as kubectl reads it."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "sim", "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)}}
            ],
            "users": [{"name": user, "user": {"token": self.token}}],
            "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": user}}],
            "current-context": "sim",
            "preferences": {},
        }

    def write_kubeconfig(self, path: Path) -> Path:
        """Write :meth:`kubeconfig` to ``path`` (mode 0600: it holds the token) and return it."""
        path.write_text(yaml.safe_dump(self.kubeconfig(), sort_keys=False))
        path.chmod(0o600)
        return path

    def __enter__(self) -> KubeAPIServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --------------------------------------------------------------------- test driving
    def add_node(
        self,
        name: str,
        *,
        ready: str = "True",
        provider_id: str = "",
        boot_id: str | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        unschedulable: bool = False,
        taints: list[Obj] | None = None,
    ) -> Obj:
        """A GPU Node as a cloud kubelet registers it (:func:`~remediation.simulator.kube.objects.gpu_node_object`),
        with its heartbeat Lease."""
        now = now_rfc3339()
        state = NodeState(
            ready=ready, provider_id=provider_id, boot_id=boot_id or str(uuid.uuid4()), labels=dict(labels or {}),
            annotations=dict(annotations or {}), unschedulable=unschedulable, taints=taints,
        )  # fmt: skip
        node = gpu_node_object(name, state, now=now)
        self.store.create("leases", (NODE_LEASE_NAMESPACE, name), node_lease_object(name, now_micro()))
        return self.store.create("nodes", name, node)

    def remove_node(self, name: str) -> None:
        self.store.delete("nodes", name)
        if (NODE_LEASE_NAMESPACE, name) in self.store.tables["leases"]:
            self.store.delete("leases", (NODE_LEASE_NAMESPACE, name))

    def node(self, name: str) -> Obj:
        return self.store.get("nodes", name)

    def mutate_node(self, name: str, change: Callable[[Obj], None]) -> Obj:
        """Change a Node as another actor would (a human's kubectl, the kubelet)."""
        return self.store.mutate("nodes", name, change)

    def set_condition(
        self,
        node: str,
        type_: str,
        status_: str,
        *,
        reason: str = "",
        message: str = "",
        last_transition: str | None = None,
    ) -> Obj:
        def change(obj: Obj) -> None:
            conditions = obj["status"].setdefault("conditions", [])
            current = next((c for c in conditions if c["type"] == type_), None)
            if current is None:
                current = {"type": type_}
                conditions.append(current)
            if current.get("status") != status_ or last_transition:
                current["lastTransitionTime"] = last_transition or now_rfc3339()
            current.update(status=status_, reason=reason, message=message, lastHeartbeatTime=now_rfc3339())

        return self.mutate_node(node, change)

    def bump_boot_id(self, node: str) -> str:
        boot_id = str(uuid.uuid4())
        self.mutate_node(node, lambda obj: obj["status"]["nodeInfo"].__setitem__("bootID", boot_id))
        return boot_id

    def add_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        """A Namespace and its labels, as ``kubectl apply`` of deploy/ would make it; the Pod Security
        label ``pod-security.kubernetes.io/enforce`` decides which pods it admits."""
        self.namespaces[name] = dict(labels or {})

    def pod_security_level(self, namespace: str) -> str:
        return level_of(self.namespaces.get(namespace))

    def add_pod(
        self,
        namespace: str,
        name: str,
        *, node_name: str | None = None,
        labels: dict[str, str] | None = None,
        owner_kind: str | None = None,
        owner_name: str | None = None,
        mirror: bool = False,
        phase: str = "Running",
        terminating: bool = False,
        empty_dir: bool = False,
    ) -> Obj:
        """A Pod (:func:`~remediation.simulator.kube.objects.pod_object`). A DaemonSet owner is created as an
        object of its own if it does not exist yet, since ``kubectl drain`` looks it up."""
        owner = None
        if owner_kind:
            owner_name = owner_name or f"{name}-owner"
            uid = str(uuid.uuid4())
            if owner_kind == "DaemonSet":
                key = (namespace, owner_name)
                with self.store.lock:
                    if key not in self.store.tables["daemonsets"]:
                        self.store.create(
                            "daemonsets", key, daemonset_object(namespace, owner_name, labels or {})
                        )
                    uid = self.store.tables["daemonsets"][key]["metadata"]["uid"]
            owner = (owner_kind, owner_name, uid)
        state = PodState(
            node_name=node_name, labels=dict(labels or {}), owner=owner, mirror=mirror, phase=phase,
            terminating=terminating, empty_dir=empty_dir,
        )  # fmt: skip
        pod = pod_object(namespace, name, state, now=now_rfc3339())
        refused = forbidden(name, self.pod_security_level(namespace), pod["spec"])
        if refused is not None:
            raise ApiError(status(403, "Forbidden", refused, details={"name": name, "kind": "pods"}))
        return self.store.create("pods", (namespace, name), pod)

    def remove_pod(self, namespace: str, name: str) -> None:
        self.store.delete("pods", (namespace, name))

    def pods(self) -> list[Obj]:
        return self.store.list("pods")[0]

    def add_event(
        self, node: str, reason: str, message: str, *, type_: str = "Normal", component: str = "kubelet"
    ) -> Obj:
        """A core/v1 Event about a Node, as the kubelet or node controller records one (``describe
        node`` lists them); in the default namespace, as Node events are."""
        current = self.store.get("nodes", node)
        now = now_rfc3339()
        name = f"{node}.{uuid.uuid4().hex[:16]}"
        event: Obj = {
            "kind": "Event",
            "apiVersion": "v1",
            "metadata": {"name": name, "namespace": "default"},
            "involvedObject": {
                "kind": "Node",
                "name": node,
                "uid": current["metadata"]["uid"],
                "apiVersion": "v1",
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": component, "host": node},
            "reportingComponent": component,
            "reportingInstance": node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        return self.store.create("events", ("default", name), event)

    def add_pdb(
        self,
        namespace: str,
        name: str,
        selector: str,
        *,
        min_available: int | None = None,
        max_unavailable: int | None = None,
    ) -> None:
        """A policy/v1 PodDisruptionBudget over the pods matching a label selector (set one bound)."""
        spec: Obj = {"selector": to_label_selector(selector)}
        if min_available is not None:
            spec["minAvailable"] = min_available
        else:
            spec["maxUnavailable"] = max_unavailable or 0
        pdb: Obj = {
            "kind": "PodDisruptionBudget",
            "apiVersion": "policy/v1",
            "metadata": {"name": name, "namespace": namespace, "generation": 1},
            "spec": spec,
        }
        self.store.create("poddisruptionbudgets", (namespace, name), pdb)

    def remove_pdb(self, namespace: str, name: str) -> None:
        if (namespace, name) in self.store.pdbs:
            self.store.delete("poddisruptionbudgets", (namespace, name))

    def compact(self) -> None:
        """Forget the watch history: open watches, and any new watch from an older resourceVersion,
        get 410 Expired (a restarted watch cache), as does the continue of a paged list; clients must
        relist."""
        self.store.compact()
        self.pages.forget()

    @property
    def resource_version(self) -> int:
        return self.store.rv

    def fail_next(
        self,
        count: int,
        code: int,
        *,
        retry_after: int | None = None,
        method: str | None = None,
        path: str | None = None,
    ) -> None:
        """Answer the next ``count`` matching requests with ``code`` (after auth, before routing)."""
        self.faults.fail_next(count, code, retry_after=retry_after, match=path, method=method)

    def _take_fault(self, method: str, path: str) -> Fault | None:
        return self.faults.take(method, path)

    def delay_next(
        self, count: int, seconds: float, *, method: str | None = None, path: str | None = None
    ) -> Hold:
        """Hold the answers to the next ``count`` matching requests (``path`` a substring) for up to
        ``seconds`` after they acted; the returned :class:`~remediation.simulator.fakehttp.Hold` tells when."""
        return self.faults.delay_next(count, seconds, match=path, method=method)

    def _take_hold(self, method: str, path: str) -> Hold | None:
        return self.faults.take_hold(method, path)

    @property
    def requests(self) -> list[Request]:
        return self._log.items

    def clear_requests(self) -> None:
        self._log.clear()

    def _record(self, request: Request) -> None:
        self._log.add(request)
