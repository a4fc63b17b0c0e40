"""A real Redfish BMC for the redfish backend: sushy-tools' emulator, its fake driver, TLS and a login.

One emulator per module (it starts in about a second), on a port it picks and names in its log,
speaking HTTPS with a serving certificate signed by a CA made for this run, and asking for HTTP basic
authentication against an htpasswd file (bcrypt, as the emulator requires). Its fake driver serves one
system per scenario, all On; a power change lands 1 to 11 s after the request, as on a slow BMC, and
there is no PowerCycle among the offered resets. Its access log (stderr) is the record of every request
the BMC received, which is how the tests count reset POSTs: never from the system's state.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
import requests

from remediation.simulator.kube.tls import write_cluster_pki
from tests.ports import WERKZEUG_LINE, reported_port

USER, PASSWORD = "remediation", "pw-" + uuid.uuid4().hex  # a value no message may ever carry
SYSTEMS = ("restart", "cycle", "killed", "workflow", "login", "dry", "held-1", "held-2", "held-3", "overdue", "foreign")


@dataclass
class Emulator:
    url: str
    ca_file: Path
    log: Path
    systems: dict[str, str]  # scenario -> system id (a uuid)

    def resets(self, scenario: str) -> int:
        """Reset POSTs the BMC received for the scenario's system, from its access log."""
        pattern = re.compile(
            rf"POST /redfish/v1/Systems/{self.systems[scenario]}/Actions/ComputerSystem\.Reset "
        )
        return len(pattern.findall(self.log.read_text(errors="replace")))

    def logged(self, marker: str, timeout: float = 10.0) -> None:
        """Wait until the access log has a line with ``marker``: every request before it is in too."""
        deadline = time.monotonic() + timeout
        while marker not in self.log.read_text(errors="replace"):
            assert time.monotonic() < deadline, f"{marker!r} never reached the emulator's log"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    d = tmp_path_factory.mktemp("bmc")
    pki = write_cluster_pki(d)
    (d / "htpasswd").write_text(f"{USER}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()}\n")
    systems = {name: str(uuid.uuid4()) for name in SYSTEMS}
    fake = [{"uuid": u, "name": name, "power_state": "On", "nics": []} for name, u in systems.items()]
    config = d / "emulator.conf"
    config.write_text(
        "SUSHY_EMULATOR_FAKE_DRIVER = True\n"
        "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n"
        "SUSHY_EMULATOR_LISTEN_PORT = 0\n"  # any free port: werkzeug's start-up line names it
        f"SUSHY_EMULATOR_SSL_CERT = {str(pki.cert_file)!r}\n"
        f"SUSHY_EMULATOR_SSL_KEY = {str(pki.key_file)!r}\n"
        f"SUSHY_EMULATOR_AUTH_FILE = {str(d / 'htpasswd')!r}\n"
        f"SUSHY_EMULATOR_STATE_DIR = {str(d / 'state')!r}\n"
        f"SUSHY_EMULATOR_FAKE_SYSTEMS = {fake!r}\n"
    )
    log = d / "access.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "sushy-emulator"), "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        url = f"https://127.0.0.1:{reported_port(log, WERKZEUG_LINE, proc, timeout=30)}"
        deadline = time.monotonic() + 30
        while True:  # ready once it answers the service root over verified TLS
            try:
                if requests.get(f"{url}/redfish/v1/", verify=str(pki.ca_file), timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the Redfish emulator did not start:\n" + log.read_text()
            time.sleep(0.1)
        yield Emulator(url, pki.ca_file, log, systems)
    finally:
        proc.terminate()
        proc.wait(10)
