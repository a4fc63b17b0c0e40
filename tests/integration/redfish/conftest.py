"""A real Redfish BMC for the redfish backend: sushy-tools' emulator, its fake driver, TLS and a login.

One emulator per module (it starts in about a second), on a port it picks and names in its log,
speaking HTTPS with a serving certificate signed by a CA made for this run, and asking for HTTP basic
authentication against an htpasswd file (bcrypt, as the emulator requires). Its fake driver serves one
system per scenario, all On; a power change lands 1 to 11 s after the request, as on a slow BMC, and
there is no PowerCycle among the offered resets. Its access log (stderr) is the record of every request
the BMC received, which is how the tests count reset POSTs: never from the system's state.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import requests
from sqlalchemy import create_engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from remediation.simulator.kube.tls import write_cluster_pki
from tests.pace import within
from tests.ports import WERKZEUG_LINE, reported_port

USER, PASSWORD = "remediation", "pw-" + uuid.uuid4().hex  # a value no message may ever carry
RACK_TRAYS = ("tray-1", "tray-2")
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

    def posts(self, path: str) -> int:
        """POSTs to ``path`` the BMC received, from its access log."""
        return len(re.findall(rf"POST {re.escape(path)} ", self.log.read_text(errors="replace")))

    def logged(self, marker: str, timeout: float = 10.0) -> None:
        """Wait until the access log has a line with ``marker``: every request before it is in too."""
        deadline = within(timeout)
        while marker not in self.log.read_text(errors="replace"):
            assert time.monotonic() < deadline, f"{marker!r} never reached the emulator's log"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def sessions(pg_module_db: str) -> sessionmaker[Session]:
    """Sessions of this module's database (its step rows hold the intents)."""
    return sessionmaker(create_engine(pg_module_db, poolclass=NullPool), expire_on_commit=False)


@pytest.fixture(autouse=True)
def no_password_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No log line of any test here carries the BMC's password, sushy's and urllib3's included."""
    caplog.set_level(logging.DEBUG)  # sushy and urllib3 log every request at DEBUG
    yield
    assert PASSWORD not in caplog.text


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    systems = {name: str(uuid.uuid4()) for name in SYSTEMS}
    with running_emulator(tmp_path_factory.mktemp("bmc"), systems) as bmc:
        yield bmc


@pytest.fixture(scope="module")
def rack_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """A rack's BMC: its chassis ``Rack_0`` links the rack's trays (the emulator gives every system to
    the chassis whose UUID sorts first); ``Spare`` links none. Neither advertises a Chassis.Reset."""
    trays = {name: str(uuid.uuid4()) for name in RACK_TRAYS}
    chassis = [{"Id": "Rack_0", "Name": "Rack_0", "UUID": "00000000-0000-4000-8000-000000000001"},
               {"Id": "Spare", "Name": "Spare", "UUID": "ffffffff-0000-4000-8000-000000000002"}]
    with running_emulator(tmp_path_factory.mktemp("rack-bmc"), trays, chassis) as bmc:
        yield bmc


@contextmanager
def running_emulator(
    d: Path, systems: dict[str, str], chassis: list[dict[str, str]] | None = None
) -> Iterator[Emulator]:
    """The emulator serving ``systems`` (name -> uuid, all On) and ``chassis`` (its default when None)
    over TLS with a login, until the block ends."""
    pki = write_cluster_pki(d)
    (d / "htpasswd").write_text(f"{USER}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()}\n")
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
        + (f"SUSHY_EMULATOR_CHASSIS = {chassis!r}\n" if chassis else "")
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
        deadline = within(30)
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


class JsonBmc(BaseHTTPRequestHandler):
    """The base of a hand-written BMC: answers JSON, logs nothing."""

    def answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


@contextmanager
def stand_in_bmc(d: Path, handler: type[BaseHTTPRequestHandler], **attrs: Any) -> Iterator[tuple[str, Path, Any]]:
    """A hand-written BMC (``handler``) over HTTPS with a CA made for it in ``d``, on the port it bound,
    with ``attrs`` set on its server, until the block ends: its URL, its CA file and its server."""
    pki = write_cluster_pki(d)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)  # serves on the port it bound
    for name, value in attrs.items():
        setattr(server, name, value)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pki.cert_file, pki.key_file)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", pki.ca_file, server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
