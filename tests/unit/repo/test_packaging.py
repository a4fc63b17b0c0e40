"""The process packages install under the project's namespace: the repository's top-level folders
(watchers/, workers/, simulator/, demo/, migrations/) are linked into remediation/, the wheel ships
remediation only, and no code imports them by their bare, generic names (a second copy of a module,
and a name another distribution may take). The wheel itself: tests/integration/test_demo.py.
Why: docs/architecture.md#the-house-layers-imports-pointing-down"""

from __future__ import annotations

import ast
import os
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LINKED = ("watchers", "workers", "simulator", "demo", "migrations")
SCANNED = ("remediation", *LINKED, "tests", "bench", "scripts")


@pytest.mark.parametrize("name", LINKED)
def test_each_top_level_folder_is_linked_into_the_namespace(name: str) -> None:
    link = ROOT / "remediation" / name
    assert link.is_symlink() and link.resolve() == (ROOT / name).resolve()
    assert (ROOT / name / "__init__.py").is_file()


def test_the_wheel_ships_the_namespace_only() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["remediation*"]


def bare_imports(path: Path, root: Path = ROOT) -> list[str]:
    """Where ``path`` imports one of the linked packages by its bare name."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
        found += [f"{path.relative_to(root)}:{node.lineno} {n}" for n in names if n.split(".")[0] in LINKED]
    return found


def sources() -> list[Path]:
    """Every Python file once: the links inside remediation/ are not followed."""
    return [Path(d) / f for top in SCANNED for d, _, files in os.walk(ROOT / top) for f in files if f.endswith(".py")]


def test_nothing_imports_a_linked_package_by_its_bare_name() -> None:
    assert [hit for f in sources() for hit in bare_imports(f)] == []


def test_the_check_finds_a_bare_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import workers.tasks\nfrom watchers.kube import watcher\nimport remediation.workers\n")
    assert [h.split(" ", 1)[1] for h in bare_imports(probe, tmp_path)] == ["workers.tasks", "watchers.kube"]
