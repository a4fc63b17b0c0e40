"""Azure VM actions through azure-mgmt-compute: VMs and scale-set VMs.

Actions go out with ``polling=False``; the ``Azure-AsyncOperation`` URL is ``Operation.ref`` and ``poll``
follows it once through the client's pipeline, refusing any host but the ARM endpoint. A marker tag
(standalone VMs) or a recent provisioning change (scale-set VMs) makes a repeated ``start()`` observe
instead of acting twice. SDK retries are off.

Why: docs/clouds.md#azure-operations
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from azure.core import MatchConditions
from azure.core.credentials import AccessToken, TokenCredential
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline import PipelineResponse
from azure.core.rest import HttpRequest
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.compute.models import VirtualMachineUpdate

from remediation.adapters.cloud.common import (
    MARKER_TAG,
    error_for_status,
    marker_for,
    marker_value,
    parse_marker,
)
from remediation.ports.cluster import HardwareIdentity, Operation, OperationStatus, VMAction, VMRef
from remediation.ports.errors import CredentialError, PermanentError, TransientError
from remediation.settings import MachineSettings

log = logging.getLogger(__name__)

_PUBLIC_ARM = "https://management.azure.com"
_VERBS = {VMAction.RESTART: "restart", VMAction.REDEPLOY: "redeploy", VMAction.REIMAGE: "reimage",
          VMAction.STOP_START: "power_off"}  # fmt: skip
_RUNNING = {"inprogress", "notstarted", "accepted", "running", "updating"}
_TRANSITIONAL = {"updating", "creating", "deleting", "migrating"}
_CLOCK_MARGIN_S = 120.0  # our clock vs ARM's: a change this close to the marker counts as ours


class AzureProvider:
    """:class:`remediation.ports.cluster.MachineProvider` for ``azure://`` VMs and scale-set VMs."""

    def __init__(self, settings: MachineSettings, *, credential: TokenCredential | None = None) -> None:
        self._settings = settings
        self._credential = credential
        self._endpoint = (settings.azure_endpoint or _PUBLIC_ARM).rstrip("/")
        self._lock = threading.Lock()
        self._clients: dict[str, ComputeManagementClient] = {}

    def _client(self, subscription: str) -> ComputeManagementClient:
        with self._lock:
            if subscription not in self._clients:
                if self._credential is None and self._settings.azure_test_token is not None:
                    self._credential = _StaticToken(self._settings.azure_test_token.get_secret_value())
                if self._credential is None:
                    from azure.identity import DefaultAzureCredential

                    self._credential = DefaultAzureCredential()
                scope = self._settings.azure_credential_scope or f"{self._endpoint}/.default"
                timeout = self._settings.request_timeout_s
                self._clients[subscription] = ComputeManagementClient(
                    self._credential, subscription, base_url=self._endpoint, credential_scopes=[scope],
                    polling_interval=self._settings.azure_polling_interval_s, retry_total=0,
                    connection_verify=self._settings.azure_ca_file or True,
                    connection_timeout=timeout, read_timeout=timeout,
                )  # fmt: skip
            return self._clients[subscription]

    # ------------------------------------------------------------------------------------ start

    def start(self, vm: VMRef, action: VMAction, idempotency_key: str) -> Operation:
        if vm.provider != "azure":
            raise PermanentError(f"Azure provider cannot act on a {vm.provider} VM ({vm.provider_id})")
        marker = marker_for(action, idempotency_key)
        try:
            reason = self._already_acted(vm, marker)
        except HttpResponseError as exc:
            raise _translate(exc, vm) from exc
        except (ServiceRequestError, ServiceResponseError) as exc:
            raise TransientError(f"cannot reach Azure Resource Manager: {exc}") from exc
        if reason:
            log.warning("azure %s on %s not re-issued: %s", action, vm.provider_id or vm.name, reason)
            return self._observe(vm, action, reason)
        return self._begin(vm, action, _VERBS[action])

    def identify(self, vm: VMRef) -> HardwareIdentity:
        """The VM's ``vmId`` and size. Azure names the physical host only for a VM on a dedicated host
        (``host``); anywhere else a redeploy is the only sign of a move, and is recorded as one."""
        client = self._client(vm.account)
        try:
            if vm.scale_set:
                current: Any = client.virtual_machine_scale_set_vms.get(vm.group, vm.scale_set, vm.name)
            else:
                current = client.virtual_machines.get(vm.group, vm.name)
        except HttpResponseError as exc:
            raise _translate(exc, vm) from exc
        except (ServiceRequestError, ServiceResponseError) as exc:
            raise TransientError(f"cannot reach Azure Resource Manager: {exc}") from exc
        host = getattr(getattr(current, "host", None), "id", None)
        size = getattr(getattr(current, "hardware_profile", None), "vm_size", None)
        return HardwareIdentity("azure", instance_id=getattr(current, "vm_id", None), host=host, sku=size)

    def _already_acted(self, vm: VMRef, marker: str) -> str | None:
        """Evidence that this start() already acted; records our marker when it did not."""
        client = self._client(vm.account)
        if vm.scale_set:
            ss_view = client.virtual_machine_scale_set_vms.get_instance_view(vm.group, vm.scale_set, vm.name)
            state, since = _provisioning(ss_view.statuses or [])
            if state in _TRANSITIONAL:
                return f"an operation is in progress (ProvisioningState/{state})"
            if since is not None:
                age = (dt.datetime.now(dt.UTC) - since).total_seconds()
                if age < self._settings.azure_vmss_recent_s:
                    return f"its provisioning state changed {age:.0f}s ago (a restart already issued?)"
            return None
        current = client.virtual_machines.get(vm.group, vm.name)
        tags = dict(current.tags or {})
        found = parse_marker(tags.get(MARKER_TAG))
        if found is not None and found[0] == marker:
            view = client.virtual_machines.instance_view(vm.group, vm.name)
            state, since = _provisioning(view.statuses or [])
            if state in _TRANSITIONAL:
                return f"this attempt's marker is set and an operation is in progress (ProvisioningState/{state})"
            if since is None or since.timestamp() >= found[1] - _CLOCK_MARGIN_S:
                return "this attempt's marker is set and the VM changed since it was written"
            log.info("marker set on %s but the VM is unchanged since: the first call did not act", vm.name)
            return None
        tags[MARKER_TAG] = marker_value(marker)
        conditions: dict[str, Any] = {}
        if current.etag:  # another writer in between makes this a 412, retried as transient
            conditions = {"etag": current.etag, "match_condition": MatchConditions.IfNotModified}
        poller = client.virtual_machines.begin_update(
            vm.group, vm.name, VirtualMachineUpdate(tags=tags), **conditions
        )
        poller.wait(timeout=self._settings.request_timeout_s)
        if not poller.done():
            raise TransientError("the marker tag update is still in progress")
        return None

    def _begin(self, vm: VMRef, action: VMAction, verb: str) -> Operation:
        client = self._client(vm.account)
        headers: dict[str, str] = {}

        def capture(response: PipelineResponse[Any, Any]) -> None:
            headers.update(response.http_response.headers)

        ops: Any = client.virtual_machine_scale_set_vms if vm.scale_set else client.virtual_machines
        target: tuple[str, ...] = (vm.group, vm.scale_set, vm.name) if vm.scale_set else (vm.group, vm.name)
        begin: Callable[..., Any] = getattr(ops, f"begin_{verb}")
        try:
            begin(*target, polling=False, raw_response_hook=capture)
        except HttpResponseError as exc:
            raise _translate(exc, vm) from exc
        except (ServiceRequestError, ServiceResponseError) as exc:
            raise TransientError(f"cannot reach Azure Resource Manager: {exc}") from exc
        lowered = {k.lower(): v for k, v in headers.items()}
        async_url = lowered.get("azure-asyncoperation") or lowered.get("location") or ""
        log.info("azure %s issued for %s", verb, vm.provider_id or vm.name)
        data = {
            "mode": "lro" if async_url else "done",
            "phase": verb,
            "location": lowered.get("location", ""),
        }
        return Operation(provider="azure", ref=async_url, action=action, vm=vm, data=data)

    @staticmethod
    def _observe(vm: VMRef, action: VMAction, reason: str) -> Operation:
        return Operation(
            "azure", f"observe:{vm.provider_id}", action, vm, {"mode": "observe", "reason": reason}
        )

    # ------------------------------------------------------------------------------------- poll

    def poll(self, op: Operation) -> OperationStatus:
        try:
            return self._poll(op)
        except HttpResponseError as exc:
            raise _translate(exc, op.vm) from exc
        except (ServiceRequestError, ServiceResponseError) as exc:
            raise TransientError(f"cannot reach Azure Resource Manager: {exc}") from exc

    def _poll(self, op: Operation) -> OperationStatus:
        mode = op.data.get("mode")
        if mode == "observe":
            return self._poll_instance_view(op)
        if mode == "lro":
            response = self._get(op, op.ref)
            if response.status_code == 404:
                # ARM forgets finished operations after a while; the VM itself still tells the outcome.
                return self._poll_instance_view(op)
            body = response.json() if response.content else {}
            status = str(body.get("status", "")).lower()
            if status in _RUNNING:
                return OperationStatus(done=False)
            if status != "succeeded":
                error = body.get("error") or {}
                return OperationStatus(
                    done=True,
                    error=f"Azure {op.data.get('phase')} {body.get('status')}: "
                    f"{error.get('code', '')}: {error.get('message', '')}".strip(),
                )
            if op.data.get("location") and self._get(op, op.data["location"]).status_code == 202:
                return OperationStatus(done=False)
        if op.data.get("phase") == "power_off":
            # Second phase of stop_start. Starting a running VM is a no-op, so a repeated poll is safe.
            return OperationStatus(done=False, replace=self._begin(op.vm, op.action, "start"))
        return OperationStatus(done=True)

    def _get(self, op: Operation, url: str) -> Any:
        if urlsplit(url).netloc.lower() != urlsplit(self._endpoint).netloc.lower():
            raise PermanentError(
                f"refusing to poll {url!r}: not on the configured ARM endpoint {self._endpoint}"
            )
        response = self._client(op.vm.account).send_request(HttpRequest("GET", url))
        if response.status_code >= 400 and response.status_code != 404:
            try:
                message = response.json().get("error", {}).get("message", response.text())
            except ValueError:
                message = response.text()
            raise error_for_status(
                response.status_code, message, vm=op.vm, retry_after=response.headers.get("Retry-After")
            )
        return response

    def _poll_instance_view(self, op: Operation) -> OperationStatus:
        vm = op.vm
        client = self._client(vm.account)
        if vm.scale_set:
            ss_view = client.virtual_machine_scale_set_vms.get_instance_view(vm.group, vm.scale_set, vm.name)
            statuses = ss_view.statuses or []
        else:
            statuses = client.virtual_machines.instance_view(vm.group, vm.name).statuses or []
        state, _ = _provisioning(statuses)
        if state in _TRANSITIONAL:
            return OperationStatus(done=False)
        if state.startswith("failed"):
            failed = next(
                (s for s in statuses if (s.code or "").lower().startswith("provisioningstate/")), None
            )
            detail = (failed.message or failed.display_status) if failed else state
            return OperationStatus(done=True, error=f"Azure VM provisioning {state}: {detail}")
        return OperationStatus(done=True)


class _StaticToken:
    """``machine.azure_test_token`` as a TokenCredential: the bearer policy runs as against ARM, but the
    token is fixed (settings refuse it unless the endpoint is local)."""

    def __init__(self, token: str) -> None:
        self._token = token

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken(self._token, int(dt.datetime.now(dt.UTC).timestamp()) + 3600)


def _provisioning(statuses: list[Any]) -> tuple[str, dt.datetime | None]:
    """ProvisioningState (lower-case, e.g. ``succeeded``, ``updating``, ``failed/x``) and its time."""
    for status in statuses:
        code = (status.code or "").lower()
        if code.startswith("provisioningstate/"):
            return code.split("/", 1)[1], status.time
    return "", None


def _translate(exc: HttpResponseError, vm: VMRef) -> Exception:
    headers = getattr(exc.response, "headers", None) or {}
    status = exc.status_code
    if isinstance(exc, ClientAuthenticationError) and status is None:
        return CredentialError(f"Azure credentials rejected: {exc.message}", component="cloud")
    return error_for_status(status, exc.message, vm=vm, retry_after=headers.get("Retry-After"))
