"""Wait budgets stretch with the machine's slowness, and only within bounds (tests/pace.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import pace

ROOT = Path(__file__).resolve().parents[3]

PROBE = '''
import pytest

@pytest.mark.timeout(7)
def test_marked(request):
    print("marked", request.node.get_closest_marker("timeout").args[0])

def test_default(request):
    print("default", request.node.get_closest_marker("timeout").args[0])
'''


@pytest.mark.parametrize(("set_to", "factor"), [("2.5", 2.5), ("0.4", 1.0), ("9", pace.MOST), ("fast", 1.0)])
def test_the_factor_is_read_from_the_run_and_kept_in_bounds(
    monkeypatch: pytest.MonkeyPatch, set_to: str, factor: float
) -> None:
    monkeypatch.setenv(pace.ENV, set_to)
    assert pace.slowness() == factor
    assert pace.budget(60) == 60 * factor
    before = time.monotonic()
    assert before + 10 * factor <= pace.within(10) <= time.monotonic() + 10 * factor


def test_this_machine_is_measured_within_bounds() -> None:
    assert 1.0 <= pace.measure() <= pace.MOST


def test_a_run_stretches_each_tests_timeout_its_own_or_the_configured_one(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {**os.environ, pace.ENV: "2", "PYTHONPATH": str(ROOT)}
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.pace", "-p", "no:cacheprovider", "-c", os.devnull,
         "--rootdir", str(tmp_path), "--timeout", "30", "-s", str(tmp_path / "test_probe.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "marked 14.0" in ran.stdout and "default 60.0" in ran.stdout, ran.stdout
    assert "wait budgets stretched x2.00" in ran.stdout
