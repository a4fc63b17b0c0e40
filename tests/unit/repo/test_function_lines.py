"""Every function in the service's trees keeps to the function budget's length: 60 lines at most.

A function is counted from its ``def`` to its last line: decorators are not counted, the docstring is.
Methods and nested functions are counted too, each on its own. A function over the budget is split
along its phases into named helpers. The few exceptions are listed with their reason, and each is
checked to still be over the budget, so the list cannot go stale (CONTRIBUTING.md, "Function budget").
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TREES = ("remediation", "watchers", "workers", "simulator", "demo", "migrations")
MAX_LINES = 60

# "path::qualified name" -> why it may stay over the budget.
EXCEPTIONS = {
    "migrations/versions/0001_initial_schema.py::upgrade": (
        "a migration is a frozen record of a schema; splitting it changes nothing a reader needs"
    ),
}

Function = ast.FunctionDef | ast.AsyncFunctionDef


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, Function]]:
    """Every function under ``tree``, with its qualified name (``Class.method``, ``outer.inner``)."""
    found: list[tuple[str, Function]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                found.append((name, node))
            found += _functions(node, f"{name}.")
        else:
            found += _functions(node, prefix)
    return found


def long_functions(root: Path, trees: tuple[str, ...] = TREES, limit: int = MAX_LINES) -> dict[str, int]:
    """Every function in ``trees`` under ``root`` longer than ``limit`` lines, by "path::qualified
    name", with its length."""
    out = {}
    for tree in trees:
        for path in sorted((root / tree).rglob("*.py")):
            module = ast.parse(path.read_text(encoding="utf-8"))
            for name, node in _functions(module):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    out[f"{path.relative_to(root).as_posix()}::{name}"] = lines
    return out


def test_no_function_runs_over_the_budget() -> None:
    over = {name: lines for name, lines in long_functions(ROOT).items() if name not in EXCEPTIONS}
    assert over == {}, f"split these along their phases (at most {MAX_LINES} lines each): {over}"


def test_every_exception_is_still_over_the_budget() -> None:
    assert sorted(set(EXCEPTIONS) - set(long_functions(ROOT))) == []


def _body(lines: int) -> str:
    return "".join(f"    x{i} = {i}\n" for i in range(lines))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (f"def f():\n{_body(59)}", {}),
        (f"def f():\n{_body(60)}", {"pkg/m.py::f": 61}),
        (f"@a\n@b(\n    1,\n)\ndef f():\n{_body(59)}", {}),
        (f'def f():\n    """Say what.\n\n    Why.\n    """\n{_body(57)}', {"pkg/m.py::f": 62}),
        (f"class C:\n    async def m(self):\n{_body(60).replace('    ', '        ')}", {"pkg/m.py::C.m": 61}),
        (f"def f():\n    def g():\n{_body(60).replace('    ', '        ')}", {"pkg/m.py::f": 62, "pkg/m.py::f.g": 61}),
    ],
    ids=["60-fits", "61-over", "decorators-not-counted", "docstring-counted", "method-by-class", "nested-too"],
)
def test_the_check_counts_from_def_to_last_line(tmp_path: Path, source: str, expected: dict[str, int]) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(source)
    assert long_functions(tmp_path, ("pkg",)) == expected
