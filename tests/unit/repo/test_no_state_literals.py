"""No state is compared with a string literal in the domain, the services or the workers.

Every state the code branches on has an enum, typed down to its column (docs/architecture.md, "States
are enums down to the column"); this test keeps a ``row.status == "done"`` from coming back.
"""

from __future__ import annotations

import ast
from enum import StrEnum
from pathlib import Path

from remediation.domain.events import EventKind, Source
from remediation.domain.policy import DecisionKind
from remediation.domain.statemachine import NodeStatus, RemediationStatus, Step
from remediation.domain.states import AuditAction, IncidentStatus, StepStatus, ValidationOutcome
from remediation.profiles.settings import Mode

ROOT = Path(__file__).resolve().parents[3]
TREES = ("remediation/domain", "remediation/services", "remediation/db", "remediation/rehearsal", "workers",
         "watchers")
STATE_ENUMS: tuple[type[StrEnum], ...] = (
    RemediationStatus, NodeStatus, Step, StepStatus, ValidationOutcome, IncidentStatus, Mode, Source, EventKind,
    DecisionKind, AuditAction,
)
STATE_VALUES = frozenset(m.value for enum in STATE_ENUMS for m in enum)
COMPARISONS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)

#: (file, line text) -> why the literal is not a state.
ALLOWED = {
    ("remediation/domain/jobsafety.py", 'policy in ("requeue", "cancel")'):
        "a choice of the workflow.on_jobs_timeout setting, not a state; its word only looks like a lever's",
    ("remediation/services/workflow.py", 'component == "kubernetes"'):
        "the subsystem a typed error names (RemediationError.component), not a state",
    ("remediation/rehearsal/compare.py", 'k != "quarantined"'):
        "a simulate report's field name, not a state",
}


def _constants(node: ast.expr) -> list[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [c.value for c in items if isinstance(c, ast.Constant) and isinstance(c.value, str)]


def _sides(node: ast.AST) -> list[ast.expr]:
    """What ``node`` compares: both sides of ``==``, ``!=``, ``in``, ``not in``, and the arguments of
    SQLAlchemy's ``column.in_(...)`` / ``column.not_in(...)``."""
    if isinstance(node, ast.Compare) and any(isinstance(op, COMPARISONS) for op in node.ops):
        return [node.left, *node.comparators]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("in_", "not_in"):
        return list(node.args)
    return []


def literal_states(source: str) -> list[tuple[int, str]]:
    """(line, code) of every comparison of a state-valued string literal in ``source``."""
    return [(node.lineno, ast.unparse(node)) for node in ast.walk(ast.parse(source))
            if any(v in STATE_VALUES for side in _sides(node) for v in _constants(side))]


def _allowed(path: str, line: str) -> bool:
    return any(path == p and snippet in line for p, snippet in ALLOWED)


def test_no_state_is_compared_with_a_string() -> None:
    offenders = []
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            text = path.read_text(encoding="utf-8")
            lines = text.splitlines()
            offenders += [f"{rel}:{n}: {code}" for n, code in literal_states(text)
                          if not _allowed(rel, lines[n - 1])]
    assert not offenders, "compare with the enum member, not its text:\n" + "\n".join(offenders)


def test_the_scan_sees_each_form() -> None:
    planted = 'if row.status == "done" or rem.status in ("running", "x") or "failed" != o or s not in {"off"}: pass'
    assert len(literal_states(planted)) == 4
    assert [n for n, _ in literal_states("a == 'done'\nb in ('quarantined',)\nc == 'no-state'\n")] == [1, 2]
    assert len(literal_states("q.where(Row.status.in_(('started', 'waiting')), Row.kind.not_in(['x']))")) == 1


def test_every_allowance_still_matches_a_line() -> None:
    for path, snippet in ALLOWED:
        assert snippet in (ROOT / path).read_text(encoding="utf-8"), f"stale allowance in {path}: {snippet}"
