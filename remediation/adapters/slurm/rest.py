"""SlurmControl over slurmrestd, for deployments where the service runs without munge.

``rest_url`` is ``http(s)://host:port`` or ``unix:/path/to.sock``; JWT auth via ``rest_user`` and
``rest_token``, or peer auth on a socket. Reads on every API version; writes from v0.0.39
(:class:`NotSupported` on v0.0.38). Idle polls use ``update_time`` and 304. Refusals are classified by the
one Slurm table and the one HTTP table (:mod:`remediation.ports.errors`).

Why: docs/slurm-releases.md#slurmrestd-change-detection
"""

from __future__ import annotations

import re
import ssl
import time
from typing import Any, Literal

import httpx

from remediation.adapters.slurm.args import check_node_name, check_reason
from remediation.adapters.slurm.parse import NodeRecord, NodesParser, SlurmFormatError, SlurmReportedError
from remediation.hostlist import HostlistError, expand
from remediation.ports.cluster import SlurmNode
from remediation.ports.errors import (
    ConfigError,
    NotSupported,
    PermanentError,
    RemediationError,
    TransientError,
    UnknownNode,
    error_for_slurm,
    error_for_status,
)
from remediation.settings import SlurmSettings

_VERSION = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")
_FIRST_WRITABLE = (0, 0, 39)
#: errno 9202 "Unable to convert Data type": 24.11's v0.0.40 and v0.0.41 parsers refuse a Unix time in
#: ``update_time`` (v0.0.42 takes it); such a server is then polled with plain full reads.
_CANNOT_PARSE_TIME = 9202
#: slurmctld's refusal to resume a node already in service: errno 2028 "Invalid node state specified"
#: (22.05, 24.11), errno 2180 "Invalid node state transition" (26.05).
_REFUSED_RESUME = frozenset({2028, 2180})
_ACTIVE_JOB_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED"})


class RestSlurm:
    """The ``rest`` backend."""

    def __init__(self, settings: SlurmSettings, transport: httpx.BaseTransport | None = None) -> None:
        if not settings.rest_url:
            raise ConfigError("slurm.rest_url must be set for the rest backend", component="slurm")
        match = _VERSION.match(settings.rest_api_version)
        if match is None:
            raise ConfigError(f"slurm.rest_api_version {settings.rest_api_version!r} is not like v0.0.38",
                              component="slurm")
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
            base_url=url, headers=headers, timeout=settings.command_timeout_s, transport=transport,
            verify=_verify(settings),
        )
        self._parser = NodesParser()
        self._since: int | None = None
        self._conditional = True  # False once the server refuses update_time

    def close(self) -> None:
        """Close the connection pool: its socket to slurmrestd stays open until then."""
        self.client.close()

    def __enter__(self) -> RestSlurm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------- reads

    def snapshot(self) -> dict[str, NodeRecord]:
        started = int(time.time())
        response = self._request("GET", f"/slurm/{self.version}/nodes")
        result = self._parse_nodes(response)
        self._since = started - 1
        return result

    def poll(self) -> dict[str, NodeRecord] | None:
        """Watcher hook: None when slurmctld says no node changed since our last full read."""
        if self._since is not None and self._conditional:
            response = self._request(
                "GET", f"/slurm/{self.version}/nodes", params={"update_time": self._since}, allow={304, 500}
            )
            if response.status_code == 304:
                return None
            if any(errno == _CANNOT_PARSE_TIME for _, errno in _errors(response)):
                self._conditional = False  # this API version cannot take update_time (24.11's v0.0.40/41)
        return self.snapshot()

    def list_nodes(self) -> list[SlurmNode]:
        return [status.to_slurm_node() for status in self.snapshot().values()]

    def get_node(self, name: str) -> SlurmNode:
        return self.status(name).to_slurm_node()

    def status(self, name: str) -> NodeRecord:
        check_node_name(name)
        response = self._request("GET", f"/slurm/{self.version}/node/{name}")
        nodes = self._parse_nodes(response, NodesParser())
        if name not in nodes:
            raise UnknownNode(f"slurmrestd does not know node {name!r}")
        return nodes[name]

    def running_jobs(self, name: str) -> int:
        return len(self.jobs_on(name))

    def jobs_on(self, name: str) -> list[str]:
        check_node_name(name)
        self.get_node(name)  # an unknown node is an error, not "no jobs"
        body = self._json(self._request("GET", f"/slurm/{self.version}/jobs"))
        found: set[str] = set()
        for job in body.get("jobs") or []:
            state = job.get("job_state")
            states = set(state) if isinstance(state, list) else {state}
            if not states & _ACTIVE_JOB_STATES:
                continue
            try:
                if name in expand(job.get("nodes") or ""):
                    found.add(str(job.get("job_id")))
            except HostlistError as exc:
                raise PermanentError(f"job {job.get('job_id')}: bad node list: {exc}") from None
        return sorted(found)

    def requeue_jobs(self, job_ids: list[str]) -> None:
        raise NotSupported(
            "slurmrestd has no job requeue; set workflow.on_jobs_timeout to hold or cancel, or use the "
            "cli or pyslurm backend"
        )

    def cancel_jobs(self, job_ids: list[str]) -> None:
        raise NotSupported(
            "job cancellation through slurmrestd is not implemented; set workflow.on_jobs_timeout to "
            "hold, or use the cli backend"
        )

    def signal_jobs(self, job_ids: list[str], signal: str, scope: Literal["batch", "full"]) -> None:
        raise NotSupported(
            "slurmrestd cannot signal a job here; a checkpoint request (workflow.checkpoint_signal) needs the "
            "cli backend"
        )

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
        except SlurmRestError as exc:
            # slurmctld refuses to resume a node that is already in service (errno 2028, on 26.05 2180,
            # sent as a 500, on 26.05 a 422): the goal is reached, as the cli backend also treats it. Any other refusal,
            # or that one for a node still out of service, is passed on.
            if not exc.errnos & _REFUSED_RESUME or self.status(name).states & {"DRAIN", "DOWN", "FAIL"}:
                raise

    # ------------------------------------------------------------------------- other requests

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return self._version_tuple

    def answer(
        self, method: str, path: str, *, json: dict[str, Any] | None = None, tolerate: frozenset[int] | set[int] = frozenset()
    ) -> tuple[dict[str, Any], frozenset[int]]:
        """slurmrestd's JSON answer to one request, and the Slurm errnos of its ``errors[]``. A refusal
        whose errnos all lie in ``tolerate`` is returned (the caller knows what it means); any other is
        raised typed, as every request of this backend is."""
        kwargs: dict[str, Any] = {} if json is None else {"json": json}
        response = self._request(method, path, allow={400, 404, 422, 500} if tolerate else None, **kwargs)
        errnos = frozenset(errno for _, errno in _errors(response) if errno)
        if tolerate and errnos and errnos <= frozenset(tolerate):
            return response.json(), errnos
        if response.status_code >= 400:
            raise self._error(method, path, response)
        return self._json(response), frozenset()

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
        if response.status_code < 400:
            return response
        raise self._error(method, path, response)

    def _error(self, method: str, path: str, response: httpx.Response) -> RemediationError:
        """slurmrestd's answer as a typed error (checked on 22.05 and 24.11's v0.0.40-42):

        - a bare 404 ("Unable find requested URL") is a path this slurmrestd does not serve, i.e. an
          API version or plugin it was not started with: a configuration fault, never the node's;
        - 401/403 (token missing, expired or not allowed) are the system's fault (the one HTTP table);
        - with ``errors[]`` (24.11 sends slurmctld's refusals as 500, 26.05 as 422, + errors[] with Slurm's errno),
          the one Slurm table decides: unreachable controller -> system, "Invalid node name" -> the
          node is unknown, any other refusal carrying a Slurm errno -> this node's request is refused;
        - anything else falls to the HTTP table (5xx and 429 transient, other 4xx refused).
        """
        status = response.status_code
        errors = _errors(response)
        message = "; ".join(text for text, _ in errors) or _text(response)
        where = f"slurmrestd {method} {path}: HTTP {status}: {message}"
        if status == 404 and not errors and "requested url" in message.lower():
            return ConfigError(
                f"{where} (is slurm.rest_api_version {self.version} served by this slurmrestd? 22.05 "
                "serves v0.0.38; 24.11 serves v0.0.40 to v0.0.42 and 26.05 v0.0.42 to v0.0.45, with -s "
                "openapi/slurmctld)",
                component="slurm",
            )
        retry = _seconds(response.headers.get("Retry-After"))
        if status in (401, 403) or not errors:
            return error_for_status(status, where, retry_after=retry, not_found=UnknownNode, component="slurm")
        refused = any(errno for _, errno in errors) or status < 500
        from_slurm = _with_errnos(error_for_slurm(where, node_error=SlurmRestError), errors)
        if refused or type(from_slurm) is not SlurmRestError:  # Slurm's errno, or a message the table knows
            return from_slurm
        return error_for_status(status, where, retry_after=retry, not_found=UnknownNode, component="slurm")

    def _parse_nodes(
        self, response: httpx.Response, parser: NodesParser | None = None
    ) -> dict[str, NodeRecord]:
        try:
            return (parser or self._parser).parse(response.text)
        except SlurmReportedError as exc:
            # 24.11 answers a GET of an unknown node 200 with errors[] "Failure to query node X".
            texts = [text.lower() for text, _ in _errors(response)] + [e.lower() for e in exc.errors]
            if any("invalid node name" in t or "failure to query node" in t for t in texts):
                raise UnknownNode(f"slurmrestd: {'; '.join(t for t, _ in _errors(response))}") from None
            raise error_for_slurm(f"slurmrestd: {exc}", node_error=TransientError) from None
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
        errors = _errors(response)
        if errors:
            raise _with_errnos(
                error_for_slurm("slurmrestd: " + "; ".join(text for text, _ in errors), node_error=SlurmRestError),
                errors,
            )
        return body


class SlurmRestError(PermanentError):
    """slurmctld, through slurmrestd, refused this node's request; carries Slurm's errors[] and their errnos."""

    errnos: frozenset[int] = frozenset()


def _with_errnos(error: RemediationError, errors: list[tuple[str, int]]) -> RemediationError:
    if isinstance(error, SlurmRestError):
        error.errnos = frozenset(errno for _, errno in errors if errno)
    return error


def _errors(response: httpx.Response) -> list[tuple[str, int]]:
    """slurmrestd's ``errors[]`` as (text, Slurm errno): "error: description" (24.11 puts the Slurm
    message in ``error`` and what it was doing in ``description``; 22.05 may send either alone)."""
    try:
        body = response.json()
    except ValueError:
        return []
    found: list[tuple[str, int]] = []
    for entry in (body.get("errors") or []) if isinstance(body, dict) else []:
        if not isinstance(entry, dict):
            continue
        error, description = str(entry.get("error") or ""), str(entry.get("description") or "")
        if error.lower() == "no error":
            error = ""
        text = ": ".join(part for part in (error, description) if part) or "unspecified error"
        errno = entry.get("error_number", entry.get("errno"))
        found.append((text, errno if isinstance(errno, int) and not isinstance(errno, bool) else 0))
    return found


def _text(response: httpx.Response) -> str:
    return response.text.strip()[:500] or response.reason_phrase


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _verify(settings: SlurmSettings) -> ssl.SSLContext | bool:
    """How slurmrestd's certificate is checked: against ``rest_ca_file``, else the system store; never
    skipped. An unreadable CA file is a configuration error (automation pauses), not a node's fault."""
    if not settings.rest_ca_file:
        return True
    try:
        return ssl.create_default_context(cafile=settings.rest_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"slurm.rest_ca_file {settings.rest_ca_file}: {exc}", component="slurm") from None
