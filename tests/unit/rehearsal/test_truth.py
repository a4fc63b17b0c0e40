"""The rehearsal's outcome model: read as data, rolled deterministically, carried into the trace."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from remediation.rehearsal.compare import ratios
from remediation.rehearsal.trace import Scale, leaf_of, read_mix, synthesise
from remediation.rehearsal.truth import TIMES, TruthError, parse_model

DATA = Path(__file__).resolve().parents[3] / "remediation" / "data"
LLAMA = DATA / "llama3-405b-interruptions.csv"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def model(name: str = "truth-llama3.yaml"):  # type: ignore[no-untyped-def]
    return parse_model(name, yaml.safe_load((DATA / name).read_text()))


@pytest.mark.parametrize("name", ["truth-llama3.yaml", "truth-restart-friendly.yaml", "truth-hardware-heavy.yaml"])
def test_every_shipped_model_covers_the_llama_mix_and_says_where_its_numbers_came_from(name: str) -> None:
    m = model(name)
    assert {r.category for r in read_mix(LLAMA)} <= set(m.categories)
    assert all(t.source for t in m.categories.values())
    assert all(t.p_reset <= t.p_restart <= t.p_move for t in m.categories.values())
    # Every machine action's time, each with where it came from; a bare machine reboots slower than a VM.
    assert set(m.times) == set(TIMES) and all(d.source for d in m.times.values())
    assert m.minutes("gpu-reset") < m.minutes("vm-restart") < m.minutes("bare-metal-reboot") == 30
    # The reset fixes something only where NVIDIA's catalogue resets the GPU.
    assert m.truth("GPU HBM3 Memory").p_reset > 0 and m.truth("NIC").p_reset == 0 == m.truth("SSD").p_reset


def test_outcomes_are_nested_and_follow_the_probabilities() -> None:
    m = parse_model("t", {"categories": {"gpu": {"p_reset": 0.1, "p_restart": 0.3, "p_move": 0.9, "source": "t"},
                                         "sw": {"fabric": True, "source": "t"}}})
    rng = random.Random(5)
    rolls = [m.roll("gpu", rng) for _ in range(4000)]
    counts = Counter(kind for o in rolls for kind in o.fixed_by)
    assert 0.27 < counts["restart"] / 4000 < 0.33 and 0.88 < counts["move"] / 4000 < 0.92
    assert 0.08 < counts["reset"] / 4000 < 0.12
    # Whatever a reset fixes, a restart fixes; whatever a restart fixes, a move fixes too; a reimage
    # defaults to the restart's rate.
    assert all("restart" in o.fixed_by for o in rolls if "reset" in o.fixed_by)
    assert all("move" in o.fixed_by for o in rolls if "restart" in o.fixed_by)
    assert counts["reimage"] == counts["restart"]
    fabric = m.roll("sw", rng)
    assert fabric.fabric and fabric.needs_hands


@pytest.mark.parametrize(("data", "message"), [
    ({}, "a 'categories' mapping"),
    ({"categories": {"gpu": {"p_move": 0.5}}}, "p_restart is required"),
    ({"categories": {"gpu": {"p_restart": 1.5, "p_move": 1}}}, "between 0 and 1"),
    ({"categories": {"gpu": {"p_restart": 0.9, "p_move": 0.5}}}, "at least p_restart"),
    ({"categories": {"gpu": {"p_restart": 0.1, "p_move": 0.5, "p_fix": 1}}}, "unknown field"),
    ({"categories": {"gpu": {"p_restart": "x", "p_move": 0.5}}}, "is not a number"),
    ({"categories": {"gpu": {"p_restart": 0.1, "p_move": 0.5}}}, "source is required"),
    ({"categories": {"gpu": {"p_restart": 0.1, "p_move": 0.5, "source": " "}}}, "source is required"),
    ({"categories": {"gpu": {"p_reset": 0.5, "p_restart": 0.1, "p_move": 0.5, "source": "t"}}},
     "at most p_restart"),
    ({"categories": {}, "times": {"gpu-reset": {"minutes": 2}}}, "gpu-reset: source is required"),
    ({"categories": {}, "times": {"gpu-reset": {"minutes": 0, "source": "t"}}}, "more than 0"),
    ({"categories": {}, "times": {"reboot": {"minutes": 30, "source": "t"}}}, "unknown action"),
])
def test_a_bad_model_is_refused_with_its_category_named(data: object, message: str) -> None:
    with pytest.raises(TruthError, match=message):
        parse_model("bad.yaml", data)


def test_the_trace_carries_causes_outcomes_and_leaf_groups() -> None:
    m = model()
    faults = synthesise(read_mix(LLAMA), Scale(nodes=2048, days=54, start=T0, seed=3, leaf_size=16), model=m)
    fabric = [f for f in faults if f.category == "Network Switch/Cable"]
    groups = Counter(f.group for f in fabric)
    assert len(groups) == 35 and set(groups.values()) == {16}
    for g in groups:  # one fault, one whole leaf
        assert len({leaf_of(int(f.event.node.rsplit("-", 1)[1]), 16) for f in fabric if f.group == g}) == 1
    assert all(f.outcome is not None and f.outcome.fabric for f in fabric)
    # Researchers' reasons and GPU conditions carry the XID of their category.
    fails = [f for f in faults if f.event.state == "FAIL" and f.category == "Faulty GPU"]
    conds = [f for f in faults if f.event.source == "kubernetes" and f.category == "GPU HBM3 Memory"]
    assert fails and all(any(str(x) in f.event.reason for x in (79, 119, 74)) for f in fails)
    assert any(f.event.reason.startswith("NVRM: Xid (PCI:") for f in fails)
    assert conds and all(f.event.state.endswith("=True") and "Xid" in f.event.reason for f in conds)
    hbm = [f for f in faults if f.category == "GPU HBM3 Memory"]
    restart_fixes = sum(1 for f in hbm if "restart" in f.outcome.fixed_by)  # type: ignore[union-attr]
    assert 0.1 < restart_fixes / len(hbm) < 0.5  # p_restart 0.3
    again = synthesise(read_mix(LLAMA), Scale(nodes=2048, days=54, start=T0, seed=3, leaf_size=16), model=m)
    assert [(f.event.reason, f.outcome) for f in again] == [(f.event.reason, f.outcome) for f in faults]


def test_ratios_are_candidate_over_baseline_and_none_where_the_baseline_is_zero() -> None:
    cand = {"vm_actions_total": 10, "wasted_vm_actions": 2, "node_hours_out": 50.0, "auto_fixed": 8,
            "quarantined": [("n1", "x")], "fabric_vm_actions": 0, "incidents": 3, "pages": 4}
    base = {"vm_actions_total": 40, "wasted_vm_actions": 20, "node_hours_out": 100.0, "auto_fixed": 8,
            "quarantined": [("n1", "x"), ("n2", "y")], "fabric_vm_actions": 16, "incidents": 0, "pages": 4}
    r = ratios(cand, base)
    assert r["wasted_vm_actions"] == 0.1 and r["node_hours_out"] == 0.5 and r["quarantined"] == 0.5
    assert r["incidents"] is None and r["auto_fixed"] == 1.0
