"""The rack power against a real Redfish BMC (sushy-tools' emulator, HTTPS and basic auth), with its
record on the step rows of a real Postgres.

The emulator's chassis advertises no ``#Chassis.Reset``, so what is shown is the fallback: each tray the
chassis links is power-cycled through the reset its own system advertises (ForceOff, then On once it
is seen Off, since it offers no PowerCycle), each POST counted once in the BMC's own access log and
none on a repeat with the same key; the power states seen; and the errors, with nothing sent: a
domain the inventory does not list, an inventory that is no JSON, a chassis the BMC does not have, one
that links no system, a wrong password. The dry-run twin reads the chassis and sends nothing.

A rack BMC that does advertise ``#Chassis.Reset`` (its ResetType values in an ActionInfo, as OpenBMC
lists them) is a small HTTPS stand-in: one PowerCycle POST to the advertised target, a refusal (HTTP
400) and an answer that is no JSON are errors, and nothing is recorded for them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.noop import Recorder
from remediation.adapters.redfish.inventory import Inventory
from remediation.adapters.redfish.noop import NoopRackPower
from remediation.adapters.redfish.rack import RedfishRackPower
from remediation.db.intents import StepIntents
from remediation.ports.errors import ConfigError, CredentialError, NotFound, PermanentError, TransientError
from remediation.ports.rack import RackPhase, RackReset, ResetVia
from remediation.settings import RedfishSettings
from tests.integration.redfish.conftest import PASSWORD, RACK_TRAYS, USER, Emulator, JsonBmc, stand_in_bmc
from tests.integration.redfish.test_redfish_bmc import step_key, stored
from tests.integration.workerproc import wait_for

RESET = "/Actions/ComputerSystem.Reset"


def configure(tmp: Path, bmc: Emulator, *, password: str = PASSWORD) -> RedfishSettings:
    racks = {"b1": {"bmc": bmc.url, "chassis": "Rack_0", "credentials": "rack"},
             "cluster-abc.1": {"bmc": bmc.url, "chassis": "Spare", "credentials": "rack"},
             "b9": {"bmc": bmc.url, "chassis": "Rack_9", "credentials": "rack"}}
    (tmp / "inventory.yaml").write_text(yaml.safe_dump({"chassis": racks}))
    (tmp / "credentials.json").write_text(json.dumps({"rack": {"username": USER, "password": password}}))
    return RedfishSettings(inventory_file=str(tmp / "inventory.yaml"),
                           credentials_file=str(tmp / "credentials.json"), ca_file=str(bmc.ca_file),
                           connect_timeout_s=2, request_timeout_s=10, unobserved_after_s=120)


def tray_posts(bmc: Emulator) -> list[int]:
    return [bmc.posts(f"/redfish/v1/Systems/{bmc.systems[tray]}{RESET}") for tray in RACK_TRAYS]


def settled(bmc: Emulator, power: RedfishRackPower) -> None:
    """A barrier: one more read of the chassis, seen in the BMC's log, so every request before it is."""
    before = bmc.log.read_text().count("GET /redfish/v1/Chassis/")
    power.state("b1")
    wait_for(lambda: bmc.log.read_text().count("GET /redfish/v1/Chassis/") > before, 10, "the barrier in the log")


def test_a_rack_without_a_chassis_reset_power_cycles_each_tray_once(
    rack_emulator: Emulator, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    power = RedfishRackPower(settings := configure(tmp_path, rack_emulator), Inventory(settings),
                             StepIntents(sessions))
    key = step_key(sessions, "gpu-rack-b1")
    record = power.reset("b1", key)
    assert record.via == ResetVia.SYSTEMS and record.phase == RackPhase.SENT
    assert sorted((t.target, t.reset, t.then, t.before) for t in record.targets) == sorted(
        (f"/redfish/v1/Systems/{rack_emulator.systems[tray]}{RESET}", "ForceOff", "On", "On") for tray in RACK_TRAYS)
    assert stored(sessions, key) == record.to_dict()  # the step row holds it: a resumed step polls it
    assert power.reset("b1", key) == record  # the same key: recorded, sent nothing
    settled(rack_emulator, power)
    assert tray_posts(rack_emulator) == [1, 1]

    def cycled() -> RackReset | None:
        nonlocal record
        record = power.poll(RackReset.from_dict(record.to_dict()))  # each poll from the stored shape
        return record if record.done else None

    wait_for(cycled, 60, "every tray seen Off, then On again")
    assert record.evidence == "left On, then On again" and record.error is None
    assert all([s for s, _ in t.seen][-2:] == ["Off", "On"] for t in record.targets)
    settled(rack_emulator, power)
    assert tray_posts(rack_emulator) == [2, 2]  # each tray's ForceOff, and its On once it was seen Off
    state = power.state("b1")
    assert set(state.systems.values()) == {"On"} and len(state.systems) == len(RACK_TRAYS)
    assert PASSWORD not in json.dumps(record.to_dict())


@pytest.mark.parametrize(
    ("domain", "error", "message"),
    [
        ("b2", NotFound, "no chassis known for domain b2"),
        # sushy-tools answers 500 for a chassis it does not have (a real BMC, 404): a BMC's error either way
        ("b9", TransientError, "cannot read /redfish/v1/Chassis/Rack_9 on BMC .*: HTTP 500"),
        ("cluster-abc.1", PermanentError, "offers no #Chassis.Reset and links no ComputerSystems"),
    ],
    ids=["not-in-the-inventory", "no-such-chassis", "links-no-system"],
)
def test_a_domain_it_cannot_power_cycle_is_an_error_and_nothing_is_sent(
    rack_emulator: Emulator, sessions: sessionmaker[Session], tmp_path: Path, domain: str,
    error: type[Exception], message: str
) -> None:
    settings, intents = configure(tmp_path, rack_emulator), StepIntents(sessions)
    key = step_key(sessions, f"gpu-rack-{domain}")
    before = tray_posts(rack_emulator)
    with pytest.raises(error, match=message):
        RedfishRackPower(settings, Inventory(settings), intents).reset(domain, key)
    assert stored(sessions, key) is None and tray_posts(rack_emulator) == before


def test_an_inventory_that_is_no_json_and_a_wrong_password_are_configuration_errors(
    rack_emulator: Emulator, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    settings = configure(tmp_path, rack_emulator, password="wrong-" + PASSWORD)
    key, before = step_key(sessions, "gpu-rack-login"), tray_posts(rack_emulator)
    with pytest.raises(CredentialError, match="HTTP 401") as err:
        RedfishRackPower(settings, Inventory(settings), StepIntents(sessions)).reset("b1", key)
    assert PASSWORD not in str(err.value)
    (tmp_path / "inventory.yaml").write_text('{"chassis": {"b1": ')
    with pytest.raises(ConfigError, match="is not valid YAML or JSON"):
        RedfishRackPower(settings, Inventory(settings), StepIntents(sessions)).reset("b1", key)
    assert stored(sessions, key) is None and tray_posts(rack_emulator) == before


def test_the_dry_run_twin_reads_the_rack_and_sends_nothing(
    rack_emulator: Emulator, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    settings, recorder = configure(tmp_path, rack_emulator), Recorder()
    real = RedfishRackPower(settings, Inventory(settings), StepIntents(sessions))
    before = tray_posts(rack_emulator)
    record = NoopRackPower(real, recorder).reset("b1", "dry-run-key")
    assert record.recorded_only and record.via == ResetVia.SYSTEMS
    (action,) = recorder.actions
    assert action["would"].startswith("power-cycle chassis /redfish/v1/Chassis/Rack_0")
    assert len(action["resets"]) == len(RACK_TRAYS)
    settled(rack_emulator, real)
    assert tray_posts(rack_emulator) == before


# ------------------------------------------------------------- a rack BMC with a Chassis.Reset

RACK = "/redfish/v1/Chassis/GB200_Rack"
REFUSING = "/redfish/v1/Chassis/Refusing"


class RackBmc(JsonBmc):
    """A rack BMC whose chassis advertise ``#Chassis.Reset``; ``server.posts`` records each POST."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.rstrip("/")
        docs = {
            "/redfish/v1": {"@odata.id": "/redfish/v1/", "Id": "RootService", "RedfishVersion": "1.17.0"},
            f"{RACK}/ResetActionInfo": {"@odata.id": f"{RACK}/ResetActionInfo", "Parameters": [
                {"Name": "ResetType", "Required": True, "DataType": "String", "AllowableValues": ["PowerCycle"]}]},
            **{chassis: {"@odata.id": chassis, "ChassisType": "Rack", "PowerState": "On", "Actions": {
                "#Chassis.Reset": {"target": f"{chassis}/Actions/Chassis.Reset",
                                   "@Redfish.ActionInfo": f"{chassis}/ResetActionInfo"}}} for chassis in (RACK, REFUSING)},
        }
        docs[f"{REFUSING}/ResetActionInfo"] = docs[f"{RACK}/ResetActionInfo"]
        body = json.dumps(docs[path]).encode() if path in docs else b'{"PowerState": "On", '
        self.answer(200, body)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        self.server.posts.append((self.path, json.loads(self.rfile.read(length)),  # type: ignore[attr-defined]
                                  bool(self.headers.get("Authorization"))))
        if self.path.startswith(REFUSING):
            self.answer(400, json.dumps({"error": {"code": "Base.1.0.ActionNotSupported",
                                                    "message": "The chassis is in maintenance"}}).encode())
        else:
            self.answer(204, b"")


@pytest.fixture
def rack_bmc(tmp_path: Path) -> Iterator[tuple[ThreadingHTTPServer, RedfishSettings]]:
    with stand_in_bmc(tmp_path, RackBmc, posts=[]) as (url, ca_file, server):
        racks = {"b1": {"bmc": url, "chassis": "GB200_Rack"}, "b2": {"bmc": url, "chassis": "Refusing"},
                 "b3": {"bmc": url, "chassis": "Garbled"}}
        (tmp_path / "inventory.yaml").write_text(yaml.safe_dump({"chassis": racks}))
        (tmp_path / "credentials.json").write_text(json.dumps({"default": {"username": USER, "password": PASSWORD}}))
        yield server, RedfishSettings(inventory_file=str(tmp_path / "inventory.yaml"), ca_file=str(ca_file),
                                      credentials_file=str(tmp_path / "credentials.json"), connect_timeout_s=2)


def test_a_chassis_that_advertises_its_reset_gets_one_power_cycle_at_its_target(
    rack_bmc: tuple[ThreadingHTTPServer, RedfishSettings], sessions: sessionmaker[Session]
) -> None:
    server, settings = rack_bmc
    power = RedfishRackPower(settings, Inventory(settings), StepIntents(sessions))
    key = step_key(sessions, "gpu-gb200-b1")
    record = power.reset("b1", key)
    assert (record.via, record.phase) == (ResetVia.CHASSIS, RackPhase.SENT)
    assert [(t.resource, t.target, t.reset) for t in record.targets] == [
        (RACK, f"{RACK}/Actions/Chassis.Reset", "PowerCycle")]
    assert power.reset("b1", key) == record and stored(sessions, key) == record.to_dict()
    assert server.posts == [(f"{RACK}/Actions/Chassis.Reset", {"ResetType": "PowerCycle"}, True)]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("domain", "message"),
    [("b2", "HTTP 400 Base.1.0.ActionNotSupported: The chassis is in maintenance"),
     ("b3", "/redfish/v1/Chassis/Garbled answered no JSON")],
    ids=["refused", "no-json"],
)
def test_a_refused_reset_and_a_chassis_that_is_no_json_are_errors_never_recorded(
    rack_bmc: tuple[ThreadingHTTPServer, RedfishSettings], sessions: sessionmaker[Session], domain: str,
    message: str
) -> None:
    server, settings = rack_bmc
    key = step_key(sessions, f"gpu-gb200-{domain}")
    with pytest.raises(PermanentError, match=message):
        RedfishRackPower(settings, Inventory(settings), StepIntents(sessions)).reset(domain, key)
    assert stored(sessions, key) is None
    assert len(server.posts) == (1 if domain == "b2" else 0)  # type: ignore[attr-defined]
