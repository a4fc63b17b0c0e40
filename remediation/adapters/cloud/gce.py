"""Compute Engine VM actions through google-cloud-compute (REST transport).

Every mutating call carries a ``request_id`` derived from the idempotency key, so a repeat returns the
original operation. ``poll`` reads the operation once with a :class:`ZoneOperationsClient` and issues the
start phase of ``stop_start``. No reimage (:class:`NotSupported`). ``identify`` reads the instance once.
SDK retries are off.

Why: docs/clouds.md#gce-operations
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

import requests
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth import exceptions as auth_exc
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import compute_v1

from remediation.adapters.cloud.common import check_restartable, error_for_status
from remediation.ports.cluster import HardwareIdentity, Operation, OperationStatus, VMAction, VMRef
from remediation.ports.errors import CredentialError, PermanentError, TransientError
from remediation.settings import MachineSettings

log = logging.getLogger(__name__)

_REQUEST_NS = uuid.UUID("5b0c3f7e-8a55-4a43-9d0c-6f1f3c0e2a11")  # fixed: ids must be stable across processes
_SCOPES = ["https://www.googleapis.com/auth/compute"]
_REQUESTS: dict[str, Any] = {
    "reset": compute_v1.ResetInstanceRequest,
    "stop": compute_v1.StopInstanceRequest,
    "start": compute_v1.StartInstanceRequest,
}


def request_id_for(idempotency_key: str, verb: str) -> str:
    """The GCE request id of one verb of one workflow attempt."""
    return str(uuid.uuid5(_REQUEST_NS, f"{idempotency_key}:{verb}"))


class GCEProvider:
    """:class:`remediation.ports.cluster.MachineProvider` for ``gce://`` VMs."""

    def __init__(self, settings: MachineSettings, *, credentials: Credentials | None = None) -> None:
        self._settings = settings
        self._credentials = credentials
        self._lock = threading.Lock()
        self._clients: tuple[compute_v1.InstancesClient, compute_v1.ZoneOperationsClient] | None = None

    def _get_clients(self) -> tuple[compute_v1.InstancesClient, compute_v1.ZoneOperationsClient]:
        # Built on first use, so an "auto" router on an Azure-only cluster never needs Google creds.
        with self._lock:
            if self._clients is None:
                creds = self._credentials
                if creds is None and self._settings.gce_anonymous:
                    creds = AnonymousCredentials()  # type: ignore[no-untyped-call]
                if creds is None:
                    try:
                        import google.auth

                        creds, _ = google.auth.default(scopes=_SCOPES)
                    except auth_exc.DefaultCredentialsError as exc:
                        raise PermanentError(
                            f"no Google credentials (Application Default Credentials): {exc}"
                        ) from exc
                options = (
                    ClientOptions(api_endpoint=self._settings.gce_endpoint)
                    if self._settings.gce_endpoint
                    else None
                )
                self._clients = (
                    compute_v1.InstancesClient(transport="rest", credentials=creds, client_options=options),
                    compute_v1.ZoneOperationsClient(
                        transport="rest", credentials=creds, client_options=options
                    ),
                )
            return self._clients

    def start(self, vm: VMRef, action: VMAction, idempotency_key: str) -> Operation:
        check_restartable(vm, action, "gce", label="GCE", service="Compute Engine has no reimage")
        verb = "reset" if action == VMAction.RESTART else "stop"
        data: dict[str, Any] = {"phase": verb, "request_id": request_id_for(idempotency_key, verb)}
        if verb == "stop":
            # Derived now, so that poll() can start the VM idempotently without ever seeing the key.
            data["start_request_id"] = request_id_for(idempotency_key, "start")
        name = self._call(vm, verb, data["request_id"])
        log.info("gce %s issued for %s: operation %s", verb, vm.provider_id or vm.name, name)
        return Operation(provider="gce", ref=name, action=action, vm=vm, data=data)

    def poll(self, op: Operation) -> OperationStatus:
        vm = op.vm
        _, operations = self._get_clients()
        try:
            current = operations.get(
                project=vm.account, zone=vm.zone, operation=op.ref,
                retry=None, timeout=self._settings.request_timeout_s,
            )  # fmt: skip
        except Exception as exc:
            raise _translate(exc, vm) from exc
        if current.status != compute_v1.Operation.Status.DONE:
            return OperationStatus(done=False)
        if current.error and current.error.errors:
            details = "; ".join(f"{e.code}: {e.message}" for e in current.error.errors)
            head = (
                f"HTTP {current.http_error_status_code} {current.http_error_message}: "
                if current.http_error_status_code
                else ""
            )
            return OperationStatus(done=True, error=f"GCE {op.data.get('phase', '')} failed: {head}{details}")
        if op.data.get("phase") == "stop":
            start_id = op.data["start_request_id"]
            name = self._call(vm, "start", start_id)
            log.info("gce stop done for %s; start issued: operation %s", vm.provider_id or vm.name, name)
            data = {"phase": "start", "request_id": start_id}
            return OperationStatus(done=False, replace=Operation("gce", name, op.action, vm, data))
        return OperationStatus(done=True)

    def identify(self, vm: VMRef) -> HardwareIdentity:
        """The instance's numeric id, its ``resourceStatus.physicalHost`` (an opaque name of the host it
        runs on, which a stop/start usually changes) and its machine type."""
        instances, _ = self._get_clients()
        try:
            inst = instances.get(project=vm.account, zone=vm.zone, instance=vm.name,
                                 retry=None, timeout=self._settings.request_timeout_s)
        except Exception as exc:
            raise _translate(exc, vm) from exc
        host = inst.resource_status.physical_host if "resource_status" in inst else ""
        sku = inst.machine_type.rsplit("/", 1)[-1] if inst.machine_type else None
        return HardwareIdentity("gce", instance_id=str(inst.id) if inst.id else None, host=host or None, sku=sku)

    def _call(self, vm: VMRef, verb: str, request_id: str) -> str:
        instances, _ = self._get_clients()
        request = _REQUESTS[verb](project=vm.account, zone=vm.zone, instance=vm.name, request_id=request_id)
        try:
            result = getattr(instances, f"{verb}_unary")(
                request=request, retry=None, timeout=self._settings.request_timeout_s
            )
        except Exception as exc:
            raise _translate(exc, vm) from exc
        return str(result.name)


def _translate(exc: Exception, vm: VMRef) -> Exception:
    """Map google-api-core, google-auth and transport errors onto remediation.ports.errors."""
    if isinstance(exc, gexc.GoogleAPICallError):
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None) or {}
        status = exc.code if isinstance(exc.code, int) else None
        return error_for_status(status, exc.message, vm=vm, retry_after=headers.get("Retry-After"))
    if isinstance(exc, requests.exceptions.RequestException | gexc.RetryError):
        return TransientError(f"cannot reach Compute Engine: {exc}")
    if isinstance(exc, auth_exc.TransportError) or (
        isinstance(exc, auth_exc.RefreshError) and getattr(exc, "retryable", False)
    ):
        return TransientError(f"Google token refresh failed: {exc}")
    if isinstance(exc, auth_exc.InvalidOperation):
        # The session refreshes credentials only when Compute Engine answers 401; these cannot refresh.
        return CredentialError(f"Google credentials rejected: Compute Engine answered 401 and {exc}",
                               component="cloud")
    if isinstance(exc, auth_exc.GoogleAuthError):
        # A rejected refresh, no default credentials, or credentials that cannot refresh at all (the
        # session refreshes on a 401; anonymous ones raise InvalidOperation): ours to fix, never the node's.
        return CredentialError(f"Google credentials rejected: {exc}", component="cloud")
    return exc
