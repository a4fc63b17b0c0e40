"""The CLI's API mode: every read and lever over ``/api/v1`` with a bearer token (``--server URL``).

Server and token come from flags or the environment (``--token-file``, ``REMEDIATION_TOKEN_FILE``,
``REMEDIATION_TOKEN``); there is no ``--token`` flag. Replies parse into the direct mode's read-model
types. HTTP errors map to exit codes: 400 and 401 are 2, 403/404/409/422 are 1, 5xx and no server are 3.

Why: docs/running.md#the-cli
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from pydantic import TypeAdapter

from remediation.cli.context import EXIT_CONFIG, EXIT_DATABASE, EXIT_REQUEST, CliError
from remediation.repair_requests.rules import CallbackStatus, RepairStatus, answered_text
from remediation.services.lemons import LemonRow
from remediation.services.readmodels import (
    AuditRow,
    ClusterState,
    EventRow,
    NodeDetail,
    NodeRow,
    RejectedRow,
    RemediationDetail,
    RemediationRow,
)
from remediation.services.stats import Stats
from remediation.settings import LemonSettings
from remediation.settings.transport import clear_to_remote

if TYPE_CHECKING:  # httpx is imported where a Remote is made: the direct mode never loads it
    import httpx

SERVER_ENV, TOKEN_ENV, TOKEN_FILE_ENV = "REMEDIATION_SERVER", "REMEDIATION_TOKEN", "REMEDIATION_TOKEN_FILE"
T = TypeVar("T")
TIMEOUT_S = 30.0


def read_token(token_file: str | None, token_env: str | None) -> str:
    """The bearer token: the file's content (stripped) if a file is named, else the environment's."""
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise CliError(f"--token-file {token_file}: {exc.strerror}", EXIT_CONFIG) from None
        if not token:
            raise CliError(f"--token-file {token_file}: the file is empty", EXIT_CONFIG)
        return token
    if token_env and token_env.strip():
        return token_env.strip()
    raise CliError(
        "--server needs a token: --token-file PATH, REMEDIATION_TOKEN_FILE or REMEDIATION_TOKEN", EXIT_CONFIG
    )


def check_transport(server: str, insecure: bool) -> None:
    """Refuse to send the bearer token in clear: ``http://`` only to this machine's loopback (an SSH
    tunnel, a port-forward) or with ``--insecure``. Anyone on the path of a plain-HTTP request to
    another host reads the token and can pull levers with it."""
    host = None if insecure else clear_to_remote(server)
    if host is not None:
        raise CliError(
            f"--server {server}: http:// would send your token in clear to {host}; use "
            "https://, a loopback address (an SSH tunnel or port-forward), or --insecure to send it anyway",
            EXIT_CONFIG,
        )


class Remote:
    """Reads and levers through the API; the server audits levers as the token's name (``via=api``)."""

    mode = "api"

    def __init__(self, server: str, token: str, client: httpx.Client | None = None) -> None:
        url = server.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise CliError(
                f"--server {server}: give a URL, e.g. https://remediation.example:8080", EXIT_CONFIG
            )
        self.server = url
        import httpx

        self._client = client or httpx.Client(base_url=url, timeout=TIMEOUT_S)
        self._headers = {"Authorization": f"Bearer {token}"}
        self.cluster: str | None = None  # --cluster, sent as ?cluster= on every request

    def close(self) -> None:
        self._client.close()

    # ------------------------------------------------------------------------------------- HTTP

    def _call(
        self, method: str, path: str, params: dict[str, Any] | None = None, *, body: dict[str,
            Any] | None = None, text: bool = False
    ) -> Any:
        import httpx

        query = {k: v for k, v in {"cluster": self.cluster, **(params or {})}.items() if v is not None}
        try:
            resp = self._client.request(
                method, f"/api/v1{path}", params=query, json=body, headers=self._headers
            )
        except httpx.HTTPError as exc:
            raise CliError(
                f"cannot reach {self.server}: {type(exc).__name__}: {exc}", EXIT_DATABASE
            ) from None
        if resp.is_success:
            return resp.text if text else resp.json()
        detail = _detail(resp)
        if resp.status_code == 400:  # a usage error: a node name in several clusters, no --cluster
            raise CliError(detail, EXIT_CONFIG)
        if resp.status_code == 401:
            raise CliError(f"{self.server} refused the token ({detail})", EXIT_CONFIG)
        if resp.status_code == 403:
            raise CliError(f"refused by {self.server}: {detail}", EXIT_REQUEST)
        if resp.status_code >= 500:
            raise CliError(f"{self.server} is unavailable ({resp.status_code}: {detail})", EXIT_DATABASE)
        raise CliError(detail, EXIT_REQUEST)

    def _get(self, kind: type[T] | Any, path: str, **params: Any) -> T:
        return TypeAdapter(kind).validate_python(self._call("GET", path, params))  # type: ignore[no-any-return]

    def _lever(self, path: str, reason: str, **extra: Any) -> str:
        result = self._call("POST", path, body={"reason": reason, **extra})
        message = str(result.get("message", ""))
        if result.get("queued") is False:  # committed; the follow-up could not be handed to the workers
            raise CliError(message, EXIT_REQUEST)
        return message

    # ------------------------------------------------------------------------------------ reads

    def nodes(self, status: str | None, profile: str | None = None) -> list[NodeRow]:
        return self._get(list[NodeRow], "/nodes", status=status, profile=profile)

    def node(self, name: str) -> NodeRow:
        return self.node_detail(name, 1).node

    def node_detail(self, name: str, limit: int) -> NodeDetail:
        return self._get(NodeDetail, f"/nodes/{_seg(name)}", limit=limit)

    def events(self, node: str | None, after: int | None, limit: int) -> list[EventRow]:
        return self._get(list[EventRow], "/events", node=node, after=after, limit=limit)

    def remediations(self, status: str | None, node: str | None, limit: int,
                     *, profile: str | None = None) -> list[RemediationRow]:
        # The API lists open ones unless told otherwise; "" is every status, as the CLI means by no filter.
        return self._get(list[RemediationRow], "/remediations", status=status or "", node=node, limit=limit,
                         profile=profile)

    def remediation(self, remediation_id: int) -> RemediationDetail:
        return self._get(RemediationDetail, f"/remediations/{remediation_id}")

    def evidence(self, remediation_id: int, name: str, step_id: int | None = None) -> str:
        return str(self._call("GET", f"/remediations/{remediation_id}/evidence/{quote(name, safe='')}",
                              {"step": step_id}, text=True))

    def rejected(self, limit: int) -> list[RejectedRow]:
        return self._get(list[RejectedRow], "/rejected", limit=limit)

    def audit(self, target: str | None, action: str | None, limit: int) -> list[AuditRow]:
        return self._get(list[AuditRow], "/audit", target=target, action=action, limit=limit)

    def stats(self, days: int, top: int, dry_run: bool, *, profile: str | None = None) -> Stats:
        return self._get(Stats, "/stats", days=days, top=top, dry_run=dry_run, profile=profile)

    def lemons(self, top: int) -> list[LemonRow]:
        return self._get(list[LemonRow], "/lemons", top=top)

    def lemon_policy(self) -> LemonSettings | None:
        return None  # the server's policy: its rows say which nodes are over the threshold

    def status(self) -> dict[str, Any]:
        return dict(self._call("GET", "/status"))

    def whoami(self) -> dict[str, Any]:
        return dict(self._call("GET", "/whoami"))

    def incidents(self, status: str | None, limit: int) -> list[dict[str, Any]]:
        return list(self._get(list[dict[str, Any]], "/incidents", status=status, limit=limit))

    def incident(self, incident_id: int) -> dict[str, Any]:
        return dict(self._call("GET", f"/incidents/{incident_id}"))

    def repairs(self, status: str | None, limit: int) -> list[dict[str, Any]]:
        return list(self._get(list[dict[str, Any]], "/domain-repairs", status=status, limit=limit))

    def repair(self, repair_id: int) -> dict[str, Any]:
        return dict(self._call("GET", f"/domain-repairs/{repair_id}"))

    def policy_show(self, profile: str | None) -> dict[str, Any]:
        return dict(self._call("GET", f"/policy/profiles/{_seg(profile)}" if profile else "/policy"))

    def policy_explain(self, node: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/nodes/{_seg(node)}/policy"))

    def clusters(self) -> list[ClusterState]:
        return self._get(list[ClusterState], "/clusters")

    def breaker(self, profile: str | None = None) -> dict[str, Any]:
        latch = dict(self._call("GET", "/breaker", {"profile": profile}))
        latch["at"] = latch.pop("since", None)
        return latch

    # ----------------------------------------------------------------------------------- levers

    def quarantine(self, node: str, reason: str) -> str:
        return self._lever(f"/nodes/{_seg(node)}/quarantine", reason)

    def release(self, node: str, reason: str) -> str:
        return self._lever(f"/nodes/{_seg(node)}/release", reason)

    def cancel(self, remediation_id: int, reason: str, give_back: bool) -> str:
        return self._lever(f"/remediations/{remediation_id}/cancel", reason, give_back=give_back)

    def set_paused(self, paused: bool, reason: str) -> str:
        return self._lever("/pause" if paused else "/resume", reason)

    def report(self, node: str, reason: str) -> str:
        return self._lever(f"/nodes/{_seg(node)}/report", reason)

    def close_breaker(self, reason: str, profile: str | None = None) -> str:
        return self._lever("/breaker/close", reason, **({"profile": profile} if profile else {}))

    def resolve_incident(self, incident_id: int, reason: str) -> str:
        return self._lever(f"/incidents/{incident_id}/resolve", reason)

    def cancel_repair(self, repair_id: int, reason: str) -> str:
        return self._lever(f"/domain-repairs/{repair_id}/cancel", reason)

    def repair_requests(self, status: str | None, node: str | None, limit: int) -> list[dict[str, Any]]:
        return list(self._get(list[dict[str, Any]], "/repair-requests", status=status, node=node, limit=limit))

    def repair_request(self, request_id: int) -> dict[str, Any]:
        return dict(self._call("GET", f"/repair-requests/{request_id}"))

    def answer_repair(self, node: str, status: CallbackStatus, *, ticket: str, note: str | None) -> str:
        found = self.repair_requests(RepairStatus.OPEN, node, 1)
        if not found:
            raise CliError(f"{node} has no open repair request (see `remediation repair list`)", EXIT_REQUEST)
        rid = int(found[0]["id"])
        said = self._call("POST", f"/repair-requests/{rid}/callback",
                          body={"status": status.value, "ticket": ticket, **({"note": note} if note else {})})
        return answered_text(node, rid, said.get("recheck_id"))


def _seg(value: str) -> str:
    """One path segment, escaped: a node name can never reach another endpoint."""
    return quote(value, safe="")


def _detail(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail")
    except ValueError:
        return f"HTTP {resp.status_code}"
    if isinstance(detail, list):  # FastAPI's validation errors: name each bad field
        return "; ".join(f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail)
    return str(detail or f"HTTP {resp.status_code}")
