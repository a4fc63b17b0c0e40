"""The demo's simulated BMC speaks enough Redfish for the real backend's client (sushy, over verified
HTTPS with basic authentication), and its power follows a reset the way a machine's does."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from remediation.adapters.redfish.client import BmcSession
from remediation.adapters.redfish.inventory import Bmc, Login
from remediation.ports.errors import ConfigError, CredentialError
from remediation.settings.redfish import RedfishSettings
from remediation.simulator.redfish_bmc import RedfishBmc
from tests.pace import within

SYSTEM = "bm-hgx-1"


@pytest.fixture
def bmc(tmp_path: Path) -> Iterator[RedfishBmc]:
    with RedfishBmc(tmp_path, op_seconds=0.2) as server:
        server.add_system(SYSTEM)
        yield server


def session(bmc: RedfishBmc, *, password: str | None = None, trusted: bool = True) -> BmcSession:
    settings = RedfishSettings(ca_file=str(bmc.ca_file) if trusted else None, connect_timeout_s=2)
    login = Login(bmc.username, password or bmc.password)
    return BmcSession(Bmc(bmc.url, f"/redfish/v1/Systems/{SYSTEM}", "default"), login, settings)


def booted(bmc: RedfishBmc, timeout: float = 10) -> None:
    """Wait for the system's second boot: On again, op_seconds after the request."""
    deadline = within(timeout)
    while bmc.vm_state((SYSTEM,)) != (2, False):
        assert time.monotonic() < deadline, bmc.vm_state((SYSTEM,))
        time.sleep(0.02)


def test_a_reset_through_sushy_powers_the_system_off_then_boots_it(bmc: RedfishBmc) -> None:
    with session(bmc) as s:
        assert s.system()["PowerState"] == "On"
        assert {"GracefulRestart", "PowerCycle", "ForceOff", "On"} <= s.allowed_resets()
        s.reset("PowerCycle")
    assert bmc.vm_state((SYSTEM,)) == (1, True)  # Off at once: the cluster takes the node down
    booted(bmc)  # On again after op_seconds: a new boot
    assert bmc.resets(SYSTEM) == 1 and bmc.resets(SYSTEM, "PowerCycle") == 1


def test_force_off_stays_off_until_on(bmc: RedfishBmc) -> None:
    with session(bmc) as s:
        s.reset("ForceOff")
    assert bmc.power(SYSTEM) == "Off" and not bmc.boot_due(SYSTEM)  # nothing will turn it On by itself
    with session(bmc) as s:
        s.reset("On")
    assert bmc.boot_due(SYSTEM)
    booted(bmc)


def test_a_wrong_password_is_refused_and_nothing_is_reset(bmc: RedfishBmc) -> None:
    with session(bmc, password="wrong") as s, pytest.raises(CredentialError):
        s.reset("PowerCycle")
    assert bmc.resets(SYSTEM) == 0 and bmc.power(SYSTEM) == "On"


def test_its_certificate_verifies_only_against_the_run_s_ca(bmc: RedfishBmc) -> None:
    with session(bmc, trusted=False) as s, pytest.raises(ConfigError, match="does not verify"):
        s.system()
