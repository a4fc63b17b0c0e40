"""``python -m bench.reliability`` prints the security section the tests measured, under its table.

The section is what the bad-input tests saw (tests/scenario_table.py); the bench runs those tests
beside the reliability suite, so every kind of bad input is tried in the run that writes the table.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bench.reliability import SECURITY, run
from tests import scenario_table

ROOT = Path(__file__).resolve().parents[3]
#: The names tests/scenario_table.py gives the kinds of bad input, e.g. OVERSIZE.
KIND_NAMES = {
    name for name, value in vars(scenario_table).items() if isinstance(value, str) and value in scenario_table.BAD_INPUT_KINDS
}


def kinds_tried_in(path: Path) -> set[str]:
    """The kinds of bad input a test module takes from tests/scenario_table.py to try."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "tests.scenario_table":
            found |= {getattr(scenario_table, a.name) for a in node.names if a.name in KIND_NAMES}
    return found


def test_the_bench_runs_a_test_of_every_kind_of_bad_input() -> None:
    tried = set().union(*(kinds_tried_in(ROOT / target.partition("::")[0]) for target in SECURITY))
    assert tried == set(scenario_table.BAD_INPUT_KINDS)


def test_the_bench_prints_the_security_section_it_measured(capfd: pytest.CaptureFixture[str]) -> None:
    code, rows = run(["tests/unit/adapters/slurm/test_backend.py::test_bad_names_are_refused"], ["-p", "no:randomly"],
                     False, "Security only")
    out = capfd.readouterr().out
    assert code == 1 and rows == []  # no scenario ran: the table itself is empty, and says so
    section = out[out.index("security: bad inputs tried"):]
    assert "long and odd node names: 11 tried" in section
    assert "    Slurm command argument 'ALL': refused before any command ran" in section
    assert "oversize bodies: none tried in this run" in section and "nothing lost" in section
