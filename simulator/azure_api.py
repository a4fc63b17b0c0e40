"""A stateful Azure Resource Manager endpoint for Microsoft.Compute VMs and scale-set VMs, over HTTPS.

Serves VM and scale-set VM GET/PATCH, the restart, redeploy, reimage, powerOff and start POSTs (202 with
``Azure-AsyncOperation`` and ``Location``), and the operation GETs, with ARM's error bodies and injected
429/5xx. An action lands when its operation finishes (``op_seconds``) and bumps ``boot_count``
(:meth:`AzureFake.vm`). :func:`make_self_signed_cert` writes its certificate.

Why: docs/wire-protocols.md#the-cloud-and-bmc-fakes
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import itertools
import json
import re
import ssl
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from remediation.simulator.fakehttp import FakeServer, Response

if TYPE_CHECKING:
    from cryptography import x509

_RG = r"^/subscriptions/(?P<sub>[^/]+)/resourcegroups/(?P<rg>[^/]+)/providers/microsoft\.compute"
_VM = re.compile(
    _RG
    + r"/(?:virtualmachinescalesets/(?P<ss>[^/]+)/virtualmachines/(?P<id>[^/]+)|virtualmachines/(?P<vm>[^/]+))"
    r"(?:/(?P<verb>instanceview|restart|redeploy|reimage|poweroff|start))?$"
)
_OPERATION = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/providers/microsoft\.compute/locations/(?P<loc>[^/]+)/operations/(?P<op>[^/]+)$"
)
_BOOTING = {"restart", "redeploy", "reimage", "start"}
_POWER_DURING = {
    "restart": "starting",
    "redeploy": "starting",
    "reimage": "starting",
    "start": "starting",
    "poweroff": "stopping",
}
_POWER_AFTER = {"poweroff": "stopped"}


def make_self_signed_cert(
    directory: Path, hosts: Sequence[str] = (), *, valid_days: int = 1
) -> tuple[Path, Path]:
    """Write ``cert.pem`` and ``key.pem`` for CN/SAN 127.0.0.1 into ``directory``; return their paths.

    ``hosts`` adds subject alternative names (IP addresses or DNS names, e.g. ``localhost`` and the
    docker-compose service name ``simulator``) for clients that reach the fake by another name."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=valid_days))
        .add_extension(x509.SubjectAlternativeName(_alt_names(["127.0.0.1", *hosts])), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def _alt_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    from cryptography import x509

    out: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):  # de-duplicated, in order
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


def _iso(offset_s: float = 0.0) -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=offset_s)).isoformat()


@dataclass
class _Op:
    id: str
    sub: str
    location: str
    verb: str
    key: tuple[str, ...]
    created: float
    duration: float
    fail: tuple[str, str] | None
    done: bool = False
    ended: str = ""
    started: str = ""


class AzureFake(FakeServer):
    """VMs keyed ``(sub, rg, name)`` and scale-set VMs keyed ``(sub, rg, scale_set, instance_id)``."""

    def __init__(
        self,
        cert_file: Path,
        key_file: Path,
        *,
        op_seconds: float = 0.05,
        location: str = "eastus",
        retry_after: int = 0,
    ) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert_file, key_file)
        super().__init__(ssl_context=ctx)
        self.op_seconds = op_seconds
        self.location = location
        self.retry_after = retry_after  # the Retry-After sent with each 202 (ARM sends e.g. 10)
        self._lock = threading.RLock()
        self._vms: dict[tuple[str, ...], dict[str, Any]] = {}
        self._ops: dict[str, _Op] = {}
        self._op_failures: list[tuple[str, str]] = []
        self._etags = itertools.count(1)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    # -------------------------------------------------------------------------------- test controls

    @staticmethod
    def _key(sub: str, rg: str, name: str, *, scale_set: str | None = None) -> tuple[str, ...]:
        parts = (sub, rg, scale_set, name) if scale_set else (sub, rg, name)
        return tuple(p.lower() for p in parts)

    def add_vm(
        self,
        sub: str,
        rg: str,
        name: str,
        *,
        scale_set: str | None = None,
        power: str = "running",
        provisioned_ago_s: float = 86400.0,
    ) -> None:
        """Add a VM whose last provisioning change (creation, say) was ``provisioned_ago_s`` ago."""
        with self._lock:
            self._vms[self._key(sub, rg, name, scale_set=scale_set)] = {
                "name": name,
                "sub": sub,
                "rg": rg,
                "scale_set": scale_set,
                "power": power,
                "provisioning": "succeeded",
                "provisioned_at": _iso(-provisioned_ago_s),
                "boot_count": 1 if power == "running" else 0,
                "vm_id": str(uuid.uuid4()),
                "tags": {},
                "etag": next(self._etags),
            }

    def vm(self, sub: str, rg: str, name: str, *, scale_set: str | None = None) -> dict[str, Any]:
        """A copy of the VM's state, including ``boot_count`` (not part of the real API)."""
        with self._lock:
            self._advance()
            state = self._vms[self._key(sub, rg, name, scale_set=scale_set)]
            return {**state, "tags": dict(state["tags"])}

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
        code: str = "InternalExecutionError",
        message: str = "An internal execution error occurred. Please retry later.",
    ) -> None:
        """The next ``count`` operations started end ``Failed`` with this error and no effect."""
        with self._lock:
            self._op_failures.extend([(code, message)] * count)

    # ------------------------------------------------------------------------------------- protocol

    def dispatch(
        self, method: str, path: str, query: dict[str, str], *, body: bytes, headers: dict[str, str]
    ) -> Response:
        fault = self.faults.take(method, path)
        if fault is not None:
            headers = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
            code = {429: "TooManyRequests", 403: "AuthorizationFailed", 404: "ResourceNotFound"}.get(
                fault.status, "InternalServerError" if fault.status >= 500 else "BadRequest"
            )
            return self._error(fault.status, code, f"injected {fault.status}", headers=headers)
        api_version = {k.lower(): v for k, v in query.items()}.get("api-version")
        if not api_version:
            return self._error(
                400,
                "MissingApiVersionParameter",
                "The api-version query parameter (?api-version=) is required for all requests.",
            )
        lower = path.lower()
        with self._lock:
            self._advance()
            if m := _VM.match(lower):
                name, scale_set = (m["id"], m["ss"]) if m["ss"] else (m["vm"], None)
                key = self._key(m["sub"], m["rg"], name, scale_set=scale_set)
                vm = self._vms.get(key)
                if vm is None:
                    kind = "virtualMachineScaleSets/virtualMachines" if scale_set else "virtualMachines"
                    return self._error(
                        404,
                        "ResourceNotFound",
                        f"The Resource 'Microsoft.Compute/{kind}/{name}' under resource group '{m['rg']}' was not found.",
                    )
                verb = m["verb"]
                if method == "GET" and verb is None:
                    return self._json(200, self._vm_body(vm, api_version), {"ETag": f'"{vm["etag"]}"'})
                if method == "GET" and verb == "instanceview":
                    return self._json(200, self._instance_view(vm))
                if method == "PATCH" and verb is None and scale_set is None:
                    return self._patch(vm, body, headers.get("if-match"), api_version=api_version)
                if method == "POST" and verb not in (None, "instanceview"):
                    return self._begin(vm, key, verb, api_version=api_version)
            elif (m := _OPERATION.match(lower)) and method == "GET":
                op = self._ops.get(m["op"])
                if op is None:
                    return self._error(404, "ResourceNotFound", f"Operation {m['op']} was not found.")
                if query.get("monitor") == "true":  # the Location URL
                    if not op.done:
                        return (
                            202,
                            {
                                "Location": self._op_url(op, api_version, monitor=True),
                                "Retry-After": str(self.retry_after),
                            },
                            b"",
                        )
                    if op.fail:
                        return self._error(400, op.fail[0], op.fail[1])
                    return self._json(200, {})
                return self._json(200, self._op_body(op))
            return self._error(404, "NotFound", f"No route for {method} {path}")

    def _patch(self, vm: dict[str, Any], body: bytes, if_match: str | None, *, api_version: str) -> Response:
        # Tags only: the provider records its idempotency marker this way; a stale If-Match loses.
        if if_match and if_match not in ("*", f'"{vm["etag"]}"'):
            return self._error(412, "PreconditionFailed", "The specified precondition 'If-Match' failed.")
        update = json.loads(body or b"{}")
        if "tags" in update:
            vm["tags"] = dict(update["tags"] or {})
        vm["etag"] = next(self._etags)
        return self._json(200, self._vm_body(vm, api_version), {"ETag": f'"{vm["etag"]}"'})

    def _begin(self, vm: dict[str, Any], key: tuple[str, ...], verb: str, *, api_version: str) -> Response:
        if vm["provisioning"] == "updating":
            return self._error(
                409,
                "OperationNotAllowed",
                "Operation is not allowed since another operation is in progress on this VM.",
            )
        fail = self._op_failures.pop(0) if self._op_failures else None
        op = _Op(
            str(uuid.uuid4()),
            vm["sub"],
            self.location,
            verb,
            key,
            time.monotonic(),
            self.op_seconds,
            fail,
            started=_iso(),
        )
        self._ops[op.id] = op
        vm["provisioning"] = "updating"
        if verb != "start" or vm["power"] != "running":
            vm["power"] = _POWER_DURING[verb]
        self._advance()
        headers = {
            "Azure-AsyncOperation": self._op_url(op, api_version),
            "Location": self._op_url(op, api_version, monitor=True),
            "Retry-After": str(self.retry_after),
        }
        return 202, headers, b""

    def _advance(self) -> None:
        now = time.monotonic()
        for op in self._ops.values():
            if op.done or now < op.created + op.duration:
                continue
            op.done, op.ended = True, _iso()
            vm = self._vms.get(op.key)
            if vm is None:
                continue
            vm["provisioned_at"] = op.ended
            if op.fail is not None:
                vm["provisioning"] = f"failed/{op.fail[0]}"
                vm["power"] = "running" if vm["power"] == "starting" else vm["power"]
                continue
            vm["provisioning"] = "succeeded"
            if op.verb in _BOOTING and vm["power"] != "running":
                vm["boot_count"] += 1
            vm["power"] = _POWER_AFTER.get(op.verb, "running")

    def _op_url(self, op: _Op, api_version: str, *, monitor: bool = False) -> str:
        url = f"{self.url}/subscriptions/{op.sub}/providers/Microsoft.Compute/locations/{op.location}/operations/{op.id}"
        return url + ("?monitor=true&" if monitor else "?") + f"api-version={api_version}"

    @staticmethod
    def _op_body(op: _Op) -> dict[str, Any]:
        body: dict[str, Any] = {"name": op.id, "startTime": op.started, "status": "InProgress"}
        if op.done:
            body["endTime"] = op.ended
            body["status"] = "Failed" if op.fail else "Succeeded"
            if op.fail:
                body["error"] = {"code": op.fail[0], "message": op.fail[1]}
        return body

    def _vm_body(self, vm: dict[str, Any], api_version: str) -> dict[str, Any]:
        sub, rg = vm["sub"], vm["rg"]
        if vm["scale_set"]:
            rid = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets/{vm['scale_set']}/virtualMachines/{vm['name']}"
            kind, name = (
                "Microsoft.Compute/virtualMachineScaleSets/virtualMachines",
                f"{vm['scale_set']}_{vm['name']}",
            )
        else:
            rid = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{vm['name']}"
            kind, name = "Microsoft.Compute/virtualMachines", vm["name"]
        state = (
            "Updating" if vm["provisioning"] == "updating" else vm["provisioning"].split("/")[0].capitalize()
        )
        body: dict[str, Any] = {
            "id": rid,
            "name": name,
            "type": kind,
            "location": self.location,
            "tags": vm["tags"],
            "etag": f'"{vm["etag"]}"',
            "properties": {
                "vmId": vm["vm_id"],
                "provisioningState": state,
                "hardwareProfile": {"vmSize": "Standard_ND96asr_v4"},
            },
        }
        if vm["scale_set"]:
            body["instanceId"] = vm["name"]
        return body

    @staticmethod
    def _instance_view(vm: dict[str, Any]) -> dict[str, Any]:
        prov = vm["provisioning"]
        prov_status: dict[str, Any] = {
            "code": f"ProvisioningState/{prov}",
            "level": "Info" if not prov.startswith("failed") else "Error",
            "displayStatus": "Updating" if prov == "updating" else f"Provisioning {prov.split('/')[0]}",
        }
        if prov != "updating":
            prov_status["time"] = vm["provisioned_at"]
        power = {"code": f"PowerState/{vm['power']}", "level": "Info", "displayStatus": f"VM {vm['power']}"}
        return {"computerName": vm["name"], "osName": "ubuntu", "statuses": [prov_status, power]}

    @staticmethod
    def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
        return (
            status,
            {"Content-Type": "application/json; charset=utf-8", **(headers or {})},
            json.dumps(body).encode(),
        )

    def _error(self, status: int, code: str, message: str, *, headers: dict[str,
        str] | None = None) -> Response:
        return self._json(status, {"error": {"code": code, "message": message}}, headers)
