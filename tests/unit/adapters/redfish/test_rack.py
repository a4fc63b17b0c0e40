"""The rack power without a BMC: the ``chassis`` inventory entries, which resets a power cycle sends
from recorded Chassis and ComputerSystem JSON, the record written before any POST and never sent twice,
the errors, the evidence rules of ``poll``, the dry-run twin and the factory. The BMC itself is in
tests/integration/redfish/test_redfish_rack.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from remediation.adapters.factory import rack_power_backend
from remediation.adapters.memintents import MemoryIntents
from remediation.adapters.noop import Recorder
from remediation.adapters.redfish.client import MaybeSent, on_this_bmc
from remediation.adapters.redfish.inventory import Chassis, Inventory
from remediation.adapters.redfish.noop import NoopRackPower
from remediation.adapters.redfish.rack import RedfishRackPower, judge
from remediation.ports.errors import (
    ConfigError,
    CredentialError,
    NotFound,
    NotSupported,
    PermanentError,
    RemediationError,
    TransientError,
)
from remediation.ports.rack import RackPhase, RackPower, RackReset, ResetTarget, ResetVia
from remediation.settings import RedfishSettings, Settings

SECRET = "pw-never-shown-41c2"
BMC = "https://rack-bmc.example:8443"
RACK = "/redfish/v1/Chassis/Rack_0"
TRAYS = [f"/redfish/v1/Systems/Tray_{i}" for i in (1, 2)]

# ----------------------------------------------------------------------- recorded Redfish JSON
# Shapes as rack BMCs answer them: OpenBMC lists a chassis's ResetType values in an ActionInfo
# resource; others inline; sushy-tools' emulator advertises no Chassis action at all.


def chassis(actions: dict[str, Any] | None = None, power: str = "On", systems: list[str] = TRAYS) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "@odata.id": RACK,
        "@odata.type": "#Chassis.v1_23_0.Chassis",
        "Id": "Rack_0",
        "ChassisType": "Rack",
        "PowerState": power,
        "Links": {"ComputerSystems": [{"@odata.id": s} for s in systems]},
    }
    if actions is not None:
        doc["Actions"] = actions
    return doc


def system(path: str, power: str = "On", offered: list[str] | None = None) -> dict[str, Any]:
    act: dict[str, Any] = {"target": f"{path}/Actions/ComputerSystem.Reset"}
    if offered is not None:
        act["ResetType@Redfish.AllowableValues"] = offered
    return {"@odata.id": path, "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem", "PowerState": power,
            "Actions": {"#ComputerSystem.Reset": act}}


RESET_TARGET = f"{RACK}/Actions/Chassis.Reset"
ACTION_INFO = {
    "@odata.id": f"{RACK}/ResetActionInfo",
    "@odata.type": "#ActionInfo.v1_1_2.ActionInfo",
    "Parameters": [{"Name": "ResetType", "Required": True, "DataType": "String",
                    "AllowableValues": ["PowerCycle"]}],
}
SUSHY_TOOLS = ["On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn"]


@dataclass
class FakeBmc:
    """Stands in for a BmcSession: answers reads from ``docs`` (a path -> JSON; a list pops the next),
    records each POST; ``refuse`` maps a target to the error its POST raises."""

    docs: dict[str, Any]
    posts: list[tuple[str, str]] = field(default_factory=list)
    refuse: dict[str, Exception] = field(default_factory=dict)
    before_post: Any = None
    where: str = f"BMC {BMC} chassis {RACK}"

    def __enter__(self) -> FakeBmc:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read(self, link: str) -> dict[str, Any]:
        doc = self.docs[link]
        if isinstance(doc, list):
            return doc.pop(0) if len(doc) > 1 else doc[0]
        return dict(doc)

    def action_target(self, resource: dict[str, Any], action: str) -> str:
        target = resource["Actions"][action]["target"]
        if on_this_bmc(target, BMC) is None:
            raise PermanentError(f"{self.where}: the {action} target is not a path on the BMC; refused")
        return str(target)

    def post_reset(self, target: str, reset_type: str) -> str:
        if self.before_post is not None:
            self.before_post(target)
        if target in self.refuse:
            raise self.refuse[target]
        self.posts.append((target, reset_type))
        return target


def inventory_file(tmp: Path, racks: Any) -> RedfishSettings:
    (tmp / "inventory.json").write_text(json.dumps({
        "chassis": racks, "gpu-001": {"bmc": "https://tray-1", "system": "1", "credentials": "rack"}}))
    (tmp / "credentials.json").write_text(json.dumps({"rack": {"username": "op", "password": SECRET}}))
    return RedfishSettings(inventory_file=str(tmp / "inventory.json"),
                           credentials_file=str(tmp / "credentials.json"), unobserved_after_s=60)


def rack_power(tmp: Path, bmc: FakeBmc, intents: MemoryIntents | None = None, *,
               clock: list[float] | None = None) -> RedfishRackPower:
    settings = inventory_file(tmp, {"b1": {"bmc": BMC, "chassis": "Rack_0", "credentials": "rack"}})
    now = clock if clock is not None else [1000.0]
    power = RedfishRackPower(settings, Inventory(settings), intents or MemoryIntents(), clock=lambda: now[0])
    power.session = lambda _rack: bmc  # type: ignore[assignment, method-assign, return-value]
    return power


# ----------------------------------------------------------------------------------- inventory


def test_a_domain_maps_to_its_rack_s_bmc_and_chassis_and_is_no_node(tmp_path: Path) -> None:
    settings = inventory_file(tmp_path, {"b1": {"bmc": BMC + "/", "chassis": "Rack_0", "credentials": "rack"},
                                         "cluster-abc.0": {"bmc": BMC, "chassis": "/redfish/v1/Chassis/R2"}})
    inventory = Inventory(settings)
    assert inventory.chassis_for("b1") == Chassis(BMC, RACK, "rack")
    assert inventory.chassis_for("cluster-abc.0") == Chassis(BMC, "/redfish/v1/Chassis/R2", "default")
    assert inventory.login(inventory.chassis_for("b1")).password == SECRET
    assert not inventory.lists("chassis") and inventory.lists("gpu-001")
    with pytest.raises(NotFound, match="no BMC known for chassis"):
        inventory.bmc("chassis")


def test_a_domain_the_inventory_does_not_list_is_not_found(tmp_path: Path) -> None:
    inventory = Inventory(inventory_file(tmp_path, {"b1": {"bmc": BMC, "chassis": "Rack_0"}}))
    with pytest.raises(NotFound, match="no chassis known for domain b2: not under chassis"):
        inventory.chassis_for("b2")


@pytest.mark.parametrize(
    ("racks", "message"),
    [
        ({"b1": "Rack_0"}, "chassis entry for domain b1 is not a mapping of bmc, chassis, credentials"),
        ({"b1": {"bmc": "http://bmc", "chassis": "R"}}, "bmc must be an https:// URL, not 'http://bmc'"),
        ({"b1": {"bmc": f"https://op:{SECRET}@bmc", "chassis": "R"}}, "bmc must be an https:// URL$|scheme, host"),
        ({"b1": {"bmc": BMC, "chassis": "../Systems/1"}}, "chassis must name the rack's Redfish chassis"),
        ({"b1": {"bmc": BMC}}, "chassis must name the rack's Redfish chassis"),
        ({"b1": {"bmc": BMC, "chassis": "R", "password": SECRET}}, r"bmc, chassis and credentials only, not \['password'\]"),
        (["b1"], "chassis is not a mapping of domain to chassis"),
    ],
    ids=["not-a-mapping", "plain-http", "password-in-url", "path-escape", "no-chassis", "secret-key", "a-list"],
)
def test_a_wrong_chassis_entry_is_the_domain_s_error_and_shows_no_secret(
    tmp_path: Path, racks: Any, message: str
) -> None:
    with pytest.raises(PermanentError, match=message) as err:
        Inventory(inventory_file(tmp_path, racks)).chassis_for("b1")
    assert SECRET not in str(err.value)


# ------------------------------------------------------------------------ which reset is sent


@pytest.mark.parametrize(
    ("docs", "via", "sent"),
    [
        ({RACK: chassis({"#Chassis.Reset": {"target": RESET_TARGET, "@Redfish.ActionInfo": f"{RACK}/ResetActionInfo"}}),
          f"{RACK}/ResetActionInfo": ACTION_INFO},
         ResetVia.CHASSIS, [(RESET_TARGET, "PowerCycle", None)]),
        ({RACK: chassis({"#Chassis.Reset": {"target": RESET_TARGET, "@Redfish.ActionInfo": f"{RACK}/ResetActionInfo"}}),
          f"{RACK}/ResetActionInfo": {**ACTION_INFO, "Parameters": [
              {"Name": "ResetType", "AllowableValues": ["ForceOff", "On"]}]}},
         ResetVia.CHASSIS, [(RESET_TARGET, "ForceOff", "On")]),
        ({RACK: chassis({"#Chassis.Reset": {"target": RESET_TARGET,
                                             "ResetType@Redfish.AllowableValues": ["On", "ForceOff"]}})},
         ResetVia.CHASSIS, [(RESET_TARGET, "ForceOff", "On")]),
        ({RACK: chassis({"#Chassis.Reset": {"target": RESET_TARGET,
                                             "ResetType@Redfish.AllowableValues": ["ForceRestart"]}})},
         ResetVia.CHASSIS, [(RESET_TARGET, "ForceRestart", None)]),
        ({RACK: chassis({"#Chassis.Reset": {"target": RESET_TARGET}})},
         ResetVia.CHASSIS, [(RESET_TARGET, "PowerCycle", None)]),
        ({RACK: chassis({"#Chassis.Reset": {"target": RESET_TARGET,
                                             "ResetType@Redfish.AllowableValues": ["On", "ForceOff"]}}, power="Off")},
         ResetVia.CHASSIS, [(RESET_TARGET, "On", None)]),
        ({RACK: chassis(), **{s: system(s, offered=SUSHY_TOOLS) for s in TRAYS}},
         ResetVia.SYSTEMS, [(f"{s}/Actions/ComputerSystem.Reset", "ForceOff", "On") for s in TRAYS]),
        ({RACK: chassis({}), TRAYS[0]: system(TRAYS[0], offered=["PowerCycle", "On"]),
          TRAYS[1]: system(TRAYS[1], power="Off", offered=SUSHY_TOOLS)},
         ResetVia.SYSTEMS, [(f"{TRAYS[0]}/Actions/ComputerSystem.Reset", "PowerCycle", None),
                            (f"{TRAYS[1]}/Actions/ComputerSystem.Reset", "On", None)]),
    ],
    ids=["action-info-powercycle", "action-info-forceoff-then-on", "forceoff-then-on", "only-forcerestart", "unlisted-values-powercycle",
         "chassis-off-on", "sushy-tools-systems", "systems-each-its-own"],
)
def test_the_reset_is_chosen_from_what_the_chassis_advertises(
    tmp_path: Path, docs: dict[str, Any], via: ResetVia, sent: list[tuple[str, str, str | None]]
) -> None:
    bmc = FakeBmc(docs)
    record = rack_power(tmp_path, bmc).reset("b1", "k1")
    assert record.via == via and record.phase == RackPhase.SENT and not record.done
    assert [(t.target, t.reset, t.then) for t in record.targets] == sent
    assert bmc.posts == [(target, reset) for target, reset, _ in sent]
    assert all(t.sent for t in record.targets)


@pytest.mark.parametrize(
    ("docs", "error", "message"),
    [
        ({RACK: chassis({}, systems=[])}, PermanentError, "offers no #Chassis.Reset and links no ComputerSystems"),
        ({RACK: chassis({"#Chassis.Reset": {"target": "https://elsewhere/redfish/v1/Chassis/R/Actions/Chassis.Reset"}})},
         PermanentError, "not a path on the BMC; refused"),
        ({RACK: chassis({"#Chassis.Reset": {"target": RESET_TARGET, "ResetType@Redfish.AllowableValues": ["Nmi"]}})},
         NotSupported, r"offers none of \['PowerCycle', 'ForceOff', 'ForceRestart'\]"),
        ({RACK: chassis({"#Chassis.Reset": {"target": RESET_TARGET}}, power="PoweringOn")},
         TransientError, "is PoweringOn: another power action is under way"),
    ],
    ids=["nothing-to-reset", "target-on-another-host", "no-usable-reset", "powering-on"],
)
def test_a_chassis_it_cannot_power_cycle_is_an_error_and_nothing_is_recorded(
    tmp_path: Path, docs: dict[str, Any], error: type[RemediationError], message: str
) -> None:
    bmc, intents = FakeBmc(docs), MemoryIntents()
    with pytest.raises(error, match=message):
        rack_power(tmp_path, bmc, intents).reset("b1", "k1")
    assert bmc.posts == [] and intents.ops == {}


# -------------------------------------------------------------------- recorded, sent once per key


def test_the_reset_is_recorded_before_it_is_sent_and_never_sent_twice(tmp_path: Path) -> None:
    intents = MemoryIntents()
    bmc = FakeBmc({RACK: chassis({"#Chassis.Reset": {"target": RESET_TARGET}})})
    seen_at_post: list[dict[str, Any] | None] = []
    bmc.before_post = lambda _target: seen_at_post.append(intents.recorded("k1"))
    power = rack_power(tmp_path, bmc, intents)
    first = power.reset("b1", "k1")
    assert seen_at_post[0] is not None and seen_at_post[0]["phase"] == "requested"
    assert power.reset("b1", "k1") == first and bmc.posts == [(RESET_TARGET, "PowerCycle")]
    assert RackReset.from_dict(json.loads(json.dumps(intents.recorded("k1")))) == first
    assert SECRET not in json.dumps(first.to_dict())


def test_a_refused_first_post_records_nothing_and_raises(tmp_path: Path) -> None:
    intents = MemoryIntents()
    bmc = FakeBmc({RACK: chassis({"#Chassis.Reset": {"target": RESET_TARGET}})},
                  refuse={RESET_TARGET: CredentialError("permission denied: HTTP 403", status=403)})
    with pytest.raises(CredentialError, match="HTTP 403"):
        rack_power(tmp_path, bmc, intents).reset("b1", "k1")
    assert intents.ops == {} and bmc.posts == []


def test_a_refusal_after_a_sent_reset_keeps_what_was_sent_and_ends_with_the_error(tmp_path: Path) -> None:
    intents = MemoryIntents()
    second = f"{TRAYS[1]}/Actions/ComputerSystem.Reset"
    bmc = FakeBmc({RACK: chassis(), **{s: system(s, offered=SUSHY_TOOLS) for s in TRAYS}},
                  refuse={second: PermanentError("HTTP 400 Base.1.0.ActionParameterUnknown")})
    power = rack_power(tmp_path, bmc, intents)
    with pytest.raises(PermanentError, match="HTTP 400"):
        power.reset("b1", "k1")
    record = RackReset.from_dict(intents.recorded("k1") or {})
    assert [t.sent for t in record.targets] == [True, False] and record.done
    assert record.error is not None and "after 1 of 2 resets were sent" in record.error
    assert power.reset("b1", "k1") == record and len(bmc.posts) == 1  # never sent again


def test_an_unanswered_post_is_taken_as_sent(tmp_path: Path) -> None:
    bmc = FakeBmc({RACK: chassis({"#Chassis.Reset": {"target": RESET_TARGET}})},
                  refuse={RESET_TARGET: MaybeSent("read timed out")})
    record = rack_power(tmp_path, bmc).reset("b1", "k1")
    assert record.phase == RackPhase.UNANSWERED and record.targets[0].sent and record.error is None


# ------------------------------------------------------------------------------------- poll


def test_poll_sends_the_on_once_off_is_seen_and_ends_with_the_evidence(tmp_path: Path) -> None:
    clock = [1000.0]
    docs = {RACK: chassis({"#Chassis.Reset": {"target": RESET_TARGET,
                                               "ResetType@Redfish.AllowableValues": ["On", "ForceOff"]}})}
    bmc = FakeBmc(docs)
    power = rack_power(tmp_path, bmc, clock=clock)
    record = power.reset("b1", "k1")
    bmc.docs[RACK] = [chassis(power=p) for p in ("On", "Off", "Off", "On")]
    states = []
    while not record.done:
        clock[0] += 5
        record = power.poll(record)
        states.append(record.targets[0].seen[-1][0])
    assert states == ["On", "Off", "Off", "On"]
    assert bmc.posts == [(RESET_TARGET, "ForceOff"), (RESET_TARGET, "On")]  # the On once, at the first Off
    assert record.evidence == "left On, then On again" and record.error is None
    assert power.poll(record) == record


def target(before: str = "On", then: str | None = None, *, then_sent: bool = False, seen: tuple[str, ...] = ()) -> ResetTarget:
    return ResetTarget(RACK, "#Chassis.Reset", RESET_TARGET, "ForceOff" if then else "PowerCycle", before,
                       then=then, sent=True, then_sent=then_sent, seen=tuple((s, 1.0) for s in seen))


@pytest.mark.parametrize(
    ("targets", "after", "evidence", "error"),
    [
        ([target(seen=("On",))], 30, None, None),
        ([target(seen=("On",))], 61, "unobserved", None),
        ([target(seen=("On", "Off", "On")), target(seen=("On",))], 30, None, None),
        ([target(seen=("Off", "On")), target(seen=("On", "Off", "On"))], 30, "left On, then On again", None),
        ([target(before="Off", seen=("On",))], 1, "On again", None),
        ([target(then="On", seen=("On",))], 61, None, "never went Off"),
        ([target(then="On", then_sent=True, seen=("Off",))], 61, None, None),
    ],
    ids=["on-throughout-waits", "on-throughout-unobserved", "one-tray-not-yet", "every-tray-cycled",
         "was-off-now-on", "forceoff-never-took", "off-waits-for-on"],
)
def test_the_evidence_needs_every_target_cycled(
    targets: list[ResetTarget], after: float, evidence: str | None, error: str | None
) -> None:
    record = RackReset("b1", BMC, RACK, "rack", ResetVia.SYSTEMS, tuple(targets), 0.0, RackPhase.SENT)
    judged = judge(record, after, 60)
    assert judged.evidence == evidence
    assert (judged.error is None) if error is None else (error in (judged.error or ""))


def test_state_reads_the_chassis_and_each_system_it_links(tmp_path: Path) -> None:
    bmc = FakeBmc({RACK: chassis(), TRAYS[0]: system(TRAYS[0]), TRAYS[1]: system(TRAYS[1], power="Off")})
    state = rack_power(tmp_path, bmc).state("b1")
    assert (state.power, state.systems) == ("On", {TRAYS[0]: "On", TRAYS[1]: "Off"}) and bmc.posts == []


# --------------------------------------------------------------------------- dry run, factory


def test_the_dry_run_twin_reads_the_chassis_and_sends_nothing(tmp_path: Path) -> None:
    bmc, recorder, intents = FakeBmc({RACK: chassis({"#Chassis.Reset": {"target": RESET_TARGET}})}), Recorder(), MemoryIntents()
    twin = NoopRackPower(rack_power(tmp_path, bmc, intents), recorder)
    record = twin.reset("b1", "k1")
    assert record.recorded_only and record.done and twin.poll(record) == record
    assert bmc.posts == [] and intents.ops == {}
    (action,) = recorder.actions
    assert action["would"] == f"power-cycle chassis {RACK}" and action["resets"] == [f"PowerCycle to {RESET_TARGET}"]


def test_the_factory_builds_the_rack_power_its_settings_name(tmp_path: Path) -> None:
    redfish = inventory_file(tmp_path, {"b1": {"bmc": BMC, "chassis": "Rack_0"}})
    assert rack_power_backend(Settings(), MemoryIntents()) is None  # no inventory: no chassis known
    real = rack_power_backend(Settings(redfish=redfish), MemoryIntents())
    assert isinstance(real, RedfishRackPower) and isinstance(real, RackPower)
    recorder = Recorder()
    dry = rack_power_backend(Settings(redfish=redfish, dry_run=True), MemoryIntents(), recorder)
    assert isinstance(dry, NoopRackPower) and dry.record is recorder
    with pytest.raises(ConfigError, match="intents"):
        rack_power_backend(Settings(redfish=redfish), None)
    with pytest.raises(ConfigError, match="needs redfish.credentials_file"):
        rack_power_backend(Settings(redfish=RedfishSettings(inventory_file=redfish.inventory_file)), MemoryIntents())
