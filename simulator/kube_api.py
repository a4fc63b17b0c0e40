"""A small, faithful kube-apiserver for tests and the demo: nodes, pods, pods/eviction and node watches.

Run it in-process (``KubeAPIServer().start()`` binds 127.0.0.1 on a free port and returns its URL) and
point the official ``kubernetes`` client at it. The HTTP layer answers as the real server does, per
``wire-protocols.md``: Status bodies for every error, bearer auth (401), chunked newline-delimited watch
streams that honour ``resourceVersion``, ``timeoutSeconds`` and ``allowWatchBookmarks``, and a 410
Expired ERROR event for a resourceVersion the history no longer holds. State and semantics live in
:mod:`simulator.kube_store`, routing and streaming in :mod:`simulator.kube_http`; this module is the
server's lifecycle and the methods tests use to change the world behind it.

Test hooks: ``fail_next`` injects errors (429/5xx/403 with optional Retry-After) ahead of routing,
``delay_next`` holds the answer of a request that has acted (to kill a client inside the call), and
``requests`` records every request, so a test can prove what a client did *not* do (e.g. never DELETE).
"""

from __future__ import annotations

import secrets
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer

from simulator.fakehttp import Hold, take_hold
from simulator.kube_http import Handler, Request
from simulator.kube_store import PDB, Obj, Store, now_rfc3339

__all__ = ["KubeAPIServer", "Request"]


@dataclass
class Fault:
    code: int
    count: int
    retry_after: int | None = None
    method: str | None = None
    path: str | None = None  # substring of the request path


@dataclass
class _Log:
    items: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class KubeAPIServer:
    """The fake API server plus the methods tests use to change the world behind it."""

    def __init__(
        self,
        token: str | None = None,
        history: int = 1000,
        bookmark_interval_s: float = 1.0,
        evict_grace_s: float = 0.0,
        default_watch_timeout_s: float = 1800.0,
    ) -> None:
        self.token = token if token is not None else secrets.token_hex(8)
        self.store = Store(history)
        self.bookmark_interval_s = bookmark_interval_s
        self.evict_grace_s = evict_grace_s
        self.default_watch_timeout_s = default_watch_timeout_s
        self._faults: list[Fault] = []
        self._holds: list[Hold] = []
        self._log = _Log()
        self._httpd: ThreadingHTTPServer | None = None
        self._closing = threading.Event()
        self.url = ""

    # ------------------------------------------------------------------------ lifecycle
    def start(self) -> str:
        handler = type("Handler", (Handler,), {"api": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="kube-api", daemon=True).start()
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        return self.url

    def stop(self) -> None:
        self._closing.set()
        with self.store.lock:
            self.store.changed.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

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
        spec: Obj = {}
        if provider_id:
            spec["providerID"] = provider_id
        if unschedulable:
            spec["unschedulable"] = True
        if taints:
            spec["taints"] = taints
        now = now_rfc3339()
        node: Obj = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"name": name, "labels": dict(labels or {}), "annotations": dict(annotations or {})},
            "spec": spec,
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": ready,
                        "reason": "KubeletReady" if ready == "True" else "KubeletNotReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
                "nodeInfo": {
                    "bootID": boot_id or str(uuid.uuid4()),
                    "machineID": uuid.uuid4().hex,
                    "systemUUID": str(uuid.uuid4()),
                    "kernelVersion": "6.1.0-28-cloud-amd64",
                    "osImage": "Debian GNU/Linux 12 (bookworm)",
                    "containerRuntimeVersion": "containerd://1.7.24",
                    "kubeletVersion": "v1.31.0",
                    "kubeProxyVersion": "v1.31.0",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            },
        }
        return self.store.create("nodes", name, node)

    def remove_node(self, name: str) -> None:
        self.store.delete("nodes", name)

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

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node_name: str | None = None,
        labels: dict[str, str] | None = None,
        owner_kind: str | None = None,
        mirror: bool = False,
        phase: str = "Running",
        terminating: bool = False,
    ) -> Obj:
        meta: Obj = {"name": name, "namespace": namespace, "labels": dict(labels or {}), "annotations": {}}
        if owner_kind:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": owner_kind,
                    "name": f"{name}-owner",
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                }
            ]
        if mirror:
            meta["annotations"]["kubernetes.io/config.mirror"] = uuid.uuid4().hex
        if terminating:
            meta["deletionTimestamp"] = now_rfc3339()
        pod: Obj = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": meta,
            "spec": {
                "containers": [{"name": "main", "image": "busybox"}],
                **({"nodeName": node_name} if node_name else {}),
            },
            "status": {"phase": phase},
        }
        return self.store.create("pods", (namespace, name), pod)

    def remove_pod(self, namespace: str, name: str) -> None:
        self.store.delete("pods", (namespace, name))

    def pods(self) -> list[Obj]:
        return self.store.list("pods")[0]

    def add_pdb(
        self,
        namespace: str,
        name: str,
        selector: str,
        *,
        min_available: int | None = None,
        max_unavailable: int | None = None,
    ) -> None:
        """A PodDisruptionBudget over the pods matching a label selector (set one of the two bounds)."""
        with self.store.lock:
            self.store.pdbs[(namespace, name)] = PDB(
                namespace, name, selector, min_available, max_unavailable
            )

    def remove_pdb(self, namespace: str, name: str) -> None:
        with self.store.lock:
            self.store.pdbs.pop((namespace, name), None)

    def compact(self) -> None:
        """Forget the watch history: open watches, and any new watch from an older resourceVersion,
        get 410 Expired (a restarted watch cache); clients must relist."""
        self.store.compact()

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
        with self._log.lock:
            self._faults.append(Fault(code, count, retry_after, method, path))

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._log.lock:
            for fault in self._faults:
                if fault.count > 0 and fault.method in (None, method) and (fault.path or "") in path:
                    fault.count -= 1
                    return fault
        return None

    def delay_next(
        self, count: int, seconds: float, *, method: str | None = None, path: str | None = None
    ) -> Hold:
        """Hold the answers to the next ``count`` matching requests (``path`` a substring) for up to
        ``seconds`` after they acted; the returned :class:`~simulator.fakehttp.Hold` tells when."""
        hold = Hold(seconds, count, path.lower() if path else None, method)
        with self._log.lock:
            self._holds.append(hold)
        return hold

    def _take_hold(self, method: str, path: str) -> Hold | None:
        return take_hold(self._holds, self._log.lock, method, path)

    @property
    def requests(self) -> list[Request]:
        with self._log.lock:
            return list(self._log.items)

    def clear_requests(self) -> None:
        with self._log.lock:
            self._log.items.clear()

    def _record(self, request: Request) -> None:
        with self._log.lock:
            self._log.items.append(request)
