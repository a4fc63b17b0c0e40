"""A slurmrestd stand-in: the node and job endpoints the ``rest`` Slurm backend uses, over real HTTP.

Serves a :class:`remediation.simulator.slurmctld.SlurmCtld` table in the shapes of v0.0.38 to v0.0.42: nodes (with
``update_time`` and 304), one node, jobs, node updates (v0.0.39+). With ``token`` set, requests need
``X-SLURM-USER-TOKEN``. While slurmctld stalls, a request waits up to ``message_timeout_s`` and is
answered as slurmrestd does then: 500 with errno 5004. Kept for fault injection, JWT auth and scale; its answers are checked against real
slurmrestd.

Why: docs/wire-protocols.md#the-slurm-stand-ins
"""

from __future__ import annotations

import json
import re
import ssl
import time
from typing import Any

from remediation.simulator.fakehttp import FakeServer, Response
from remediation.simulator.slurmctld import ERR_SOCKET_TIMEOUT, CtldNode, Job, SlurmCtld, SlurmError

VERSIONS = ("v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42")
#: What 26.05's openapi/slurmctld serves instead (seen on 26.05.5), and how it words what changed.
VERSIONS_2605 = ("v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45")
_NOT_FOUND_2605 = (b"Unable to find requested URL endpoint. Please query the '/openapi/v3' endpoint or visit "
                   b"'https://slurm.schedmd.com/rest_api.html' for the OpenAPI specification which includes a "
                   b"list of all possible slurmrestd endpoints.")
ERR_INVALID_NODE_STATE_TRANSITION = 2180
_PATH = re.compile(r"^/slurm/(?P<version>v0\.0\.\d+)/(?P<what>nodes|node|jobs|ping)(?:/(?P<name>[^/]+))?$")
_NOT_FOUND = b"Unable find requested URL. Please view /openapi/v3 for API reference."
#: How long slurmrestd waits for slurmctld before it gives up (slurm.conf's MessageTimeout, 10 s by
#: default; short here so that a stall costs a simulated cluster's clients seconds, not tens of them).
MESSAGE_TIMEOUT_S = 1.0


class SlurmRestd(FakeServer):
    """``url`` is what ``slurm.rest_url`` takes."""

    def __init__(
        self, ctld: SlurmCtld, *, token: str | None = None, user: str = "remediation", release: tuple[int, int] = (24, 11),
        ssl_context: ssl.SSLContext | None = None, message_timeout_s: float = MESSAGE_TIMEOUT_S,
    ) -> None:
        super().__init__(ssl_context)
        self.ctld = ctld
        self.message_timeout_s = message_timeout_s
        self.newest = release >= (26, 5)  # answer as 26.05 does: its versions, words and errnos
        self.versions = VERSIONS_2605 if self.newest else VERSIONS
        self.not_found = _NOT_FOUND_2605 if self.newest else _NOT_FOUND
        self.token = token
        self.user = user

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def scheme(self) -> str:
        return "http" if self._httpd.ssl_context is None else "https"

    def dispatch(
        self, method: str, path: str, query: dict[str, str], *, body: bytes, headers: dict[str, str]
    ) -> Response:
        fault = self.faults.take(method, path)
        if fault is not None:
            extra = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
            return fault.status, {"Content-Type": "text/plain", **extra}, b"injected fault"
        user = "root"
        if self.token is not None:
            if headers.get("x-slurm-user-token") != self.token or not headers.get("x-slurm-user-name"):
                return 401, {"Content-Type": "text/plain"}, b"Authentication failure"
            user = headers["x-slurm-user-name"]
        match = _PATH.match(path)
        if match is None or match["version"] not in self.versions:
            return 404, {"Content-Type": "text/plain"}, self.not_found
        version, what, name = match["version"], match["what"], match["name"]
        if (left := self.ctld.stall_left()) > 0:
            return self._timed_out(version, left, "_update_node" if method == "POST" else f"slurm_load_{what}")
        if method == "GET" and what == "nodes" and name is None:
            return self._nodes(version, query.get("update_time"))
        if method == "GET" and what == "node" and name:
            return self._one_node(version, name)
        if method == "GET" and what == "jobs" and name is None:
            return self._jobs(version)
        if method == "GET" and what == "ping":
            return _json(200, {**_envelope(version), "pings": [{"hostname": "localhost", "ping": "UP"}]})
        if method == "POST" and what == "node" and name:
            if version == "v0.0.38":
                return 405, {"Content-Type": "text/plain"}, b"Method not allowed: v0.0.38 is read-only"
            return self._update(version, name, body, user=user)
        return 404, {"Content-Type": "text/plain"}, self.not_found

    # ------------------------------------------------------------------------------------ routes

    def _timed_out(self, version: str, left: float, source: str) -> Response:
        """slurmctld did not answer within MessageTimeout: slurmrestd waited for it, then gave up."""
        time.sleep(min(left, self.message_timeout_s))
        return _error(version, SlurmError(ERR_SOCKET_TIMEOUT, "Socket timed out on send/recv operation"), source)

    def _nodes(self, version: str, update_time: str | None) -> Response:
        ctld = self.ctld
        with ctld.lock:
            ctld.tick()
            if update_time is not None and update_time.isdigit() and int(update_time) - 1 >= ctld.last_update:
                return 304, {}, b""
            nodes = [node_doc(ctld, ctld.node(n), version) for n in ctld.names()]
        return _json(200, {**_envelope(version), "nodes": nodes})

    def _one_node(self, version: str, name: str) -> Response:
        try:
            with self.ctld.lock:
                doc = node_doc(self.ctld, self.ctld.node(name), version)
        except SlurmError as exc:
            if version not in ("v0.0.38", "v0.0.39"):  # 24.11: 200, no nodes, errno 0 "No error"
                body = _errors(version, 0, "No error", source="_dump_nodes",
                               description=f"Failure to query node {name}")
                return _json(200, body)
            return _error(version, exc, "slurm_load_node_single", extra={"nodes": []})
        return _json(200, {**_envelope(version), "nodes": [doc]})

    def _jobs(self, version: str) -> Response:
        return _json(200, {**_envelope(version), "jobs": [job_doc(j, version) for j in self.ctld.jobs()]})

    def _update(self, version: str, name: str, body: bytes, *, user: str) -> Response:
        try:
            update = json.loads(body or b"{}")
        except ValueError:
            return _json(400, _errors(version, 9001, "Unable to parse query", source="parse"))
        states = update.get("state") or []
        states = [states] if isinstance(states, str) else states
        try:
            if len(states) != 1:
                raise SlurmError(2028, "Invalid node state specified")
            self.ctld.update(name, str(states[0]), str(update.get("reason") or ""), user=user)
        except SlurmError as exc:
            if self.newest and exc.errno == 2028:  # 26.05 refuses a resume of a node in service so
                exc = SlurmError(ERR_INVALID_NODE_STATE_TRANSITION, "Invalid node state transition")
            return _error(version, exc, "_update_node", description=f"Failure to update node {name}",
                          status=422 if self.newest else 500)
        return _json(200, {**_envelope(version), "warnings": []})


# -------------------------------------------------------------------------------------- documents


def _envelope(version: str) -> dict[str, Any]:
    major, minor, micro = (22, 5, 8) if version == "v0.0.38" else (23, 2, 7) if version == "v0.0.39" else (24, 11, 5)
    return {
        "meta": {
            "plugin": {"type": f"openapi/{version}", "name": f"Slurm OpenAPI {version}"},
            "Slurm": {
                "version": {"major": major, "micro": micro, "minor": minor},
                "release": f"{major}.{minor:02d}.{micro}",
            },
        },
        "errors": [],
    }


def _errors(version: str, errno: int, message: str, *, source: str, description: str = "") -> dict[str, Any]:
    if version == "v0.0.38":
        error: dict[str, Any] = {"error": message, "errno": errno}
    else:
        error = {"description": description or message, "error_number": errno, "error": message, "source": source}
    return {**_envelope(version), "errors": [error]}


def _error(
    version: str, exc: SlurmError, source: str, *, extra: dict[str, Any] | None = None, description: str = "",
    status: int = 500,
) -> Response:
    # slurmrestd answers Slurm's refusals with the errno in the body, and 500 INTERNAL ERROR (22.05 and
    # 24.11) or, for a node update, 422 UNPROCESSABLE CONTENT (26.05).
    return _json(status, {**_errors(version, exc.errno, exc.message, source=source, description=description),
                          **(extra or {})})


def _number(version: str, value: int) -> Any:
    if version in ("v0.0.38", "v0.0.39"):
        return value
    return {"set": value > 0, "infinite": False, "number": value}


def node_doc(ctld: SlurmCtld, node: CtldNode, version: str) -> dict[str, Any]:
    base = ctld.base_state(node)
    flags = sorted(node.flags)
    doc: dict[str, Any] = {
        "architecture": "x86_64",
        "boards": 1,
        "boot_time": _number(version, node.boot_time),
        "cores": 1,
        "cpus": 64,
        "gres": "gpu:8",
        "gres_drained": "N/A",
        "gres_used": "gpu:8" if base == "ALLOCATED" else "gpu:0",
        "name": node.name,
        "address": "127.0.0.1",
        "hostname": node.name,
        "operating_system": "Linux 6.1.0-28-cloud-amd64",
        "partitions": ["gpu"],
        "port": node.port,
        "real_memory": 512000,
        "reason": node.reason,
        "reason_changed_at": _number(version, node.reason_changed_at),
        "reason_set_by_user": node.reason_user,
        "slurmd_start_time": _number(version, node.slurmd_start_time),
        "slurmd_version": _envelope(version)["meta"]["Slurm"]["release"],
        "sockets": 64,
        "threads": 1,
        "tres": "cpu=64,mem=500G,billing=64,gres/gpu=8",
    }
    if version == "v0.0.38":
        doc["state"], doc["state_flags"] = base.lower(), flags
    else:
        doc["state"] = [base, *flags]
    return doc


def job_doc(job: Job, version: str) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "name": job.name,
        "user_name": job.user,
        "partition": "gpu",
        "job_state": job.state if version == "v0.0.38" else [job.state],
        "nodes": _hostlist(job.nodes),
        "node_count": _number(version, len(job.nodes)),
        "start_time": _number(version, job.start_time),
        "end_time": _number(version, job.end_time),
    }


def _hostlist(names: tuple[str, ...]) -> str:
    """Compress ``prefix-N`` names into Slurm's ``prefix-[a-b,c]`` form (what squeue prints)."""
    groups: dict[str, list[int]] = {}
    plain: list[str] = []
    for name in names:
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if m and not (len(m[2]) > 1 and m[2].startswith("0")):
            groups.setdefault(m[1], []).append(int(m[2]))
        else:
            plain.append(name)
    parts = list(plain)
    for prefix, numbers in groups.items():
        numbers.sort()
        ranges: list[str] = []
        start = prev = numbers[0]
        for n in [*numbers[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            ranges.append(f"{start}-{prev}" if prev != start else str(start))
            if n is not None:
                start = prev = n
        parts.append(f"{prefix}{ranges[0]}" if len(numbers) == 1 else f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)


def _json(status: int, body: dict[str, Any]) -> Response:
    return status, {"Content-Type": "application/json"}, json.dumps(body, indent=2).encode()
