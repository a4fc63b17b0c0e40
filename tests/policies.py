"""The policy a test runs under: the shipped one, unless the test asks for another by name.

Every test, and every process a test starts, decides with the policy the project ships (cause
classification and lemon scoring on). A test that needs another policy names it beside itself and says
why::

    @pytest.mark.policy("naive-ladder", why="counts one VM restart per rung of restart, reimage")
    def test_...

The name is a file in ``deploy/policies/`` (``naive-ladder`` is ``deploy/policies/naive-ladder.yaml``,
also the rehearsal's baseline). Its settings are laid over the test's environment as ``REMEDIATION_``
variables, so in-process settings and the worker processes a test starts (they copy
:func:`policy_env`, see ``tests/integration/workerproc.py``) decide alike. A mark on a module (its
``pytestmark``) applies before the module's own fixtures start their processes; a mark on a test
applies to that test's fixtures and body only, so a module whose workers outlive one test marks the
module.

The reliability table shows each row's policy (``tests/scenario_table.py``), read from the same mark.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

MARK = "policy"
SHIPPED = "shipped"
POLICY_DIR = Path(__file__).resolve().parents[1] / "deploy" / "policies"


@cache
def policy_settings(name: str) -> dict[str, str]:
    """The ``REMEDIATION_`` variables of policy file ``name``: nested keys joined by ``__``, lists as JSON."""
    path = POLICY_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in POLICY_DIR.glob("*.yaml"))
        raise pytest.UsageError(f"no policy {name!r} in deploy/policies (known: {known})")
    return dict(_flatten(yaml.safe_load(path.read_text()), "REMEDIATION"))


def _flatten(tree: dict[str, Any], prefix: str) -> Iterator[tuple[str, str]]:
    for key, value in tree.items():
        name = f"{prefix}_{key.upper()}" if prefix == "REMEDIATION" else f"{prefix}__{key.upper()}"
        if isinstance(value, dict):
            yield from _flatten(value, name)
        else:
            yield name, json.dumps(value) if isinstance(value, list | bool) else str(value)


def policy_of(node: pytest.Item | pytest.Collector) -> str:
    """The name of the policy ``node`` runs under (its closest ``policy`` mark, else the shipped one)."""
    mark = node.get_closest_marker(MARK)
    if mark is None:
        return SHIPPED
    if not mark.kwargs.get("why"):
        raise pytest.UsageError(f"{node.nodeid}: @pytest.mark.policy({mark.args[0]!r}) must say why=")
    return str(mark.args[0])


#: The name of the policy in force in this process's environment (unset: the shipped one).
IN_FORCE = "NODE_REMEDIATION_TEST_POLICY"


def policy_env() -> dict[str, str]:
    """The policy variables in force now, for the environment of a process a test starts."""
    name = os.environ.get(IN_FORCE, SHIPPED)
    return {} if name == SHIPPED else policy_settings(name)


def _apply(node: pytest.Item | pytest.Collector, monkeypatch: pytest.MonkeyPatch) -> None:
    name = policy_of(node)
    if name != SHIPPED:
        monkeypatch.setenv(IN_FORCE, name)
        for key, value in policy_settings(name).items():
            monkeypatch.setenv(key, value)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}(name, why): run under deploy/policies/<name>.yaml, not the "
                                       "shipped policy, for the reason given")


@pytest.fixture(scope="module", autouse=True)
def _module_policy(request: pytest.FixtureRequest) -> Iterator[None]:
    """A module's mark, in force before the module's own fixtures start anything."""
    with pytest.MonkeyPatch.context() as mp:
        _apply(request.node, mp)
        yield


@pytest.fixture(autouse=True)
def _test_policy(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test's (or its class's) mark, for its own fixtures and body."""
    _apply(request.node, monkeypatch)
