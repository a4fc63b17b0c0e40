"""SlurmControl over slurmrestd, for deployments where the service runs without munge.

Transport: ``rest_url`` is ``http(s)://host:port`` or ``unix:/path/to.sock`` (httpx's UDS transport).
Auth: JWT via ``X-SLURM-USER-NAME`` / ``X-SLURM-USER-TOKEN`` when configured; on a unix socket
slurmrestd may instead authenticate the peer (``rest_auth/local``).

Reads work on every API version (``GET /slurm/vX/nodes`` has the ``sinfo --json`` shape, parsed by
:mod:`remediation.slurm_json`). Node updates exist from v0.0.39 (``POST /slurm/vX/node/NAME``); on
v0.0.38, the only version Slurm 22.05 offers, every write raises :class:`NotSupported`.

Change detection: ``GET nodes?update_time=T`` answers ``304 Not Modified`` when no node changed since
T, so an idle poll costs one empty response. When something did change, 22.05 answers ``500
"Unspecified error"`` instead of the nodes (observed on 22.05.8), so any answer but 304 is followed by
a plain full read. T is the start of our last full read minus one second: Slurm stamps changes in
whole seconds, and a change in the same second as our read must not be taken as already seen.
"""

from __future__ import annotations

import re
import time
from typing import Any, Literal

import httpx

from remediation.errors import NotSupported, PermanentError, RemediationError, TransientError, UnknownNode
from remediation.hostlist import HostlistError, expand
from remediation.interfaces import SlurmNode
from remediation.settings import SlurmSettings
from remediation.slurm_json import NodesParser, NodeStatus, SlurmFormatError, SlurmReportedError
from workers.adapters.slurm_args import check_node_name, check_reason

_VERSION = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")
_FIRST_WRITABLE = (0, 0, 39)
_ACTIVE_JOB_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED"})


class RestSlurm:
    """The ``rest`` backend."""

    def __init__(self, settings: SlurmSettings, transport: httpx.BaseTransport | None = None) -> None:
        if not settings.rest_url:
            raise PermanentError("slurm.rest_url must be set for the rest backend")
        match = _VERSION.match(settings.rest_api_version)
        if match is None:
            raise PermanentError(f"slurm.rest_api_version {settings.rest_api_version!r} is not like v0.0.38")
        self.version = settings.rest_api_version
        self._version_tuple = tuple(int(p) for p in match.groups())
        headers = {"Accept": "application/json"}
        if settings.rest_user:
            headers["X-SLURM-USER-NAME"] = settings.rest_user
        if settings.rest_token is not None:
            headers["X-SLURM-USER-TOKEN"] = settings.rest_token.get_secret_value()
        url = settings.rest_url
        if url.startswith("unix:"):
            transport = transport or httpx.HTTPTransport(uds=url[len("unix:") :])
            url = "http://slurmrestd"
        self.client = httpx.Client(
            base_url=url, headers=headers, timeout=settings.command_timeout_s, transport=transport
        )
        self._parser = NodesParser()
        self._since: int | None = None

    def close(self) -> None:
        self.client.close()

    # ----------------------------------------------------------------------------------- reads

    def snapshot(self) -> dict[str, NodeStatus]:
        started = int(time.time())
        response = self._request("GET", f"/slurm/{self.version}/nodes")
        result = self._parse_nodes(response)
        self._since = started - 1
        return result

    def poll(self) -> dict[str, NodeStatus] | None:
        """Watcher hook: None when slurmctld says no node changed since our last full read."""
        if self._since is not None:
            response = self._request(
                "GET", f"/slurm/{self.version}/nodes", params={"update_time": self._since}, allow={304, 500}
            )
            if response.status_code == 304:
                return None
        return self.snapshot()

    def list_nodes(self) -> list[SlurmNode]:
        return [status.to_slurm_node() for status in self.snapshot().values()]

    def get_node(self, name: str) -> SlurmNode:
        check_node_name(name)
        response = self._request("GET", f"/slurm/{self.version}/node/{name}")
        nodes = self._parse_nodes(response, NodesParser())
        if name not in nodes:
            raise UnknownNode(f"slurmrestd does not know node {name!r}")
        return nodes[name].to_slurm_node()

    def running_jobs(self, name: str) -> int:
        check_node_name(name)
        self.get_node(name)  # an unknown node is an error, not "no jobs"
        body = self._json(self._request("GET", f"/slurm/{self.version}/jobs"))
        count = 0
        for job in body.get("jobs") or []:
            state = job.get("job_state")
            states = set(state) if isinstance(state, list) else {state}
            if not states & _ACTIVE_JOB_STATES:
                continue
            try:
                if name in expand(job.get("nodes") or ""):
                    count += 1
            except HostlistError as exc:
                raise PermanentError(f"job {job.get('job_id')}: bad node list: {exc}") from None
        return count

    # ---------------------------------------------------------------------------------- writes

    def drain(self, name: str, reason: str) -> None:
        self._update(name, {"state": ["DRAIN"], "reason": check_reason(reason)})

    def set_state(self, name: str, state: Literal["DOWN", "FAIL"], reason: str) -> None:
        if state not in ("DOWN", "FAIL"):
            raise PermanentError(f"set_state supports DOWN and FAIL, not {state!r}")
        self._update(name, {"state": [state], "reason": check_reason(reason)})

    def resume(self, name: str) -> None:
        try:
            self._update(name, {"state": ["RESUME"]})
        except RemediationError as exc:
            # slurmctld refuses to resume a node that is already in service (errno 2028, sent as a 500):
            # the goal is reached, as the cli backend also treats it.
            if "Invalid node state specified" not in exc.message:
                raise

    # ------------------------------------------------------------------------------- internals

    def _update(self, name: str, body: dict[str, Any]) -> None:
        check_node_name(name)
        if self._version_tuple < _FIRST_WRITABLE:
            raise NotSupported(
                f"node updates are not supported by this slurmrestd ({self.version}); they need "
                "v0.0.39 or later (Slurm 23.02+). Use the cli or pyslurm backend for writes."
            )
        response = self._request("POST", f"/slurm/{self.version}/node/{name}", json=body)
        self._json(response)

    def _request(
        self, method: str, path: str, *, allow: set[int] | None = None, **kwargs: Any
    ) -> httpx.Response:
        try:
            response = self.client.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise TransientError(f"slurmrestd {method} {path} timed out: {exc}") from None
        except httpx.TransportError as exc:  # connection refused, socket missing, reset
            raise TransientError(f"slurmrestd {method} {path}: {exc}") from None
        if allow and response.status_code in allow:
            return response
        status = response.status_code
        if status < 400:
            return response
        message = _error_message(response)
        where = f"slurmrestd {method} {path}: HTTP {status}: {message}"
        if "invalid node name" in message.lower() or "not found" in message.lower():
            raise UnknownNode(where, status=status)
        if status == 429 or status >= 500:
            retry = response.headers.get("Retry-After")
            raise TransientError(where, status=status, retry_after=_seconds(retry))
        raise PermanentError(where, status=status)

    def _parse_nodes(
        self, response: httpx.Response, parser: NodesParser | None = None
    ) -> dict[str, NodeStatus]:
        try:
            return (parser or self._parser).parse(response.text)
        except SlurmReportedError as exc:
            if any("invalid node name" in e.lower() for e in exc.errors):
                raise UnknownNode(str(exc)) from None
            raise TransientError(f"slurmrestd: {exc}") from None
        except SlurmFormatError as exc:
            raise PermanentError(f"slurmrestd answered something unexpected: {exc}") from None

    @staticmethod
    def _json(response: httpx.Response) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError:
            raise PermanentError(f"slurmrestd answered non-JSON: {response.text[:200]!r}") from None
        if not isinstance(body, dict):
            raise PermanentError("slurmrestd answered JSON that is not an object")
        errors = body.get("errors") or []
        if errors:
            text = "; ".join(str(e.get("error") or e.get("description") or e) for e in errors if e)
            if "invalid node name" in text.lower():
                raise UnknownNode(f"slurmrestd: {text}")
            raise PermanentError(f"slurmrestd: {text}")
        return body


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
        errors = body.get("errors") or []
        texts = [str(e.get("error") or e.get("description")) for e in errors if isinstance(e, dict)]
        if texts:
            return "; ".join(texts)
    except (ValueError, AttributeError):
        pass
    return response.text.strip()[:500] or response.reason_phrase


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
