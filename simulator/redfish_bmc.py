"""A bare-metal pool's BMC: the few Redfish resources sushy reads and the one action it posts.

:class:`RedfishBmc` serves the service root, Systems and ``ComputerSystem.Reset``, over HTTPS with basic
auth. A reset takes the system Off and On ``op_seconds`` later; ``ForceOff`` waits for ``On``. The cluster
reads :meth:`RedfishBmc.vm_state`; :meth:`RedfishBmc.resets` counts resets.

Why: docs/wire-protocols.md#the-cloud-and-bmc-fakes
"""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from remediation.simulator.fakehttp import FakeServer, Response
from remediation.simulator.kube.tls import write_pki

ROOT = "/redfish/v1"
SYSTEMS = f"{ROOT}/Systems"
RESET = "Actions/ComputerSystem.Reset"
RESET_TYPES = ("On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "PowerCycle")
_OFF = {"ForceOff", "GracefulShutdown"}


@dataclass
class _System:
    power: str = "On"
    boot_count: int = 1
    on_at: float | None = None  # when a requested power-on lands (a new boot)


class RedfishBmc(FakeServer):
    """One BMC on 127.0.0.1 (HTTPS), its systems added with :meth:`add_system`."""

    advertise = "127.0.0.1"  # the host name in the URL handed out

    def __init__(self, tls_dir: Path, *, op_seconds: float = 1.0, hosts: tuple[str, ...] = ()) -> None:
        pki = write_pki(tls_dir, ("sim-bmc-ca", "bmc-ca"), "bmc", hosts=hosts)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki.cert_file, pki.key_file)
        super().__init__(context)
        self.ca_file = pki.ca_file
        self.username, self.password = "remediation", secrets.token_hex(12)
        self.op_seconds = op_seconds
        self._lock = threading.Lock()
        self._systems: dict[str, _System] = {}

    @property
    def url(self) -> str:
        return f"https://{self.advertise}:{self.port}"

    def add_system(self, system_id: str) -> None:
        with self._lock:
            self._systems[system_id] = _System()

    def power(self, system_id: str) -> str:
        with self._lock:
            return self._advance(system_id).power

    def vm_state(self, key: tuple[str, ...]) -> tuple[int, bool]:
        """(boot count, busy) of system ``key[0]``, as the cluster reads the clouds' VMs: busy while Off."""
        with self._lock:
            system = self._advance(key[0])
            return system.boot_count, system.power != "On"

    def resets(self, system_id: str, reset_type: str | None = None) -> int:
        """Resets the BMC accepted for the system (of ``reset_type``, or of any type), from its log."""
        path = f"{SYSTEMS}/{system_id}/{RESET}"
        return sum(
            1
            for r in self.log.items
            if r.method == "POST" and r.path == path and r.status == 204
            and (reset_type is None or r.query.get("ResetType") == reset_type)
        )  # fmt: skip

    def settings_overrides(self, directory: Path, systems: list[str]) -> dict[str, str]:
        """Write the redfish inventory (each system is the Kubernetes Node of the same name) and the
        login into ``directory``; the ``REMEDIATION_REDFISH__*`` settings that point the service at them.
        A reset here is Off for ``op_seconds``, not a real server's minutes: a poll that came too late to
        see it Off waits fifteen of them, not the shipped five minutes, before it takes the reset as
        done unobserved (the verify step's new boot is then the proof)."""
        inventory, logins = directory / "redfish-inventory.json", directory / "redfish-logins.json"
        inventory.write_text(json.dumps({name: {"bmc": self.url, "system": name} for name in systems}))
        logins.touch(mode=0o600)
        logins.write_text(json.dumps({"default": {"username": self.username, "password": self.password}}))
        return {
            "REMEDIATION_REDFISH__INVENTORY_FILE": str(inventory),
            "REMEDIATION_REDFISH__CREDENTIALS_FILE": str(logins),
            "REMEDIATION_REDFISH__CA_FILE": str(self.ca_file),
            "REMEDIATION_REDFISH__UNOBSERVED_AFTER_S": str(15 * self.op_seconds),
        }

    def boot_due(self, system_id: str) -> bool:
        """A power-on is scheduled (a restart or an On): without one, an Off system stays Off."""
        with self._lock:
            return self._advance(system_id).on_at is not None

    def _advance(self, system_id: str) -> _System:
        system = self._systems[system_id]
        if system.on_at is not None and time.monotonic() >= system.on_at:
            system.power, system.on_at = "On", None
            system.boot_count += 1
        return system

    # ------------------------------------------------------------------------------- protocol

    def dispatch(
        self, method: str, path: str, query: dict[str, str], *, body: bytes, headers: dict[str, str]
    ) -> Response:
        path = path.rstrip("/") or "/"
        if method == "GET" and path == ROOT:
            return _json(200, self._root())
        if headers.get("authorization") != self._basic():
            return (
                401,
                {"WWW-Authenticate": 'Basic realm="BMC"', "Content-Type": "application/json"},
                (json.dumps(_error("Base.1.8.NoValidSession", "authentication required")).encode()),
            )
        if fault := self.faults.take(method, path):
            return _json(fault.status, _error("Base.1.8.GeneralError", "injected fault"))
        with self._lock:
            if method == "GET" and path == SYSTEMS:
                return _json(200, self._collection())
            system_id = path.removeprefix(f"{SYSTEMS}/").removesuffix(f"/{RESET}")
            if system_id not in self._systems or "/" in system_id:
                return _json(404, _error("Base.1.8.ResourceMissingAtURI", f"{path} not found"))
            if method == "GET" and path == f"{SYSTEMS}/{system_id}":
                return _json(200, self._system(system_id))
            if method == "POST" and path.endswith(RESET):
                reset = str(json.loads(body or b"{}").get("ResetType"))
                if reset not in RESET_TYPES:
                    return _json(400, _error("Base.1.8.ActionParameterNotSupported", f"{reset} not offered"))
                query["ResetType"] = reset  # the request log keeps the type (see resets())
                self._reset(self._advance(system_id), reset)
                return 204, {}, b""
        return _json(405, _error("Base.1.8.OperationNotAllowed", f"{method} {path}"))

    def _reset(self, system: _System, reset: str) -> None:
        if reset in _OFF:
            system.power, system.on_at = "Off", None
        elif reset == "On":
            if system.power == "Off" and system.on_at is None:
                system.on_at = time.monotonic() + self.op_seconds
        else:  # a restart or a power cycle: Off now, a new boot op_seconds later
            system.power, system.on_at = "Off", time.monotonic() + self.op_seconds

    def _basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()

    def _root(self) -> dict[str, object]:
        return {
            "@odata.id": f"{ROOT}/",
            "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
            "Id": "RootService",
            "Name": "Simulated BMC",
            "RedfishVersion": "1.6.0",
            "Systems": {"@odata.id": SYSTEMS},
        }

    def _collection(self) -> dict[str, object]:
        return {
            "@odata.id": SYSTEMS,
            "@odata.type": "#ComputerSystemCollection.ComputerSystemCollection",
            "Name": "Computer System Collection",
            "Members@odata.count": len(self._systems),
            "Members": [{"@odata.id": f"{SYSTEMS}/{sid}"} for sid in self._systems],
        }

    def _system(self, system_id: str) -> dict[str, object]:
        system = self._advance(system_id)
        return {
            "@odata.id": f"{SYSTEMS}/{system_id}",
            "@odata.type": "#ComputerSystem.v1_10_0.ComputerSystem",
            "Id": system_id,
            "Name": system_id,
            "SystemType": "Physical",
            "Model": "HGX H100 8-GPU",
            "SerialNumber": f"SN-{system_id.upper()}",
            "UUID": str(uuid.uuid5(uuid.NAMESPACE_URL, f"redfish-sim/{system_id}")),
            "PowerState": system.power,
            "Status": {"State": "Enabled", "Health": "OK"},
            "Actions": {
                "#ComputerSystem.Reset": {
                    "target": f"{SYSTEMS}/{system_id}/{RESET}",
                    "ResetType@Redfish.AllowableValues": list(RESET_TYPES),
                }
            },
        }


def _json(status: int, body: dict[str, object]) -> Response:
    return status, {"Content-Type": "application/json"}, json.dumps(body).encode()


def _error(code: str, message: str) -> dict[str, object]:
    return {"error": {"code": code, "message": message}}
