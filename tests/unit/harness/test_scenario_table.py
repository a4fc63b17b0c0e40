"""The security section of the reliability table: every kind listed, and a bad input that lost
something, or whose test failed, fails the session."""

from __future__ import annotations

import pytest

from tests.scenario_table import BAD_INPUT_KINDS, HUGE_EVENT, MALFORMED, Table


def row(kind: str, lost: int | None = 0, passed: bool = True) -> dict[str, object]:
    return {"kind": kind, "what": "x", "got": "rejected", "lost": lost, "test": "t", "passed": passed}


def test_every_kind_is_listed_even_when_none_was_tried() -> None:
    table = Table()
    table.bad_inputs = [row(MALFORMED)]
    lines, problems = table.security()
    assert [line.split(":")[0] for line in lines if not line.startswith(" ")] == list(BAD_INPUT_KINDS)
    assert f"{HUGE_EVENT}: none tried in this run" in lines and problems == []


@pytest.mark.parametrize(
    ("lost", "passed", "problem"),
    [(0, True, False), (None, True, False), (1, True, True), (0, False, True)],
    ids=["nothing lost", "nothing sent beside it", "lost one", "its test failed"],
)
def test_a_bad_input_is_a_problem_when_it_lost_something_or_its_test_failed(
    lost: int | None, passed: bool, problem: bool
) -> None:
    table = Table()
    table.bad_inputs = [row(MALFORMED, lost, passed)]
    assert bool(table.security()[1]) is problem
