"""A note in the reliability table states only what its test counted.

A note such as "0 VM actions while open", written as text, claims a figure whether or not anything was
measured. Every figure in a note passed to ``Figures.record`` must come from a value the test holds
(a ``{count}``), never from the note's literal text; this test reads the reliability scenarios' source.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: A figure written into the text: a number standing alone ("0 VM actions", "3/4", "lease 6 s").
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?!\w)")


def literal_figures(source: str) -> list[str]:
    """The literal parts of every ``record(notes=...)`` in ``source`` that write a figure."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "record"
        ):
            continue
        for kw in node.keywords:
            if kw.arg != "notes":
                continue
            for part in ast.walk(kw.value):
                if (
                    isinstance(part, ast.Constant)
                    and isinstance(part.value, str)
                    and FIGURE.search(part.value)
                ):
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
