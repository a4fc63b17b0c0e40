"""A note in the reliability table states only what its test counted.

A note such as "0 VM actions while open", written as text, claims a figure whether or not anything was
measured. Every figure in a note passed to ``Figures.record`` must come from a value the test holds
(a ``{count}``), never from the note's literal text, whether the note is written in the ``record`` call
or by a lambda a scenario helper calls; this test reads the reliability scenarios' source.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: A figure written into the text: a number standing alone ("0 VM actions", "3/4", "lease 6 s").
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?!\w)")


def notes_written(tree: ast.AST) -> list[ast.expr]:
    """Every expression that writes a note: the ``notes=`` of a ``record(...)`` call, and a lambda that
    returns text (a scenario helper takes one to write its row's notes, e.g. ``describe_outage``)."""
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "record":
            found += [kw.value for kw in node.keywords if kw.arg == "notes"]
        elif isinstance(node, ast.Lambda) and isinstance(node.body, ast.JoinedStr | ast.Constant | ast.BinOp):
            found.append(node.body)
    return found


def literal_figures(source: str) -> list[str]:
    """The literal parts of every note written in ``source`` (:func:`notes_written`) that write a figure."""
    found = []
    for note in notes_written(ast.parse(source)):
        for part in ast.walk(note):
            if isinstance(part, ast.Constant) and isinstance(part.value, str) and FIGURE.search(part.value):
                found.append(f"line {part.lineno}: {part.value!r}")
    return found


@pytest.mark.parametrize("path", sorted((ROOT / "tests/reliability").glob("test_*.py")), ids=lambda p: p.name)
def test_every_figure_in_a_note_was_counted(path: Path) -> None:
    assert literal_figures(path.read_text()) == []


@pytest.mark.parametrize(
    ("notes", "bad"),
    [
        ('f"{n} drains while open, 0 VM actions while open"', True),
        ('f"3/4 nodes failed; window {w}s"', True),
        ('"resumed by the probe after 3 answers"', True),
        ('f"{n} drains while open, {len(vm)} VM actions while open; mean {m:.1f}s"', False),
    ],
    ids=["zero written in", "fraction written in", "plain string", "all counted"],
)
def test_a_figure_written_into_a_note_is_caught(notes: str, bad: bool) -> None:
    assert bool(literal_figures(f"figures.record(notes={notes})")) is bad


@pytest.mark.parametrize(
    ("helper", "bad"),
    [
        ('outage(lambda down, up: f"down {up - down:.1f}s; recovery = server up to all 6 succeeded")', True),
        ('outage(lambda down, up, n: f"down {up - down:.1f}s; recovery = server up to all {n} succeeded")', False),
    ],
    ids=["count written in", "count passed in"],
)
def test_a_figure_written_into_a_helper_s_note_is_caught(helper: str, bad: bool) -> None:
    assert bool(literal_figures(helper)) is bad
