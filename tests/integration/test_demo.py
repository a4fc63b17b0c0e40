"""The newcomer's first command: `remediation demo` runs the loop on the embedded default (SQLite, the
memory broker, the simulated cluster) with no servers, and tells the story it promises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_the_whole_loop_without_servers(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")}
    env["COLUMNS"] = "200"
    proc = subprocess.run(
        [sys.executable, "-c", "from workers.cli import main; main()", "demo", "--workdir", str(tmp_path),
         "--timeout", "150"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert (tmp_path / "remediation.db").exists()  # the embedded default is SQLite
    assert re.search(r"succeeded: (\d+), quarantined: \['gpu-node-9'\]", out), out
    assert int(re.search(r"succeeded: (\d+)", out).group(1)) == 10
    assert "breaker opened 1x / closed 1x" in out
    assert "maintenance drain on gpu-node-12: human reason matches ignore list" in out
    detection = float(re.search(r"detection \(fault -> event recorded\): p50 ([\d.]+)s", out).group(1))
    assert detection < 2.0
    assert "Warning" not in out
