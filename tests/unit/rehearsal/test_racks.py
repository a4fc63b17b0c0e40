"""NVL72 racks in the rehearsal: the outcome model's racks section, the domain faults placed on a rack
fleet, and the two ways of playing one out (the domain ladder, and each tray alone), counted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from remediation.rehearsal.racks import (
    DomainFault,
    TrayPace,
    compare,
    domain_faults,
    domain_ladder,
    per_tray,
    trays,
)
from remediation.rehearsal.truth import CURES, RACK_TIMES, RMA, RackModel, TruthError, parse_model

DATA = Path(__file__).resolve().parents[3] / "remediation" / "data"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: fabric restart 5, domain check 5, chassis power cycle 40, the GPU check after a tray's action 2 (minutes).
TIMES = {"fabric-restart": 5, "domain-check": 5, "chassis-power-cycle": 40, "tray-check": 2}
PACE = TrayPace(reset_s=120, reboot_s=1800, repair_s=4 * 3600)


def racks(**kinds: dict[str, Any]) -> dict[str, Any]:
    return {"compute_trays": 18, "switch_trays": 9, "source": "s",
            "times": {k: {"minutes": m, "source": "s"} for k, m in TIMES.items()},
            "kinds": kinds or {"sxid": {"per_rack_year": 2, "p_fabric_restart": 0.3, "p_power_cycle": 0.7,
                                        "class": "nvswitch", "source": "s"}}}


def rack_model(section: dict[str, Any]) -> RackModel:
    m = parse_model("t", {"categories": {}, "racks": section}).racks
    assert m is not None
    return m


def fault(cure: str, rack: int = 1, fault_class: str = "nvswitch") -> DomainFault:
    return DomainFault(T0, rack, "sxid", fault_class, cure)


def test_the_shipped_model_has_nvl72_racks_and_says_where_every_number_came_from() -> None:
    m = parse_model("truth-llama3.yaml", yaml.safe_load((DATA / "truth-llama3.yaml").read_text())).racks
    assert m is not None and (m.compute_trays, m.switch_trays) == (18, 9)
    assert set(m.times) == set(RACK_TIMES) and all(d.source for d in m.times.values())
    assert {k.fault_class for k in m.kinds.values()} == {"nvswitch", "imex"}
    assert all(k.source and 0 < k.p_fabric_restart <= k.p_power_cycle < 1 for k in m.kinds.values())
    # A model without racks stays one: the other shipped models have none.
    assert parse_model("h", yaml.safe_load((DATA / "truth-hardware-heavy.yaml").read_text())).racks is None


@pytest.mark.parametrize(("section", "says"), [
    ({**racks(), "source": ""}, "racks: source is required"),
    ({**racks(), "times": {"fabric-restart": {"minutes": 5, "source": "s"}}}, "no time for"),
    (racks(k={"per_rack_year": 1, "p_fabric_restart": 0.5, "p_power_cycle": 0.4, "class": "imex", "source": "s"}),
     "must be at least p_fabric_restart"),
    (racks(k={"per_rack_year": 1, "p_fabric_restart": 0.5, "p_power_cycle": 0.6, "class": "x", "source": "s"}),
     "is not a fault class"),
    (racks(k={"per_rack_year": 1, "p_fabric_restart": 0.5, "p_power_cycle": 0.6, "class": "imex"}),
     "racks.kinds.k: source is required"),
], ids=["no-source", "a-rung-untimed", "cycle-below-restart", "unknown-class", "kind-without-source"])
def test_a_racks_section_that_cannot_be_used_is_refused_by_name(section: dict[str, Any], says: str) -> None:
    with pytest.raises(TruthError, match=says):
        parse_model("t", {"categories": {}, "racks": section})


def test_cures_are_nested_by_one_draw() -> None:
    m = rack_model(racks())
    assert [m.cure("sxid", u) for u in (0.0, 0.29, 0.3, 0.69, 0.7, 0.99)] == [
        CURES[0], CURES[0], CURES[1], CURES[1], RMA, RMA]


def test_domain_faults_scale_each_rate_to_the_fleet_and_span_and_repeat_for_a_seed() -> None:
    m = rack_model(racks(a={"per_rack_year": 365, "p_fabric_restart": 1, "p_power_cycle": 1, "class": "imex",
                            "source": "s"},
                         b={"per_rack_year": 730, "p_fabric_restart": 0, "p_power_cycle": 0, "class": "nvswitch",
                            "source": "s"}))
    faults = domain_faults(m, 3, start=T0, days=2, seed=5)
    assert sorted((f.rack, f.kind) for f in faults) == sorted([(r, "a") for r in range(3)] * 2
                                                               + [(r, "b") for r in range(3)] * 4)
    assert {(f.kind, f.cure, f.fault_class) for f in faults} == {("a", "fabric-restart", "imex"),
                                                                  ("b", RMA, "nvswitch")}
    assert all(T0 <= f.at <= T0 + timedelta(days=2) for f in faults)
    assert faults == domain_faults(m, 3, start=T0, days=2, seed=5) != domain_faults(m, 3, start=T0, days=2, seed=6)


def test_a_rack_is_eighteen_consecutive_nodes() -> None:
    assert trays(2, rack_model(racks())) == [f"gpu-node-{i}" for i in range(36, 54)]


@pytest.mark.parametrize(("cure", "minutes", "quarantined", "pages", "cycles"), [
    ("fabric-restart", 5 + 5, 0, 0, 0),
    ("power-cycle", 5 + 5 + 40 + 5, 0, 0, 1),
    (RMA, 5 + 5 + 40 + 5, 18, 1, 1),
], ids=["fabric-restart-cures", "power-cycle-cures", "quarantined-for-rma"])
def test_the_domain_ladder_repairs_the_rack_once_and_quarantines_it_with_one_page(
        cure: str, minutes: int, quarantined: int, pages: int, cycles: int) -> None:
    out = domain_ladder(fault(cure), rack_model(racks()))
    assert out.tray_hours == {n: pytest.approx(minutes / 60) for n in trays(1, rack_model(racks()))}
    assert out.hours == pytest.approx(18 * minutes / 60)
    assert (out.quarantined, out.pages) == (quarantined, pages)
    assert out.actions["fabric-restart"] == 18 and out.actions["chassis-power-cycle"] == cycles


@pytest.mark.parametrize(("rungs", "minutes", "quarantined"), [
    (("restart", "move-host"), 2 * (30 + 2), 18),  # two reboots and their checks, then quarantine
    (("gpu-reset", "restart", "move-host", "quarantine"), (2 + 2) + 2 * (30 + 2), 18),
    (("hold",), 4 * 60, 0),  # held for a human: out until the rack's repair by hand
], ids=["reboots-then-quarantine", "reset-first", "hold"])
def test_per_tray_every_tray_climbs_its_own_ladder_and_none_of_it_cures_the_domain(
        rungs: tuple[str, ...], minutes: int, quarantined: int) -> None:
    out = per_tray(fault("fabric-restart"), rack_model(racks()), rungs, pace=PACE)
    assert out.hours == pytest.approx(18 * minutes / 60)
    assert (out.quarantined, out.pages) == (quarantined, 18)  # every tray handed over pages on its own


def test_per_tray_a_held_tray_waits_for_the_repair_by_hand_and_a_quarantined_one_counts_to_its_quarantine() -> None:
    # A repair by hand of 10 minutes: a quarantine still counts its 64 minutes, a hold only the repair.
    out = per_tray(fault(RMA), rack_model(racks()), ("restart", "move-host"), pace=TrayPace(120, 1800, 600))
    assert out.quarantined == 18 and out.hours == pytest.approx(18 * 64 / 60)
    held = per_tray(fault(RMA), rack_model(racks()), ("hold",), pace=TrayPace(120, 1800, 600))
    assert held.quarantined == 0 and held.hours == pytest.approx(18 * 10 / 60)


def test_compare_adds_both_strategies_over_the_same_faults_and_divides_by_the_faults() -> None:
    m = rack_model(racks())
    faults = [fault("fabric-restart", rack=0), fault(RMA, rack=1), fault("power-cycle", rack=0, fault_class="imex")]
    figures = compare(faults, m, racks=2, pace=PACE,
                      rungs=lambda c: ("hold",) if c == "imex" else ("restart", "move-host"))
    ladder = sum(domain_ladder(f, m).hours for f in faults)
    assert figures.per_fault(figures.domain_ladder) == pytest.approx(ladder / 3)
    alone = (2 * 18 * 64 + 18 * 240) / 60
    assert figures.per_fault(figures.per_tray) == pytest.approx(alone / 3)
    assert figures.ratio == pytest.approx(ladder / alone)
    d = figures.as_dict()
    assert d["faults"] == 3 and d["by_kind"] == {"sxid": 3} and d["per_tray"]["pages"] == 54
    assert d["domain_ladder"]["quarantined_trays"] == 18 and d["domain_ladder"]["pages"] == 1


def test_no_domain_faults_give_no_figure_rather_than_zero() -> None:
    figures = compare([], rack_model(racks()), racks=1, pace=PACE, rungs=lambda c: ("restart",))
    assert figures.per_fault(figures.per_tray) is None and figures.ratio is None
