"""Failure traces: the published mix is scaled and placed deterministically; bad files are named."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from remediation.rehearsal.trace import Scale, TraceError, load, read_mix, synthesise

LLAMA = Path(__file__).resolve().parents[3] / "remediation" / "data" / "llama3-405b-interruptions.csv"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_full_scale_reproduces_the_published_counts() -> None:
    mix = read_mix(LLAMA)
    assert sum(r.count for r in mix) == 419
    faults = synthesise(mix, Scale(nodes=2048, days=54, start=T0, seed=3))
    by_category = Counter(f.category for f in faults)
    assert by_category["Faulty GPU"] == 148 and by_category["GPU HBM3 Memory"] == 72
    # Faults with no node signal never become events; correlated network faults hit 64 nodes each.
    assert "Software Bug" not in by_category and "NCCL Watchdog Timeouts" not in by_category
    assert by_category["Network Switch/Cable"] == 35 * 64
    assert all(T0 <= f.at <= datetime(2026, 2, 24, tzinfo=UTC) for f in faults)


def test_scaling_and_seed_are_deterministic() -> None:
    mix = read_mix(LLAMA)
    a = synthesise(mix, Scale(nodes=64, days=54, start=T0, seed=7))
    b = synthesise(mix, Scale(nodes=64, days=54, start=T0, seed=7))
    c = synthesise(mix, Scale(nodes=64, days=54, start=T0, seed=8))
    assert [(f.at, f.event.node) for f in a] == [(f.at, f.event.node) for f in b]
    assert [(f.at, f.event.node) for f in a] != [(f.at, f.event.node) for f in c]
    gpu = sum(1 for f in a if "GPU" in f.category)
    single = [f for f in a if f.category != "Network Switch/Cable"]
    assert len(single) in range(8, 20)  # ~419 * 64/2048 = 13 faults, minus the silent ones
    assert gpu >= len(single) // 2  # GPU faults dominate, as in the paper (~59%)


def test_maintenance_is_a_human_drain_and_not_fixed_by_restart() -> None:
    faults = synthesise(read_mix(LLAMA), Scale(nodes=2048, days=54, start=T0, seed=1))
    maint = [f for f in faults if f.category == "Host Maintenance"]
    assert maint and all(f.event.state == "DRAIN" and f.event.reason.startswith("maintenance") for f in maint)
    assert all(not f.fixed_by_restart for f in maint)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("x.csv", "a,b\n1,2\n", "needs the columns"),
    ("x.csv", "category,count,suggested_signal,remediable_by_vm_restart\nGPU,many,k8s,yes\n", "x.csv:2: count 'many'"),
    ("x.jsonl", '{"node": "n1"}\n', "x.jsonl:1: invalid event"),
    ("x.txt", "", "a trace is .jsonl"),
    ("missing.csv", None, "no such trace file"),
], ids=["columns", "count", "event", "suffix", "missing"])
def test_bad_trace_files_are_named(tmp_path: Path, name: str, text: str | None, message: str) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(TraceError, match=message):
        load(path, Scale(nodes=8, days=1, start=T0))
