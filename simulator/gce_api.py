"""A stateful Compute Engine endpoint (the subset a VM restart needs), served by the standard library.

Instances, ``reset``/``stop``/``start`` Operations, and operation GET and wait, with Google's error
shapes. A repeated ``requestId`` returns the original operation (:meth:`GceFake.actions` tells asked from
acted). Operations take ``op_seconds`` and bump ``boot_count``. State advances lazily on each request.

Why: docs/wire-protocols.md#the-cloud-and-bmc-fakes
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from remediation.simulator.fakehttp import FakeServer, Response

_BASE = r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)"
_INSTANCE = re.compile(_BASE + r"/instances/(?P<name>[^/]+)(?:/(?P<verb>reset|stop|start))?$")
_OPERATION = re.compile(_BASE + r"/operations/(?P<op>[^/]+?)(?P<wait>/wait)?$")
_REASONS = {400: "invalid", 403: "forbidden", 404: "notFound", 429: "rateLimitExceeded", 503: "backendError"}
# What an instance shows while an operation on it runs, and once it is done.
_STATUS_DURING = {"reset": "RUNNING", "stop": "STOPPING", "start": "STAGING"}
_STATUS_AFTER = {"reset": "RUNNING", "stop": "TERMINATED", "start": "RUNNING"}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class _Op:
    name: str
    kind: str
    project: str
    zone: str
    instance: str
    request_id: str
    created: float
    duration: float
    fail: tuple[int, str, str] | None = None  # (http status, code, message)
    done: bool = False
    body: dict[str, Any] = field(default_factory=dict)


class GceFake(FakeServer):
    """Compute Engine instances and zone operations. ``url`` is the client's ``api_endpoint``."""

    def __init__(self, *, op_seconds: float = 0.05, wait_seconds: float = 0.5) -> None:
        super().__init__()
        self.op_seconds = op_seconds
        self.wait_seconds = wait_seconds
        self._lock = threading.RLock()
        self._instances: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._ops: dict[str, _Op] = {}
        self._by_request_id: dict[tuple[str, str], str] = {}
        self._op_failures: list[tuple[int, str, str]] = []
        self._ids = itertools.count(4_000_000_000_000)
        self.acted: list[tuple[str, str]] = []  # (verb, instance) for each call that really acted

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -------------------------------------------------------------------------------- test controls

    def add_instance(self, project: str, zone: str, name: str, *, status: str = "RUNNING") -> None:
        with self._lock:
            self._instances[(project, zone, name)] = {
                "id": str(next(self._ids)),
                "name": name,
                "status": status,
                "boot_count": 1 if status == "RUNNING" else 0,
                "host": self._new_host() if status == "RUNNING" else None,
            }

    def _new_host(self) -> str:
        """An opaque physical host name, shaped like the real ``resourceStatus.physicalHost``."""
        return f"/{next(self._ids):x}/{next(self._ids):x}/{next(self._ids):x}"

    def remove_instance(self, project: str, zone: str, name: str) -> None:
        with self._lock:
            del self._instances[(project, zone, name)]

    def vm(self, project: str, zone: str, name: str) -> dict[str, Any]:
        """A copy of an instance's state, including ``boot_count`` (not part of the real API)."""
        with self._lock:
            self._advance()
            return dict(self._instances[(project, zone, name)])

    def end_running_operations(self) -> None:
        """Every operation still running ends at its next look, as if its time were up (a test that
        began one long, to act while it ran, lets it finish)."""
        with self._lock:
            for op in self._ops.values():
                op.duration = 0.0

    def fail_operations(
        self,
        count: int = 1,
        *,
        http_status: int = 503,
        code: str = "INTERNAL_ERROR",
        message: str = "Internal error. Please try again.",
    ) -> None:
        """The next ``count`` operations started end DONE with this error and no effect."""
        with self._lock:
            self._op_failures.extend([(http_status, code, message)] * count)

    def actions(self, verb: str, name: str) -> int:
        """How many times ``verb`` really acted on instance ``name`` (requestId replays excluded)."""
        with self._lock:
            return sum(1 for v, n in self.acted if v == verb and n == name)

    # ------------------------------------------------------------------------------------- protocol

    def dispatch(
        self, method: str, path: str, query: dict[str, str], *, body: bytes, headers: dict[str, str]
    ) -> Response:
        fault = self.faults.take(method, path)
        if fault is not None:
            headers = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
            return self._error(fault.status, f"injected {fault.status}", headers)
        with self._lock:
            self._advance()
            if m := _INSTANCE.match(path):
                key = (m["project"], m["zone"], m["name"])
                if key not in self._instances:
                    return self._error(
                        404,
                        f"The resource 'projects/{key[0]}/zones/{key[1]}/instances/{key[2]}' was not found",
                    )
                if method == "GET" and not m["verb"]:
                    return self._json(200, self._instance_body(key))
                if method == "POST" and m["verb"]:
                    return self._json(200, self._begin(m["verb"], key, query.get("requestId", "")).body)
            elif m := _OPERATION.match(path):
                op = self._ops.get(m["op"])
                if op is None or (op.project, op.zone) != (m["project"], m["zone"]):
                    return self._error(
                        404,
                        f"The resource 'projects/{m['project']}/zones/{m['zone']}/operations/{m['op']}' was not found",
                    )
                if method == "GET" and not m["wait"]:
                    return self._json(200, op.body)
                if method == "POST" and m["wait"]:
                    deadline = time.monotonic() + self.wait_seconds
                    while not op.done and time.monotonic() < deadline:
                        self._lock.release()  # let other requests in while this one waits
                        try:
                            time.sleep(0.01)
                        finally:
                            self._lock.acquire()
                        self._advance()
                    return self._json(200, op.body)
            return self._error(404, f"Unknown path {method} {path}")

    def _begin(self, verb: str, key: tuple[str, str, str], request_id: str) -> _Op:
        project = key[0]
        if request_id and (project, request_id) in self._by_request_id:
            return self._ops[self._by_request_id[(project, request_id)]]
        name = f"operation-{int(time.time() * 1000)}-{next(self._ids):x}"
        fail = self._op_failures.pop(0) if self._op_failures else None
        op = _Op(name, verb, *key, request_id, time.monotonic(), self.op_seconds, fail)
        self._ops[name] = op
        if request_id:
            self._by_request_id[(project, request_id)] = name
        self.acted.append((verb, key[2]))
        inst = self._instances[key]
        if fail is None:
            # A start on a running instance (or a stop on a stopped one) is a no-op that still succeeds.
            if not (verb == "start" and inst["status"] == "RUNNING") and not (
                verb == "stop" and inst["status"] == "TERMINATED"
            ):
                inst["status"] = _STATUS_DURING[verb]
        link = f"{self.url}/compute/v1/projects/{project}/zones/{key[1]}"
        op.body = {
            "kind": "compute#operation",
            "id": str(next(self._ids)),
            "name": name,
            "zone": link,
            "operationType": verb,
            "targetLink": f"{link}/instances/{key[2]}",
            "targetId": inst["id"],
            "status": "RUNNING" if self.op_seconds > 0 else "PENDING",
            "user": "remediation@example.iam.gserviceaccount.com",
            "progress": 0,
            "insertTime": _now(),
            "startTime": _now(),
            "selfLink": f"{link}/operations/{name}",
        }
        if request_id:
            op.body["clientOperationId"] = request_id
        self._advance()
        return op

    def _advance(self) -> None:
        now = time.monotonic()
        for op in self._ops.values():
            if op.done or now < op.created + op.duration:
                continue
            op.done = True
            op.body.update(status="DONE", progress=100, endTime=_now())
            inst = self._instances.get((op.project, op.zone, op.instance))
            if op.fail is not None:
                status, code, message = op.fail
                op.body["error"] = {"errors": [{"code": code, "message": message}]}
                op.body["httpErrorStatusCode"] = status
                op.body["httpErrorMessage"] = {503: "SERVICE UNAVAILABLE", 400: "BAD REQUEST"}.get(
                    status, "ERROR"
                )
                continue
            if inst is None:
                continue
            was_running = inst["status"] == "RUNNING" and op.kind == "start"
            inst["status"] = _STATUS_AFTER[op.kind]
            if op.kind == "stop":
                inst["host"] = None  # a stop releases the host
            if op.kind == "reset" or (op.kind == "start" and not was_running):
                inst["boot_count"] += 1
                inst["lastStartTimestamp"] = _now()
                inst["host"] = inst["host"] or self._new_host()

    def _instance_body(self, key: tuple[str, str, str]) -> dict[str, Any]:
        inst = self._instances[key]
        link = f"{self.url}/compute/v1/projects/{key[0]}/zones/{key[1]}"
        body = {
            "kind": "compute#instance",
            "id": inst["id"],
            "name": inst["name"],
            "zone": link,
            "status": inst["status"],
            "machineType": f"{link}/machineTypes/a3-highgpu-8g",
            "selfLink": f"{link}/instances/{inst['name']}",
        }
        if "lastStartTimestamp" in inst:
            body["lastStartTimestamp"] = inst["lastStartTimestamp"]
        if inst.get("host"):
            body["resourceStatus"] = {"physicalHost": inst["host"]}
        return body

    @staticmethod
    def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
        return (
            status,
            {"Content-Type": "application/json; charset=UTF-8", **(headers or {})},
            json.dumps(body).encode(),
        )

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
        reason = _REASONS.get(status, "backendError" if status >= 500 else "invalid")
        body = {
            "error": {
                "code": status,
                "message": message,
                "errors": [{"message": message, "domain": "global", "reason": reason}],
            }
        }
        return self._json(status, body, headers)
