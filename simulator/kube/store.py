"""The state behind the fake kube-apiserver: objects, resourceVersions, watch history and PDBs.

One counter stamps every write; a bounded history feeds watches, and ``compact()`` drops it (410). Errors
are :class:`ApiError` with the real Status body. Eviction follows the real budget rules.

Why: docs/kubernetes.md#inside-the-local-kube-apiserver
"""

from __future__ import annotations

import copy
import json
import threading
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from remediation.simulator.kube.discovery import RESOURCES
from remediation.simulator.kube.patch import PatchError, apply_patch
from remediation.simulator.kube.select import selector_matcher
from remediation.simulator.kube.validate import metadata_errors, node_errors

Obj = dict[str, Any]


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """A metav1.MicroTime, as Lease renewTime carries."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def status(code: int, reason: str, message: str, *, details: Obj | None = None) -> Obj:
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


class ApiError(Exception):
    def __init__(self, body: Obj, headers: dict[str, str] | None = None) -> None:
        super().__init__(body.get("message", ""))
        self.body = body
        self.code = int(body["code"])
        self.headers = headers or {}


def not_found(kind: str, name: str) -> ApiError:
    return ApiError(status(404, "NotFound", f'{kind} "{name}" not found', details={"name": name,
        "kind": kind}))


@dataclass(frozen=True)
class Record:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    kind: str  # the resource: nodes, pods, events, ...
    obj: Obj


def _key(obj: Obj) -> Any:
    meta = obj["metadata"]
    return (meta["namespace"], meta["name"]) if "namespace" in meta else meta["name"]


@dataclass(frozen=True)
class Patchable:
    """What a PATCH of ``kind`` may change: the parts it leaves as they were (``kept``), and the check
    of the object it makes (``errors_of``: a list of field errors, empty when valid)."""

    kind: str
    kept: tuple[str, ...]
    errors_of: Any


class Store:
    def __init__(self, history: int = 1000) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.rv = 1
        # One table per resource; cluster-scoped objects are keyed by name, namespaced ones by
        # (namespace, name).
        self.tables: dict[str, dict[Any, Obj]] = {r.name: {} for r in RESOURCES}
        self.nodes: dict[str, Obj] = self.tables["nodes"]
        self.pods: dict[tuple[str, str], Obj] = self.tables["pods"]
        self.pdbs: dict[tuple[str, str], Obj] = self.tables["poddisruptionbudgets"]
        # Each stored object's JSON, encoded once per write (the apiserver's watch cache keeps a
        # serialization cache for the same reason): a list of 10,000 Nodes is then a join, not
        # 10,000 deep copies and encodings, so a relist measures the client, not this fake.
        self.encoded: dict[str, dict[Any, bytes]] = {r.name: {} for r in RESOURCES}
        self.history: deque[Record] = deque(maxlen=history)
        self.floor = 1  # a watch may resume from any rv >= floor; older ones get 410
        self.epoch = 0  # bumped by compact(); a watch opened in an older epoch is expired

    # ----------------------------------------------------------------------------- writes
    def _write(self, kind: str, type_: str, obj: Obj) -> Obj:
        """Stamp ``obj`` with the next rv, record it and wake the watches. Caller holds the lock."""
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if self.history.maxlen is not None and len(self.history) == self.history.maxlen:
            self.floor = self.history[0].rv
        self.history.append(Record(self.rv, type_, kind, copy.deepcopy(obj)))
        key = _key(obj)
        if type_ == "DELETED":
            self.encoded[kind].pop(key, None)
        else:
            self.encoded[kind][key] = json.dumps(obj).encode()
        self.changed.notify_all()
        return obj

    def _table(self, kind: str) -> dict[Any, Obj]:
        return self.tables[kind]

    def create(self, kind: str, key: Any, obj: Obj) -> Obj:
        with self.lock:
            meta = obj.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", now_rfc3339())
            table = self._table(kind)
            type_ = "MODIFIED" if key in table else "ADDED"
            table[key] = obj
            return copy.deepcopy(self._write(kind, type_, obj))

    def delete(self, kind: str, key: Any) -> Obj:
        with self.lock:
            obj = self._table(kind).pop(key, None)
            if obj is None:
                raise not_found(kind, key if isinstance(key, str) else key[1])
            return copy.deepcopy(self._write(kind, "DELETED", obj))

    def mutate(self, kind: str, key: Any, change: Any) -> Obj:
        """Apply ``change(obj)`` in place; a change that alters nothing writes nothing (no new rv)."""
        with self.lock:
            obj = self._table(kind).get(key)
            if obj is None:
                raise not_found(kind, key if isinstance(key, str) else key[1])
            before = copy.deepcopy(obj)
            change(obj)
            if obj == before:
                return copy.deepcopy(obj)
            return copy.deepcopy(self._write(kind, "MODIFIED", obj))

    def patch_node(self, name: str, body: Any, content_type: str, *, subresource: str = "") -> Obj:
        """PATCH nodes/NAME ignores status changes and nodes/NAME/status ignores spec changes, as the
        real registry strategies do (the kubelet owns status; controllers own spec)."""
        kept = "spec" if subresource == "status" else "status"
        return self._patch(Patchable("nodes", (kept,), node_errors), name, name, body=body,
                           content_type=content_type)

    def patch_pod(self, namespace: str, name: str, body: Any, *, content_type: str) -> Obj:
        """PATCH pods/NAME, for its metadata (annotations, labels): a running pod's spec is all but
        immutable and its status is the kubelet's, so changes to either are ignored here."""
        return self._patch(Patchable("pods", ("spec", "status"), metadata_errors), (namespace, name), name,
                           body=body, content_type=content_type)

    def _patch(self, rules: Patchable, key: Any, name: str, *, body: Any, content_type: str) -> Obj:
        kind, kept, errors_of = rules.kind, rules.kept, rules.errors_of
        with self.lock:
            current = self._table(kind).get(key)
            if current is None:
                raise not_found(kind, name)
            try:
                patched = apply_patch(kind, current, body, content_type=content_type)
            except PatchError as exc:
                reason = {400: "BadRequest", 415: "UnsupportedMediaType"}.get(exc.code, "Invalid")
                raise ApiError(status(exc.code, reason, str(exc))) from None
            meta = patched.setdefault("metadata", {})
            # A resourceVersion in the patch is a precondition (optimistic concurrency), as on a
            # real server; without one the patch applies to whatever is current.
            if (
                meta.get("resourceVersion", current["metadata"]["resourceVersion"])
                != current["metadata"]["resourceVersion"]
            ):
                raise ApiError(
                    status(
                        409,
                        "Conflict",
                        f'Operation cannot be fulfilled on {kind} "{name}": the object has been modified; '
                        "please apply your changes to the latest version and try again",
                        details={"name": name, "kind": kind},
                    )
                )
            for fixed in ("name", "namespace", "uid", "creationTimestamp", "resourceVersion"):
                if fixed in current["metadata"]:
                    meta[fixed] = current["metadata"][fixed]
            for part in kept:
                patched[part] = copy.deepcopy(current.get(part, {}))
            if errors := errors_of(patched):
                singular = {"nodes": "Node", "pods": "Pod"}[kind]
                raise ApiError(
                    status(
                        422, "Invalid", f'{singular} "{name}" is invalid: ' + "; ".join(errors),
                        details={"name": name, "kind": singular, "causes": [{"reason": "FieldValueInvalid",
                            "message": e} for e in errors]},
                    )
                )  # fmt: skip
            if patched == current:
                return copy.deepcopy(current)
            self._table(kind)[key] = patched
            return copy.deepcopy(self._write(kind, "MODIFIED", patched))

    # ------------------------------------------------------------------------------ reads
    def get(self, kind: str, key: Any) -> Obj:
        with self.lock:
            obj = self._table(kind).get(key)
            if obj is None:
                raise not_found(kind, key if isinstance(key, str) else key[1])
            return copy.deepcopy(obj)

    def list(self, kind: str) -> tuple[list[Obj], int]:
        with self.lock:
            return [copy.deepcopy(o) for o in self._table(kind).values()], self.rv

    def list_encoded(self, kind: str, match: Any) -> tuple[list[bytes], int]:
        """The JSON of every object ``match`` accepts, from the serialization cache, and the rv."""
        with self.lock:
            table, encoded = self._table(kind), self.encoded[kind]
            return [encoded[key] for key, obj in table.items() if match(obj)], self.rv

    def list_keyed(self, kind: str, match: Any) -> tuple[list[tuple[str, bytes]], int]:
        """(key as etcd orders it, JSON) of every object ``match`` accepts, and the rv."""
        with self.lock:
            table, encoded = self._table(kind), self.encoded[kind]
            keyed = [
                ("/".join(key) if isinstance(key, tuple) else key, encoded[key])
                for key, obj in table.items()
                if match(obj)
            ]
            return keyed, self.rv

    def since(self, kind: str, rv: int, epoch: int | None = None) -> list[Record]:
        """Records of ``kind`` after ``rv``; raises ApiError(410) when the history no longer has them."""
        with self.lock:
            if rv < self.floor or (epoch is not None and epoch != self.epoch):
                raise ApiError(status(410, "Expired", f"too old resource version: {rv} ({self.floor})"))
            return [r for r in self.history if r.rv > rv and r.kind == kind]

    def compact(self) -> None:
        """Drop the history and end every open watch with 410, as a restarted watch cache does."""
        with self.lock:
            self.history.clear()
            self.floor = self.rv
            self.epoch += 1
            self.changed.notify_all()

    # --------------------------------------------------------------------------- eviction
    def evict(self, namespace: str, name: str, grace_s: float) -> Obj:
        with self.lock:
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise not_found("pods", name)
            terminal = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            if not terminal and "deletionTimestamp" not in pod["metadata"]:
                self._check_budgets(pod)
            if grace_s <= 0 or terminal:
                self.delete("pods", (namespace, name))
            elif "deletionTimestamp" not in pod["metadata"]:

                def terminate(obj: Obj) -> None:
                    obj["metadata"]["deletionTimestamp"] = now_rfc3339()
                    obj["metadata"]["deletionGracePeriodSeconds"] = int(grace_s)

                self.mutate("pods", (namespace, name), terminate)
                timer = threading.Timer(grace_s, self._finish, args=((namespace, name),))
                timer.daemon = True
                timer.start()
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _finish(self, key: tuple[str, str]) -> None:
        try:
            self.delete("pods", key)
        except ApiError:
            pass  # removed meanwhile

    def _healthy(self, pod: Obj) -> bool:
        return (
            "deletionTimestamp" not in pod["metadata"] and (pod.get("status") or {}).get("phase") == "Running"
        )

    def _budget_counts(self, budget: Obj) -> tuple[int, int, int]:
        """(pods selected, healthy, desired healthy) of a PodDisruptionBudget, as the disruption
        controller computes them (an integer bound; percentages are not modelled)."""
        namespace = budget["metadata"]["namespace"]
        match = selector_matcher(budget["spec"].get("selector"))
        selected = [p for p in self.pods.values() if p["metadata"]["namespace"] == namespace and match(p)]
        healthy = sum(1 for p in selected if self._healthy(p))
        spec = budget["spec"]
        if "minAvailable" in spec:
            desired = int(spec["minAvailable"])
        else:
            desired = max(0, len(selected) - int(spec.get("maxUnavailable", 0)))
        return len(selected), healthy, desired

    def pdb_with_status(self, budget: Obj) -> Obj:
        """The budget with the status the disruption controller would have written by now."""
        expected, healthy, desired = self._budget_counts(budget)
        out = copy.deepcopy(budget)
        out["status"] = {
            "observedGeneration": out["metadata"].get("generation", 1),
            "disruptionsAllowed": max(0, healthy - desired),
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "conditions": [
                {
                    "type": "DisruptionAllowed",
                    "status": "True" if healthy > desired else "False",
                    "reason": "SufficientPods" if healthy > desired else "InsufficientPods",
                    "message": "",
                    "observedGeneration": out["metadata"].get("generation", 1),
                    "lastTransitionTime": out["metadata"]["creationTimestamp"],
                }
            ],
        }
        return out

    def _check_budgets(self, pod: Obj) -> None:
        namespace = pod["metadata"]["namespace"]
        budgets = [
            b
            for b in self.pdbs.values()
            if b["metadata"]["namespace"] == namespace and selector_matcher(b["spec"].get("selector"))(pod)
        ]
        if len(budgets) > 1:
            raise ApiError(
                status(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the "
                    "eviction subresource does not support.",
                )
            )
        for budget in budgets:
            _, healthy, desired = self._budget_counts(budget)
            if healthy - desired <= 0:
                raise ApiError(
                    status(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        details={
                            "causes": [
                                {
                                    "reason": "DisruptionBudget",
                                    "message": f"The disruption budget {budget['metadata']['name']} needs "
                                    f"{desired} healthy pods and has {healthy} currently",
                                }
                            ]
                        },
                    )
                )
