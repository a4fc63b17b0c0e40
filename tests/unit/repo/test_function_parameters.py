"""The function budget's parameter half: at most six parameters, and keyword-only after the third.

A call with more than three positional arguments cannot be read without the signature at hand, and two
of the same type swap silently; past six, a function does more than one thing or wants a small record of
what belongs together (docs/architecture.md, "Size and words"). ``self`` and ``cls`` do not count.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TREES = ("remediation", "watchers", "workers", "simulator", "demo")
# Top-level folders imported under the namespace (remediation/watchers -> ../watchers).
LINKED = ("watchers", "workers", "simulator", "demo")
MAX_PARAMETERS = 6
MAX_POSITIONAL = 3
MAX_LINES = 60

# Each one a function the rules would refuse, with why it may stay so.
EXCEPTIONS: dict[str, str] = {
    "remediation.settings.loader:Settings.settings_customise_sources":
        "overrides pydantic-settings' hook, whose signature names its five sources positionally",
    "remediation.cli.read:stats": "a typer command: each parameter is one command-line option, filled by typer",
    "remediation.cli.reliability:reliability_cmd": "a typer command: each parameter is one command-line option",
    "remediation.cli.simulate:simulate": "a typer command: each parameter is one command-line option",
    "remediation.cli.read:events_tail": "a typer command: each parameter is one command-line option",
    "remediation.cli.read:remediations_list": "a typer command: each parameter is one command-line option",
    "remediation.api.routes:get_remediations": "a FastAPI route: each parameter is one query parameter, filled by FastAPI",
    "remediation.api.routes:get_stats": "a FastAPI route: each parameter is one query parameter, filled by FastAPI",
    "remediation.services.audit:audit": "appends one AuditLog row; its keywords are the row's columns",
    "remediation.simulator.kube.api:KubeAPIServer.add_node": "builds a fake Node; each keyword is one optional field of it",
    "remediation.simulator.kube.api:KubeAPIServer.add_pod": "builds a fake Pod; each keyword is one optional field of it",
}



@dataclass(frozen=True)
class Function:
    name: str  # module:Qual.name, nested functions as outer.<locals>.inner
    lines: int
    parameters: int
    positional: int


def _counted(node: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> tuple[int, int]:
    """(parameters, positional parameters), leaving out a method's ``self`` or ``cls``."""
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
    if in_class and not static and positional and positional[0].arg in ("self", "cls"):
        positional = positional[1:]
    return len(positional) + len(args.kwonlyargs), len(positional)


def _walk(node: ast.AST, prefix: str, in_class: bool) -> Iterator[tuple[str, ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + child.name, child, in_class
            yield from _walk(child, f"{prefix}{child.name}.<locals>.", False)
        elif isinstance(child, ast.ClassDef):
            yield from _walk(child, f"{prefix}{child.name}.", True)
        else:
            yield from _walk(child, prefix, in_class)


def functions(root: Path, trees: tuple[str, ...] = TREES) -> list[Function]:
    """Every function and method under ``trees``, with its length and parameter counts."""
    out = []
    for tree in trees:
        for path in sorted((root / tree).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            module = ".".join(("remediation", *parts) if parts[0] in LINKED else parts).removesuffix(".__init__")
            for name, node, in_class in _walk(ast.parse(path.read_text(encoding="utf-8")), f"{module}:", False):
                assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                parameters, positional = _counted(node, in_class)
                out.append(Function(name, node.end_lineno - node.lineno + 1 if node.end_lineno else 1,
                                    parameters, positional))
    return out


def over_budget(fn: Function) -> bool:
    return fn.parameters > MAX_PARAMETERS or fn.positional > MAX_POSITIONAL


def offenders(found: list[Function]) -> list[str]:
    """What breaks the parameter rules, less the exceptions."""
    return [f"{fn.name}: {fn.parameters} parameters, {fn.positional} positional" for fn in found
            if over_budget(fn) and fn.name not in EXCEPTIONS]


@pytest.fixture(scope="module")
def found() -> dict[str, Function]:
    return {fn.name: fn for fn in functions(ROOT)}


def test_every_function_keeps_the_parameter_budget(found: dict[str, Function]) -> None:
    assert offenders(list(found.values())) == []


@pytest.mark.parametrize("name", sorted(EXCEPTIONS))
def test_each_exception_still_exists_and_still_needs_it(found: dict[str, Function], name: str) -> None:
    assert name in found, f"{name} is gone: drop it from EXCEPTIONS"
    assert over_budget(found[name]), f"{name} keeps the budget now: drop it from EXCEPTIONS"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f(a, b, c, *, d, e, g): ...", []),
        ("def f(a, b, c, d): ...", ["m:f: 4 parameters, 4 positional"]),
        ("def f(a, *, b, c, d, e, g, h): ...", ["m:f: 7 parameters, 1 positional"]),
        ("class C:\n    def m(self, a, b, c): ...", []),
        ("class C:\n    @classmethod\n    def m(cls, a, b, c, d): ...", ["m:C.m: 4 parameters, 4 positional"]),
        ("class C:\n    @staticmethod\n    def m(self, a, b, c): ...", ["m:C.m: 4 parameters, 4 positional"]),
        ("def f(cls, a, b, c): ...", ["m:f: 4 parameters, 4 positional"]),
        ("def f():\n    def g(a, b, c, d): ...", ["m:f.<locals>.g: 4 parameters, 4 positional"]),
    ],
    ids=["keyword-only", "four-positional", "seven", "self", "cls", "staticmethod", "cls-outside-a-class",
         "nested"],
)
def test_the_check_counts_as_the_rules_say(tmp_path: Path, source: str, expected: list[str]) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(source)
    found = [Function(fn.name.removeprefix("pkg."), fn.lines, fn.parameters, fn.positional)
             for fn in functions(tmp_path, ("pkg",))]
    assert offenders(found) == expected
