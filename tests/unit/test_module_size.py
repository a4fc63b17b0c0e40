"""No module in remediation/, watchers/ or workers/ runs over 400 lines.

Near that size a module holds more than one responsibility and is split by responsibility, each part
opening with a docstring that says why it stands alone (docs/architecture.md); this test keeps a split
from growing back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREES = ("remediation", "watchers", "workers")
MAX_LINES = 400


def oversized(root: Path, limit: int = MAX_LINES) -> list[str]:
    """Every ``.py`` file under ``root`` longer than ``limit`` lines, with its length."""
    out = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            out.append(f"{path.relative_to(root.parent)}: {lines} lines")
    return out


@pytest.mark.parametrize("tree", TREES)
def test_no_module_over_the_limit(tree: str) -> None:
    assert oversized(ROOT / tree) == []


def test_the_check_finds_a_long_module(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "short.py").write_text("x = 1\n" * MAX_LINES)
    (pkg / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert oversized(pkg) == [f"pkg/long.py: {MAX_LINES + 1} lines"]
