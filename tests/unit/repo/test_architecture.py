"""The house holds: the import-linter contracts in pyproject.toml (layers; watchers and workers never
import each other; no SDK below the adapters; the core never imports the rehearsal) pass and are live,
every module of the core sits in a layer, and no import cycle joins the top-level packages, the
modules of the core or the modules of workers/."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
# The process packages and the simulator: the repository's top-level folders, linked into the namespace.
PROCESSES = ("watchers", "workers", "simulator", "demo")
# Outside every layer: the wire servers (a contract of their own) and Alembic's revision scripts.
OUTSIDE_LAYERS = ("remediation.simulator", "remediation.migrations")


def lint_imports(root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """lint-imports on the tree at ``root`` (its pyproject.toml, its packages first on the path)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


@contextmanager
def probe(relpath: str, source: str) -> Iterator[Path]:
    """A copy of the code with one wrong import planted in it; yields the copy's root. The checkout is
    never touched, so no test that reads the source tree beside this one can see the probe."""
    with tempfile.TemporaryDirectory(prefix="contract-probe-") as tmp:
        copy = Path(tmp) / "tree"
        shutil.copytree(ROOT, copy, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", "tests", "docs", "bench", "deploy", "__pycache__", "*.egg-info", ".*_cache"))
        (copy / relpath).write_text(source)
        yield copy


def test_import_contracts_hold() -> None:
    proc = lint_imports()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Contracts: " in proc.stdout and " broken" in proc.stdout and "0 broken" in proc.stdout
    for contract in ("Layers: entry points > services > adapters > domain > ports > settings > vocabulary",
                     "The entry points are independent: they share the core below them, not each other",
                     "The production core never imports the rehearsal"):
        assert contract in " ".join(proc.stdout.split())  # lint-imports wraps long names


@pytest.mark.parametrize(
    ("relpath", "source", "expected"),
    [
        ("remediation/domain/_contract_probe.py", "import celery  # noqa: F401\n",
         "remediation.domain._contract_probe -> celery"),
        ("remediation/domain/_contract_probe.py", "import remediation.services.workflow  # noqa: F401\n",
         "remediation.domain._contract_probe -> remediation.services.workflow"),
        ("remediation/adapters/_contract_probe.py", "import remediation.services.lever_rules  # noqa: F401\n",
         "remediation.adapters._contract_probe -> remediation.services.lever_rules"),
        ("watchers/_contract_probe.py", "import remediation.workers.tasks  # noqa: F401\n",
         "remediation.watchers._contract_probe -> remediation.workers.tasks"),
        ("workers/_contract_probe.py", "import remediation.watchers.kube.watcher  # noqa: F401\n",
         "remediation.workers._contract_probe -> remediation.watchers.kube.watcher"),
        ("remediation/services/_contract_probe.py", "import redis  # noqa: F401\n",
         "remediation.services._contract_probe -> redis"),
        ("remediation/settings/_contract_probe.py", "import remediation.domain.causes  # noqa: F401\n",
         "remediation.settings._contract_probe -> remediation.domain.causes"),
    ],
    ids=["domain-imports-celery", "domain-imports-a-service", "adapter-imports-a-service",
         "watcher-imports-workers", "worker-imports-watchers", "service-imports-redis",
         "settings-import-the-domain"],
)
def test_contracts_catch_a_wrong_import(relpath: str, source: str, expected: str) -> None:
    """Prove each contract is live: the wrong import must break it, naming the import."""
    with probe(relpath, source) as tree:
        proc = lint_imports(tree)
    assert proc.returncode != 0
    assert expected in proc.stdout


@pytest.mark.parametrize(
    ("relpath", "module"),
    [("remediation/services/_contract_probe.py", "remediation.rehearsal.run"),
     ("workers/_contract_probe.py", "remediation.rehearsal.trace")],
    ids=["service-imports-the-rehearsal", "worker-imports-the-rehearsal"],
)
def test_the_core_never_imports_the_rehearsal(relpath: str, module: str) -> None:
    """A production module that imports the rehearsal breaks its own contract, not only the layers."""
    with probe(relpath, f"import {module}  # noqa: F401\n") as tree:
        proc = lint_imports(tree)
    assert proc.returncode != 0
    assert "The production core never imports the rehearsal BROKEN" in " ".join(proc.stdout.split())
    importer = relpath.removesuffix(".py").replace("/", ".")
    assert f"{importer} -> {module}" in proc.stdout


def layer_entries() -> list[str]:
    """Every module or package the layers contract in pyproject.toml names."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in config if c["name"].startswith("Layers:"))
    return [name.strip() for layer in layers for name in re.split(r"[|:]", layer)]


def picture_layers() -> list[set[str]]:
    """The layers docs/architecture.md draws: one line per layer, its modules after the bar."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## The house: layers, imports pointing down", 1)[1]
    block = section.split("```", 2)[1]
    return [{name.strip() for name in line.split("│", 1)[1].split("·")} for line in block.splitlines() if "│" in line]


def test_the_layer_picture_is_the_contract() -> None:
    """One picture of the layers is kept (README links to it), and it is the contract, top to bottom."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in config if c["name"].startswith("Layers:"))
    contract = [{name.strip().removeprefix("remediation.") for name in re.split(r"[|:]", layer)} for layer in layers]
    assert picture_layers() == contract
    readme = (ROOT / "README.md").read_text()
    assert "docs/architecture.md#the-house-layers-imports-pointing-down" in readme
    assert "│" not in readme  # no second picture to drift


def test_every_core_module_sits_in_a_layer() -> None:
    """A module dropped straight into remediation/, or into a feature package without its layer, would
    escape every layer contract. Package ``__init__`` modules hold no code of their own."""
    entries = layer_entries()
    core = grimp.build_graph("remediation", cache_dir=None)
    packages = {m for m in core.modules if core.find_children(m)}
    stray = sorted(m for m in core.modules - packages
                   if not any(m == e or m.startswith(e + ".") for e in (*entries, *OUTSIDE_LAYERS)))
    assert stray == []


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph, or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("remediation", cache_dir=None)


def _group(module: str) -> str:
    """The process package a module belongs to, or "core"."""
    part = module.split(".")[1] if "." in module else ""
    return part if part in PROCESSES else "core"


def test_no_cycle_among_the_core_and_the_processes(graph: grimp.ImportGraph) -> None:
    groups = ("core", *PROCESSES)
    edges: dict[str, set[str]] = {g: set() for g in groups}
    for m in graph.modules:
        edges[_group(m)] |= {_group(i) for i in graph.find_modules_directly_imported_by(m)
                             if i.startswith("remediation.")} - {_group(m)}
    assert _cycle(edges) is None
    assert edges["core"] == set()  # the core imports none of the processes


def test_no_cycle_within_workers(graph: grimp.ImportGraph) -> None:
    modules = set(graph.find_descendants("remediation.workers")) | {"remediation.workers"}
    edges = {m: graph.find_modules_directly_imported_by(m) & modules for m in modules}
    assert _cycle(edges) is None


def test_no_cycle_among_the_modules_of_the_core() -> None:
    """An import inside a function hides a circle from the layers contract (both ends sit in one
    layer) but not from the running code. Imports made only for the type checker never run."""
    core = grimp.build_graph("remediation", cache_dir=None, exclude_type_checking_imports=True)
    modules = {m for m in core.modules if _group(m) == "core"}
    assert _cycle({m: core.find_modules_directly_imported_by(m) & modules for m in modules}) is None


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
