"""The suite runs the shipped policy; a test asks for another by name (tests/policies.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from remediation.settings import load_settings
from tests.policies import POLICY_DIR, SHIPPED, policy_env, policy_of, policy_settings

ROOT = Path(__file__).resolve().parents[3]
SWITCHES = ("REMEDIATION_POLICY__FAULTS__CLASSIFY", "REMEDIATION_POLICY__LEMON__ENABLED")


def test_an_unmarked_test_decides_with_the_shipped_policy() -> None:
    settings = load_settings()
    assert settings.policy.faults.classify and settings.policy.lemon.enabled
    assert policy_env() == {}


@pytest.mark.policy("naive-ladder", why="shows the mark laying the naive ladder's file over the settings")
def test_a_marked_test_decides_with_the_policy_it_names(request: pytest.FixtureRequest) -> None:
    settings = load_settings()
    written = yaml.safe_load((POLICY_DIR / "naive-ladder.yaml").read_text())
    assert settings.policy.faults.classify is written["policy"]["faults"]["classify"] is False
    assert settings.policy.lemon.enabled is written["policy"]["lemon"]["enabled"] is False
    assert settings.workflow.ladder == written["workflow"]["ladder"]
    assert settings.incidents.enabled is written["incidents"]["enabled"]
    assert policy_of(request.node) == "naive-ladder"
    assert policy_env() == policy_settings("naive-ladder")  # what a worker process started now gets


def test_the_mark_is_gone_after_its_test() -> None:
    assert load_settings().policy.faults.classify
    assert policy_env() == {}


class _Node:
    nodeid = "tests/x.py::test_x"

    def __init__(self, mark: pytest.Mark | None) -> None:
        self.mark = mark

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return self.mark


def test_a_mark_must_say_why_and_name_a_policy_file() -> None:
    assert policy_of(_Node(None)) == SHIPPED  # type: ignore[arg-type]
    with pytest.raises(pytest.UsageError, match="why="):
        policy_of(_Node(pytest.mark.policy("naive-ladder").mark))  # type: ignore[arg-type]
    with pytest.raises(pytest.UsageError, match="no policy 'no-such'"):
        policy_settings("no-such")


def test_no_suite_wide_setting_turns_the_shipped_policy_off() -> None:
    """The switches are set only through a named policy's mark, never for the whole suite."""
    found = []
    here = Path(__file__).resolve()
    for path in [*(ROOT / "tests").rglob("*.py"), ROOT / "scripts" / "test.sh", ROOT / ".ci" / "run"]:
        if path == here:  # names the switches to look for them
            continue
        text = path.read_text()
        if path.suffix == ".py":
            strings = {n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant)}
            found += [f"{path.relative_to(ROOT)}: {s}" for s in strings if s in SWITCHES]
        else:
            found += [f"{path.relative_to(ROOT)}: {s}" for s in SWITCHES if s in text]
    assert found == []
