"""A site without a half: which steps a remediation takes, what return does without evidence, and the
configurations refused at start-up. The steps run against the memory world; nothing here needs a server."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.adapters.noop import NoopValidator
from remediation.domain.context import RemediationContext
from remediation.domain.evidence import action_here
from remediation.domain.outcomes import Adapters, Cancel, Done, Quarantine, StepInput, StepSettings, Wait
from remediation.domain.ownership import release_node
from remediation.domain.statemachine import HAPPY_PATH, Site, Step, check_transition, next_on_success
from remediation.domain.step_bodies import k8s_cordon, k8s_evict, quarantine, return_to_service
from remediation.ports.errors import ConfigError
from remediation.settings import SettingsError, WorkflowSettings, load_settings

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
NODE = "gpu-node-1"
PREFIX = "remediation:"

D, C, E, R, V, VAL, RET, DONE = (Step.SLURM_DRAIN, Step.K8S_CORDON, Step.K8S_EVICT, Step.VM_RESTART, Step.VERIFY,
                                 Step.VALIDATE, Step.RETURN, Step.DONE)
SITES = {
    "machine": (Site(kubernetes=True, machine=True, validation=False), (D, C, E, R, V, RET, DONE)),
    "machine-and-check": (Site(kubernetes=True, machine=True, validation=True), (D, C, E, R, V, VAL, RET, DONE)),
    "no-machine-check": (Site(kubernetes=True, machine=False, validation=True), (D, C, E, VAL, RET, DONE)),
    "no-machine-no-check": (Site(kubernetes=True, machine=False, validation=False), (D, C, E, RET, DONE)),
    "slurm-only-check": (Site(kubernetes=False, machine=False, validation=True), (D, VAL, RET, DONE)),
    "slurm-only": (Site(kubernetes=False, machine=False, validation=False), (D, RET, DONE)),
    "slurm-and-machine": (Site(kubernetes=False, machine=True, validation=True), (D, R, V, VAL, RET, DONE)),
}


@pytest.mark.parametrize(("site", "path"), SITES.values(), ids=list(SITES))
def test_a_step_the_site_cannot_take_is_no_step(site: Site, path: tuple[Step, ...]) -> None:
    assert site.path() == path
    walked = [Step.SLURM_DRAIN]
    while walked[-1] is not Step.DONE:
        nxt = next_on_success(walked[-1], site)
        check_transition(walked[-1], nxt)  # every move the path makes is an allowed transition
        walked.append(nxt)
    assert tuple(walked) == path


@pytest.mark.parametrize("site", [s for s, _ in SITES.values()], ids=list(SITES))
def test_a_class_without_a_machine_rung_is_neither_restarted_nor_checked(site: Site) -> None:
    assert site.path(acts=False) == ((D, C, E, RET, DONE) if site.kubernetes else (D, RET, DONE))


def test_a_step_left_from_another_configuration_moves_on_along_this_sites_path() -> None:
    """A remediation that was at verify when the site lost its hammer goes on to what the site has."""
    assert next_on_success(Step.VERIFY, Site(kubernetes=True, machine=False, validation=True)) is Step.VALIDATE
    assert next_on_success(Step.VERIFY, Site(kubernetes=True, machine=False, validation=False)) is Step.RETURN
    assert set(HAPPY_PATH) >= set(Site(kubernetes=True, machine=False, validation=False).path())


# ----------------------------------------------------------------------------------------- return


def settings(**workflow: Any) -> StepSettings:
    return StepSettings.of(load_settings(machine={"backend": "none"}, workflow=workflow,
                                         policy={"faults": {"classify": True}}))


def look(checks: int = 0, fault_class: str | None = "gpu-hardware") -> StepInput:
    return StepInput(remediation_id=3, node=NODE, cause="xid 79", ladder=0,
                     context=RemediationContext(fault_class=fault_class), key="r3:return:1", attempt=1,
                     started_at=T0, checks=checks, provider_op=None, detail={}, source="slurm")


@pytest.fixture
def world() -> MemoryWorld:
    w = MemoryWorld(nodes=[NODE])
    w.set_slurm(NODE, state="IDLE", flags=["DRAIN", "FAIL"], reason=f"{PREFIX} xid 79")
    return w


def site(world: MemoryWorld, machine: bool = False, validator: Any = None, kube: bool = True) -> Adapters:
    return Adapters(MemorySlurm(world), MemoryKube(world) if kube else None, MemoryVM(world) if machine else None,
                    validator)


def test_with_no_machine_and_no_check_return_holds_pages_once_and_never_resumes(world: MemoryWorld) -> None:
    cfg = settings()
    first = return_to_service(look(0), site(world), cfg, now=T0)
    assert isinstance(first, Wait) and first.reason.startswith("held for a human: no machine action and no GPU check")
    assert first.note is not None and first.note.action == "unproven_hold"
    again = return_to_service(look(1), site(world), cfg, now=T0)
    assert isinstance(again, Wait) and again.note is None  # one page, not one per look
    assert not world.calls("slurm.resume") and world.node(NODE)["slurm"]["reason"] == f"{PREFIX} xid 79"


def test_a_held_node_a_human_resumed_ends_the_remediation_without_touching_it(world: MemoryWorld) -> None:
    world.set_slurm(NODE, state="IDLE", flags=[], reason="")
    out = return_to_service(look(3), site(world), settings(), now=T0)
    assert isinstance(out, Cancel) and f"a human took {NODE} back" in out.reason
    assert not world.calls("slurm.resume")


def test_unproven_quarantine_quarantines_instead_of_holding(world: MemoryWorld) -> None:
    out = return_to_service(look(0), site(world), settings(unproven="quarantine"), now=T0)
    assert isinstance(out, Quarantine) and "nothing can prove gpu-node-1 healthy" in out.reason
    assert not world.calls("slurm.resume")


@pytest.mark.parametrize("proof", ["machine", "check"])
def test_return_resumes_where_the_path_had_a_proof_to_run(world: MemoryWorld, proof: str) -> None:
    ad = site(world, machine=True) if proof == "machine" else site(world, validator=NoopValidator())
    out = return_to_service(look(0), ad, settings(), now=T0)
    assert isinstance(out, Done) and out.outcome.endswith("resumed in Slurm")


def test_a_hold_class_holds_at_return_for_a_human_as_at_k8s_evict(world: MemoryWorld) -> None:
    out = return_to_service(look(0, fault_class="fabric"), site(world, validator=NoopValidator()),
                            settings(), now=T0)
    assert isinstance(out, Wait) and out.note is not None and out.note.action == "fault_hold"
    assert not world.calls("slurm.resume")


def test_without_kubernetes_nothing_is_cordoned_or_tainted_and_the_rows_say_so(world: MemoryWorld) -> None:
    ad = site(world, kube=False)
    for step in (k8s_cordon, k8s_evict):  # not on the path; reached anyway, a configuration fault
        with pytest.raises(ConfigError, match="without Kubernetes"):
            step(look(0), ad, settings(), now=T0)
    out = quarantine(look(0), ad, settings(), now=T0)
    assert isinstance(out, Done) and out.outcome == "kept out of the Slurm pool; no Kubernetes: no Node to taint"
    held = return_to_service(look(0, fault_class="fabric"), ad, settings(), now=T0)
    assert isinstance(held, Wait) and "drained (no Kubernetes)" in held.reason
    assert release_node(ad, NODE, PREFIX) == "no Kubernetes; resumed in Slurm"
    assert not world.calls("k8s.cordon") and not world.calls("k8s.taint")


def test_a_held_fail_stays_held_though_our_drain_replaced_it(world: MemoryWorld) -> None:
    """slurmctld drops FAIL when a node is drained: a held fabric FAIL then reads IDLE+DRAIN, with our
    reason. That is not the fault clearing (which would give the node back, resumed): only a human ends it."""
    world.set_slurm(NODE, state="IDLE", flags=["DRAIN"], reason=f"{PREFIX} leaf switch down")
    held = replace(look(2, fault_class="fabric"), context=RemediationContext(fault_class="fabric",
                                                                              event_state="IDLE+FAIL"))
    out = return_to_service(held, site(world, kube=False), settings(), now=T0)
    assert isinstance(out, Wait) and "Slurm FAIL, which our drain replaced" in out.reason
    world.set_slurm(NODE, state="IDLE", flags=[], reason="")  # a human resumed it
    out = return_to_service(held, site(world, kube=False), settings(), now=T0)
    assert isinstance(out, Cancel) and "the fault cleared while held" in out.reason
    assert not world.calls("slurm.resume")


@pytest.mark.parametrize(("action", "site_", "want"), [
    ("move-host", Site(kubernetes=True, machine=True, validation=False), "move-host"),
    ("move-host", Site(kubernetes=True, machine=False, validation=True), None),
    ("restart", Site(kubernetes=True, machine=False, validation=False), "hold"),
    ("hold", Site(kubernetes=True, machine=False, validation=False), "hold"),
    ("quarantine", Site(kubernetes=True, machine=False, validation=True), "quarantine"),
], ids=["machine-keeps-its-rung", "a-check-decides", "no-check-holds", "hold-class", "quarantine-class"])
def test_the_recorded_action_names_no_rung_the_site_cannot_climb(action: str, site_: Site, want: str | None) -> None:
    assert action_here(action, site_, WorkflowSettings()) == want


# --------------------------------------------------------------------------------------- settings

REFUSED = [
    ({"workflow": {"ladder": ["restart"]}}, "workflow.ladder ['restart'] needs a machine action"),
    ({"policy": {"faults": {"ladders": {"gpu-memory": ["move-host", "quarantine"]}}}},
     "policy.faults.ladders.gpu-memory ['move-host', 'quarantine'] needs a machine action (move-host)"),
    ({"policy": {"faults": {"ladders": {"host": ["restart", "reimage"]}}}}, "(restart, reimage)"),
]


@pytest.mark.parametrize(("extra", "message"), REFUSED, ids=["workflow-ladder", "class-ladder", "two-rungs"])
def test_a_ladder_that_needs_a_machine_the_site_lacks_is_refused(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(machine={"backend": "none"}, **extra)
    assert message in str(err.value) and "machine.backend is none" in str(err.value)
    load_settings(**extra)  # with a machine backend the same ladder loads


KUBE_REFUSED = [
    ({}, "machine.backend: auto finds each node's machine through its Kubernetes Node's providerID"),
    ({"machine": {"backend": "gce"}}, "machine.backend: gce finds"),
    ({"machine": {"backend": "none"}, "validation": {"backend": "kubernetes"}},
     "validation.backend: kubernetes runs the GPU check as a Kubernetes Job"),
]


@pytest.mark.parametrize(("extra", "message"), KUBE_REFUSED, ids=["default-machine", "cloud", "kube-check"])
def test_a_backend_that_needs_the_kubernetes_the_site_lacks_is_refused(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(kube={"backend": "none"}, **extra)
    assert message in str(err.value) and "kube.backend is none" in str(err.value)


def test_a_slurm_only_site_loads_with_a_slurm_check_or_none() -> None:
    for check in ("slurm", "none"):
        s = load_settings(kube={"backend": "none"}, machine={"backend": "none"}, validation={"backend": check},
                          workflow={"unproven": "hold"})
        assert (s.kube.backend, s.machine.backend, s.validation.backend) == ("none", "none", check)


def test_a_ladder_slurms_reboot_cannot_climb_is_refused_and_a_slurm_only_site_may_reboot() -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(machine={"backend": "slurm"}, workflow={"ladder": ["restart", "stop_start"]},
                      policy={"faults": {"ladders": {"gpu-memory": ["move-host", "quarantine"]}}})
    text = str(err.value)
    assert "workflow.ladder ['restart', 'stop_start'] needs a machine action (move-host)" in text
    assert "policy.faults.ladders.gpu-memory ['move-host', 'quarantine'] needs a machine action (move-host)" in text
    assert "machine.backend slurm can only restart" in text
    s = load_settings(kube={"backend": "none"}, machine={"backend": "slurm"}, validation={"backend": "slurm"},
                      policy={"faults": {"ladders": {"gpu-memory": ["restart", "quarantine"]}}})
    assert (s.kube.backend, s.machine.backend) == ("none", "slurm")  # the machine is the Slurm node itself


def test_without_a_machine_the_shipped_ladders_load_and_a_written_one_may_hold_or_quarantine() -> None:
    s = load_settings(machine={"backend": "none"}, workflow={"unproven": "quarantine"},
                      policy={"faults": {"ladders": {"gpu-memory": ["quarantine"], "nvlink": ["none"]}}})
    assert (s.machine.backend, s.workflow.unproven) == ("none", "quarantine")
    assert s.policy.faults.ladders == {"gpu-memory": ["quarantine"], "nvlink": ["hold"]}
    assert load_settings().workflow.unproven == "hold"


# ------------------------------------------------------------------------------------------- noop


def test_the_dry_run_twin_beside_real_backends_is_refused_and_points_at_none() -> None:
    """The set-up that once "succeeded" a double-bit ECC node within a second: real Slurm and a Slurm
    check, with the dry-run twin standing in for Kubernetes and the machine (under the old name vm)."""
    with pytest.raises(SettingsError) as err:
        load_settings(kube={"backend": "noop"}, vm={"backend": "noop"}, validation={"backend": "slurm"})
    text = str(err.value)
    assert "kube.backend: noop is the dry-run twin" in text and "sets kube.backend: none" in text
    assert "machine.backend: noop is the dry-run twin" in text and "sets machine.backend: none" in text
    assert "set dry_run: true" in text


@pytest.mark.parametrize("section", ["slurm", "kube", "machine"])
def test_noop_is_refused_outside_dry_run_and_loads_in_it(section: str) -> None:
    with pytest.raises(SettingsError, match=f"{section}.backend: noop is the dry-run twin"):
        load_settings(**{section: {"backend": "noop"}})
    assert getattr(load_settings(dry_run=True, **{section: {"backend": "noop"}}), section).backend == "noop"


def test_a_bare_metal_site_without_kubernetes_finds_its_machines_in_the_bmc_inventory() -> None:
    """Redfish names each machine by the node in its own inventory: no Node's providerID is needed, and
    a BMC can power-cycle, so every rung of a written ladder loads."""
    s = load_settings(kube={"backend": "none"}, machine={"backend": "redfish"}, validation={"backend": "slurm"},
                      workflow={"ladder": ["restart", "stop_start"]})
    assert (s.kube.backend, s.machine.backend) == ("none", "redfish")
