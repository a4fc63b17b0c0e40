"""bench/RESULTS.md gives a verdict for every goal it names, met or not.

A goal quoted beside a figure that misses it, with nothing said, reads as met. Every benchmark prints
its goals through ``bench.common.goal`` (``goal WHAT (MEASURED): met`` or ``: not met``), and
bench/results.py copies that output into RESULTS.md; this test reads the file as committed.
"""

from __future__ import annotations

import re

import pytest

from bench.common import goal
from bench.results import RESULTS, SECTION

GOAL = re.compile(r"\bgoals?\b", re.I)
VERDICT = re.compile(r": (met|not met)$")


def goals_without_verdict(text: str) -> list[str]:
    """The lines of the benchmarks' recorded output that name a goal and end in no verdict."""
    bad = []
    for section in SECTION.finditer(text):
        fenced = section.group(0).split("```text\n", 1)[-1].split("\n```", 1)[0]
        bad += [
            f"{section['name']}: {line.strip()}"
            for line in fenced.splitlines()
            if GOAL.search(line) and not VERDICT.search(line.rstrip())
        ]
    return bad


def test_every_goal_in_results_md_has_a_verdict() -> None:
    text = RESULTS.read_text()
    assert SECTION.search(text), "no benchmark section found"
    assert goals_without_verdict(text) == []


@pytest.mark.parametrize(
    ("line", "bad"),
    [
        ("  gate overhead per remediation  p50 5.08s  max 5.11s   (goal <= 5 s)", True),
        ("  goal: overhead <= 2 s per remediation: max 1.73 s meets it", True),
        ("256 x 54 d  events  5.8  35.8x faster (goal >= 10x)", True),
        ("  " + goal("overhead <= 5 s per remediation", "max 5.11s", False), False),
        ("  " + goal(">= 10x faster", "35.8x", True), False),
    ],
    ids=["goal in brackets", "meets it", "goal in a note", "not met", "met"],
)
def test_a_goal_without_met_or_not_met_is_caught(line: str, bad: bool) -> None:
    text = f"<!-- bench:x -->\n## x\n\n```text\n{line}\n```\n<!-- /bench:x -->\n"
    assert bool(goals_without_verdict(text)) is bad


def test_the_goal_line_says_met_or_not_met() -> None:
    assert goal("<= 5 s", "max 5.11s", False) == "goal <= 5 s (max 5.11s): not met"
    assert goal("<= 60 s", "42.6 s", True) == "goal <= 60 s (42.6 s): met"
