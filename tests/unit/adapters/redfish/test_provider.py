"""The redfish backend without a BMC: which reset each rung sends, the inventory and credentials files
(and that no message quotes a password), the evidence rules of ``poll`` on a scripted system, the
workflow finding a bare-metal machine by its node, and the factory's wiring. The BMC itself is in
tests/integration/redfish."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
import urllib3
from sushy import exceptions as sushy_exc

from remediation.adapters.factory import machine_backend, make_adapters
from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryWorld
from remediation.adapters.redfish.client import MaybeSent, never_sent, on_this_bmc
from remediation.adapters.redfish.inventory import Bmc, Inventory, parse_entry
from remediation.adapters.redfish.noop import NoopRedfish
from remediation.adapters.redfish.provider import RedfishProvider, plan_reset
from remediation.domain.context import RemediationContext
from remediation.domain.outcomes import Adapters, StepInput, StepSettings, Wait
from remediation.domain.step_bodies import vm_restart
from remediation.ports.cluster import Operation, VMAction, VMRef
from remediation.ports.errors import (
    ConfigError,
    CredentialError,
    NotSupported,
    PermanentError,
    TransientError,
    UnknownNode,
)
from remediation.settings import RedfishSettings, Settings, load_settings

SECRET = "pw-never-shown-7f3a"
EMULATOR = {"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn"}
FULL = EMULATOR | {"PowerCycle"}


@pytest.mark.parametrize(
    ("action", "allowed", "state", "expected"),
    [
        (VMAction.RESTART, FULL, "On", ("GracefulRestart", None)),
        (VMAction.RESTART, {"ForceRestart", "On"}, "On", ("ForceRestart", None)),
        (VMAction.STOP_START, FULL, "On", ("PowerCycle", None)),
        (VMAction.STOP_START, EMULATOR, "On", ("ForceOff", "On")),
        (VMAction.STOP_START, {"ForceOff", "ForceOn"}, "On", ("ForceOff", "ForceOn")),
        (VMAction.STOP_START, {"ForceOff", "ForceRestart"}, "On", ("ForceRestart", None)),
        (VMAction.RESTART, FULL, "Off", ("On", None)),
        (VMAction.STOP_START, FULL, "Off", ("On", None)),
    ],
    ids=[
        "restart-graceful",
        "restart-force",
        "cycle",
        "cycle-off-on",
        "cycle-force-on",
        "cycle-no-on",
        "off-restart",
        "off-cycle",
    ],
)
def test_each_rung_sends_the_reset_the_system_offers(
    action: VMAction, allowed: set[str], state: str, expected: tuple[str, str | None]
) -> None:
    assert plan_reset(action, allowed, state) == expected


@pytest.mark.parametrize(
    ("action", "allowed", "state"),
    [
        (VMAction.REIMAGE, FULL, "On"),
        (VMAction.RESTART, {"Nmi"}, "On"),
        (VMAction.RESTART, {"ForceOff"}, "Off"),
    ],
    ids=["reimage", "nothing-offered", "off-without-on"],
)
def test_what_a_bmc_cannot_do_is_a_configuration_error(
    action: VMAction, allowed: set[str], state: str
) -> None:
    with pytest.raises(NotSupported):
        plan_reset(action, allowed, state)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"bmc": "http://10.0.0.1", "system": "1"}, "https:// URL, not 'http://10.0.0.1'"),
        ({"bmc": f"https://admin:{SECRET}@10.0.0.1", "system": "1"}, "scheme, host and port only"),
        ({"bmc": f"ftp://admin:{SECRET}@10.0.0.1", "system": "1"}, "must be an https:// URL"),
        ({"bmc": "https://10.0.0.1/redfish", "system": "1"}, "scheme, host and port only"),
        ({"bmc": "https://10.0.0.1"}, "system must name"),
        ({"bmc": "https://10.0.0.1", "system": "../Managers/1"}, "system must name"),
        ("https://10.0.0.1", "not a mapping"),
    ],
    ids=["http", "userinfo", "userinfo-other-scheme", "path", "no-system", "dots", "not-a-mapping"],
)
def test_a_wrong_entry_is_that_nodes_error_and_never_quotes_a_password(entry: Any, message: str) -> None:
    with pytest.raises(PermanentError, match=message) as info:
        parse_entry("gpu-node-1", entry, "inventory")
    assert SECRET not in info.value.message


def test_an_entry_names_its_system_and_its_credentials() -> None:
    assert parse_entry("n", {"bmc": "https://bmc-7:8443/", "system": "System.Embedded.1"}, "x") == Bmc(
        "https://bmc-7:8443", "/redfish/v1/Systems/System.Embedded.1", "default"
    )
    assert parse_entry(
        "n", {"bmc": "https://b", "system": "/redfish/v1/Systems/1", "credentials": "rack-2"}, "x"
    ) == Bmc("https://b", "/redfish/v1/Systems/1", "rack-2")


def files(tmp_path: Path, inventory: Any, credentials: str, **kw: Any) -> RedfishSettings:
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "credentials.yaml").write_text(credentials)
    return RedfishSettings(
        inventory_file=str(tmp_path / "inventory.json"),
        credentials_file=str(tmp_path / "credentials.yaml"),
        **kw,
    )


def test_inventory_then_annotation_and_logins_by_name(tmp_path: Path) -> None:
    settings = files(
        tmp_path,
        {"gpu-node-1": {"bmc": "https://b1", "system": "1", "credentials": "rack-1"}},
        f"rack-1: {{username: admin, password: {SECRET}}}\n",
        node_annotation="example.com/bmc",
    )
    annotated = {"gpu-node-2": {"example.com/bmc": json.dumps({"bmc": "https://b1", "system": "2"})}}
    inventory = Inventory(settings, lambda node: annotated.get(node, {}))
    assert inventory.bmc("gpu-node-1").url == "https://b1"
    # The annotation picks a system on a listed BMC; the login is the inventory's for that BMC.
    assert inventory.bmc("gpu-node-2") == Bmc("https://b1", "/redfish/v1/Systems/2", "rack-1")
    with pytest.raises(UnknownNode, match="nor annotated example.com/bmc"):
        inventory.bmc("gpu-node-3")
    login = inventory.login(inventory.bmc("gpu-node-1"))
    assert login.password == SECRET and SECRET not in repr(login)
    (tmp_path / "credentials.yaml").write_text(f"rack-2: {{username: admin, password: {SECRET}}}\n")
    with pytest.raises(ConfigError, match="no username and password for 'rack-1'") as info:
        inventory.login(inventory.bmc("gpu-node-2"))
    assert SECRET not in info.value.message


def test_a_broken_credentials_file_is_reported_without_its_content(tmp_path: Path) -> None:
    settings = files(
        tmp_path,
        {"n": {"bmc": "https://b", "system": "1"}},
        f"default: {{username: admin, password: {SECRET}\n  broken: [\n",
    )
    with pytest.raises(ConfigError, match=r"not valid YAML or JSON \(line \d+\)") as info:
        Inventory(settings).login(Bmc("https://b", "/redfish/v1/Systems/1", "default"))
    assert SECRET not in info.value.message


def test_files_are_read_again_when_they_change(tmp_path: Path) -> None:
    settings = files(tmp_path, {"n": {"bmc": "https://old", "system": "1"}}, "{}")
    inventory = Inventory(settings)
    assert inventory.bmc("n").url == "https://old"
    (tmp_path / "inventory.json").write_text(json.dumps({"n": {"bmc": "https://rotated", "system": "1"}}))
    assert inventory.bmc("n").url == "https://rotated"


# ------------------------------------------------------------------------------ poll, scripted


@dataclass
class ScriptedBmc:
    """Stands in for a BmcSession: answers each read with the next power state, records resets."""

    states: list[str]
    sent: list[str] = field(default_factory=list)
    where: str = "BMC https://b system /redfish/v1/Systems/1"

    def __enter__(self) -> ScriptedBmc:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def system(self) -> dict[str, Any]:
        return {"PowerState": self.states.pop(0) if len(self.states) > 1 else self.states[0]}

    def reset(self, reset_type: str) -> None:
        self.sent.append(reset_type)


def scripted(bmc: ScriptedBmc, **settings: Any) -> RedfishProvider:
    provider = RedfishProvider(RedfishSettings(**settings), Inventory(RedfishSettings()), intents=None)  # type: ignore[arg-type]
    provider.session = lambda _bmc: bmc  # type: ignore[assignment, method-assign, return-value]
    return provider


def requested(reset: str, then: str | None = None, before: str = "On", ago: float = 0.0) -> Operation:
    data = {
        "bmc": "https://b",
        "system": "/redfish/v1/Systems/1",
        "credentials": "default",
        "reset": reset,
        "then": then,
        "before": before,
        "phase": "sent",
        "requested_at": time.time() - ago,
        "seen": [],
    }
    return Operation(
        "redfish", f"{reset}@https://b/redfish/v1/Systems/1", VMAction.RESTART, VMRef("redfish", "n"), data
    )


def polls(provider: RedfishProvider, op: Operation, times: int) -> tuple[list[bool], Operation]:
    done = []
    for _ in range(times):
        status = provider.poll(op)
        op = status.replace or op
        done.append(status.done)
        assert status.error is None
    return done, op


def test_done_only_once_the_stored_operation_shows_off_then_on() -> None:
    done, op = polls(scripted(ScriptedBmc(["On", "Off", "On"])), requested("GracefulRestart"), 4)
    assert done == [False, False, False, True]  # the third poll records the evidence; the fourth moves on
    assert [s for s, _ in op.data["seen"]] == ["On", "Off", "On"]
    assert op.data["evidence"] == "left On, then On again"


def test_a_system_on_throughout_is_unobserved_after_the_bound_and_verify_decides() -> None:
    provider = scripted(ScriptedBmc(["On"]), unobserved_after_s=60)
    done, op = polls(provider, requested("ForceRestart"), 2)
    assert done == [False, False] and "evidence" not in op.data  # within the bound: keep looking
    done, op = polls(provider, requested("ForceRestart", ago=61), 2)
    assert done == [False, True] and op.data["evidence"] == "unobserved"


def test_the_fallback_powers_on_once_off_and_a_force_off_that_never_landed_fails() -> None:
    bmc = ScriptedBmc(["On", "Off", "Off", "On"])
    done, op = polls(scripted(bmc), requested("ForceOff", then="On"), 5)
    assert bmc.sent == ["On"] and done[-1] and op.data["phase"] == "then-sent"
    status = scripted(ScriptedBmc(["On"]), unobserved_after_s=60).poll(
        requested("ForceOff", then="On", ago=61)
    )
    assert status.done and status.error and "never went Off" in status.error


def test_a_system_that_was_off_is_done_when_seen_on() -> None:
    done, op = polls(scripted(ScriptedBmc(["On"])), requested("On", before="Off"), 2)
    assert done == [False, True] and op.data["evidence"] == "On again"


# ------------------------------------------------------------------- the workflow and the factory


@dataclass
class ByNode:
    """A MachinesByNode provider that records what the workflow asked of it."""

    calls: list[tuple[str, Any]] = field(default_factory=list)

    def machine_of(self, node: str, k8s_node: str | None = None) -> VMRef:
        node = k8s_node or node
        self.calls.append(("machine_of", node))
        return VMRef("redfish", node)

    def start(self, vm: VMRef, action: VMAction, idempotency_key: str) -> Operation:
        self.calls.append(("start", (vm.name, action)))
        return Operation("redfish", "GracefulRestart@https://b", action, vm)

    def poll(self, op: Operation) -> Any:
        raise AssertionError("not polled here")


@pytest.mark.parametrize(
    ("ladder", "rung", "action"),
    [(["restart", "reimage"], 0, VMAction.RESTART), (["restart", "reimage"], 1, VMAction.STOP_START)],
    ids=["restart", "reimage-is-a-power-cycle"],
)
def test_the_workflow_finds_a_bare_metal_machine_by_its_node(
    ladder: list[str], rung: int, action: VMAction
) -> None:
    world = MemoryWorld(nodes=["gpu-node-3"])
    vm = ByNode()
    cfg = StepSettings.of(load_settings(workflow={"ladder": ladder}))
    inp = StepInput(
        remediation_id=7,
        node="gpu-node-3",
        cause="xid 79",
        ladder=rung,
        context=RemediationContext(k8s_node="bm-host-3", provider_id=""),
        key="r7:vm_restart:1",
        attempt=1,
        started_at=datetime.now(UTC),
        checks=0,
        provider_op=None,
        detail={"slurmd_start_before": ""},  # recorded in a write of its own before the action
    )
    out = vm_restart(inp, Adapters(MemorySlurm(world), MemoryKube(world), vm), cfg,
                     now=datetime.now(UTC))  # type: ignore[arg-type]
    assert isinstance(out, Wait) and out.provider_op is not None
    assert vm.calls == [("machine_of", "bm-host-3"), ("start", ("bm-host-3", action))]


def test_the_factory_builds_redfish_only_with_its_files_and_the_intents(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="redfish.credentials_file and redfish.inventory_file"):
        machine_backend(Settings(machine={"backend": "redfish"}))
    settings = Settings(machine={"backend": "redfish"}, redfish=files(tmp_path, {}, "{}").model_dump())
    with pytest.raises(ConfigError, match="intents"):
        machine_backend(settings)
    assert isinstance(machine_backend(settings, intents=object()), RedfishProvider)  # type: ignore[arg-type]
    simulated = Settings(
        machine={"backend": "redfish"},
        redfish=settings.redfish.model_dump(),
        dry_run=True,
        slurm={"backend": "memory"},
        kube={"backend": "memory"},
    )
    dry = make_adapters(simulated, MemoryWorld(nodes=["n"]), intents=object())  # type: ignore[arg-type]
    assert isinstance(dry.machine, NoopRedfish)


# -------------------------------------------------------------- a reset's intent and its POST


def failed_post(cause: BaseException) -> sushy_exc.ConnectionError:
    """sushy's wrapping of a transport failure, as its connector raises it (inside the handler)."""
    try:
        raise cause
    except BaseException:
        try:
            raise sushy_exc.ConnectionError(url="https://b/x", error=cause) from None
        except sushy_exc.ConnectionError as exc:
            return exc


REFUSED = requests.exceptions.ConnectionError(
    urllib3.exceptions.MaxRetryError(None, "/x", urllib3.exceptions.NewConnectionError(None, "refused"))
)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cause", "sent"),
    [
        (requests.exceptions.ReadTimeout("read timed out"), False),
        (REFUSED, True),
        (requests.exceptions.ConnectTimeout("connect timed out"), True),
        (requests.exceptions.ConnectionError("Connection aborted: RemoteDisconnected"), False),
    ],
    ids=["read-timeout", "refused", "connect-timeout", "dropped"],
)
def test_only_a_post_that_never_left_counts_as_not_sent(cause: BaseException, sent: bool) -> None:
    assert never_sent(failed_post(cause)) is sent


@dataclass
class DictIntents:
    ops: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def recorded(self, key: str) -> dict[str, Any] | None:
        return self.ops.get(key)

    def claim(self, key: str, op: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append("claim")
        if key in self.ops:
            return self.ops[key]
        self.ops[key] = op
        return None

    def settle(self, key: str, op: dict[str, Any]) -> None:
        self.calls.append("settle")
        self.ops[key] = op

    def release(self, key: str, op: dict[str, Any]) -> None:
        self.calls.append("release")
        self.ops.pop(key, None)


class PostFails(ScriptedBmc):
    def __init__(self, error: BaseException) -> None:
        super().__init__(["On"])
        self.error = error
        self.bmc = Bmc("https://b", "/redfish/v1/Systems/1", "default")

    def allowed_resets(self) -> set[str]:
        return FULL

    def reset(self, reset_type: str) -> None:
        self.sent.append(reset_type)
        raise self.error


@pytest.mark.parametrize(
    ("error", "kept"),
    [
        (MaybeSent("read timed out"), True),
        (TransientError("no answer"), False),
        (CredentialError("HTTP 401"), False),
    ],
    ids=["unanswered-kept", "never-reached-released", "refused-released"],
)
def test_an_intent_is_kept_unless_the_bmc_surely_did_nothing(
    tmp_path: Path, error: BaseException, kept: bool
) -> None:
    settings = files(
        tmp_path, {"n": {"bmc": "https://b", "system": "1"}}, "default: {username: u, password: p}"
    )
    intents, bmc = DictIntents(), PostFails(error)
    provider = RedfishProvider(settings, Inventory(settings), intents)
    provider.session = lambda _bmc: bmc  # type: ignore[assignment, method-assign, return-value]
    if kept:
        op = provider.start(VMRef("redfish", "n"), VMAction.RESTART, "k")
        assert op.data["phase"] == "requested" and op.data["unanswered"] == "read timed out"
        assert intents.calls == ["claim", "settle"] and intents.ops["k"] == op.to_dict()
        assert provider.start(VMRef("redfish", "n"), VMAction.RESTART, "k") == op and bmc.sent == [
            "GracefulRestart"
        ]
    else:
        with pytest.raises(type(error)):
            provider.start(VMRef("redfish", "n"), VMAction.RESTART, "k")
        assert intents.calls == ["claim", "release"] and "k" not in intents.ops  # a later try may send it


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("/redfish/v1/Systems/1/Actions/ComputerSystem.Reset", "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"),
        ("https://bmc-7:8443/redfish/v1/Systems/1/Actions/R", "/redfish/v1/Systems/1/Actions/R"),
        ("https://elsewhere:8443/redfish/v1/Systems/1/Actions/R", None),
        ("https://bmc-7/redfish/v1/Systems/1/Actions/R", None),
        ("http://bmc-7:8443/redfish/v1/Systems/1/Actions/R", None),
        ("//elsewhere/redfish/v1/Systems/1/Actions/R", None),
        ("redfish/v1/Systems/1/Actions/R", None),
        ("https://bmc-7:x/r", None),
    ],
    ids=["path", "same-host-url", "other-host", "other-port", "other-scheme", "scheme-relative", "relative",
         "bad-port"],
)
def test_a_reset_target_is_a_path_on_the_bmc_itself(target: str, path: str | None) -> None:
    assert on_this_bmc(target, "https://bmc-7:8443") == path
