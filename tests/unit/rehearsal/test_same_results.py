"""A faster rehearsal decides the same: the whole report of two fixed-seed runs, against one recorded.

Each case replays the Llama 3 mix as ``remediation simulate`` does (the shipped outcome model, leaf
groups of 16) and compares every figure of the report (decisions, outcomes, VM actions, node-hours,
goodput), every event's decision and every remediation with its steps with the JSON in ``data/``,
recorded from the code before the rehearsal was made faster. Only ids the world makes up at random are
masked, and the count of workflow runs (a cost, not a result) is left out.

A change that means to change the results records them again, and says why in its commit:

    python -m tests.unit.rehearsal.test_same_results
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from remediation.cli.simulate import outcome_model
from remediation.rehearsal.run import Layout, Pace, rehearse
from remediation.rehearsal.trace import Scale, load
from remediation.settings import Settings
from tests.unit.rehearsal.test_loop import masked

DATA = Path(__file__).parent / "data"
MIX = Path(__file__).resolve().parents[3] / "remediation" / "data" / "llama3-405b-interruptions.csv"
#: name -> (nodes, seed, settings, pace): the default policy on a cloud fleet, and jobs on the node (the
#: GPU reset, the evidence job and the GPU check) on bare metal.
CASES: dict[str, tuple[int, int, dict[str, Any], Pace]] = {
    "llama3-256-nodes-seed-3": (256, 3, {}, Pace()),
    "llama3-128-nodes-seed-1-jobs-bare-metal": (128, 1, {"validation": {"backend": "kubernetes"}},
                                                Pace(reboot_s=1800)),
}


def report_of(case: str) -> Any:
    """The case's masked report, as JSON would carry it (tuples as lists)."""
    nodes, seed, settings, pace = CASES[case]
    faults = load(MIX, Scale(nodes=nodes, days=54, start=datetime(2026, 1, 1, tzinfo=UTC), seed=seed,
                             leaf_size=16), model=outcome_model(None))
    names = sorted({f.event.node for f in faults} | {f"gpu-node-{i}" for i in range(nodes)})
    report = rehearse(faults, Settings(**settings), names, pace=pace, layout=Layout(leaf_size=16))
    return json.loads(json.dumps(masked(report)))


@pytest.mark.parametrize("case", list(CASES))
def test_the_rehearsal_reports_what_it_reported_before(case: str) -> None:
    recorded = json.loads((DATA / f"{case}.json").read_text())
    now = report_of(case)
    assert now["history"], "the case opened no remediation: it compares nothing"
    for key in sorted(set(recorded) | set(now)):
        assert now.get(key) == recorded.get(key), key


if __name__ == "__main__":
    for name in CASES:
        (DATA / f"{name}.json").write_text(json.dumps(report_of(name), indent=1, sort_keys=True) + "\n")
