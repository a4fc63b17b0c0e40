"""The newcomer's first command: `remediation demo` runs the real watchers, workers and adapters against
the wire-protocol simulator (kube-apiserver, GCE, Azure, slurmrestd) with SQLite and the memory broker,
serves the dashboard while it runs, and leaves the facts it promises in the database."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
HAPPY_STEPS = {"slurm_drain", "k8s_cordon", "k8s_evict", "vm_restart", "verify", "return"}


def test_demo_runs_the_whole_loop_against_the_simulator(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")}
    env["COLUMNS"] = "200"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from workers.cli import main; main()", "demo", "--workdir", str(tmp_path),
         "--timeout", "150", "--port", "0"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    answers: list[tuple[str, int]] = []
    try:
        deadline = time.monotonic() + 60
        found = None
        while found is None and time.monotonic() < deadline and proc.poll() is None:
            found = re.search(
                r"dashboard: (http://127\.0\.0\.1:\d+)\s+\(admin token: (\S+)\)", "".join(lines)
            )
            time.sleep(0.2)
        assert found, "".join(lines)
        url, token = found.groups()
        time.sleep(5)  # mid-run: remediations are in flight
        auth = {"Authorization": f"Bearer {token}"}
        for path in ("/api/v1/overview", "/api/v1/remediations", "/healthz"):
            answers.append((path, httpx.get(url + path, headers=auth, timeout=10).status_code))
        unauthenticated = httpx.get(url + "/api/v1/overview", timeout=10).status_code
        assert proc.wait(timeout=240) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=5)
    assert answers == [("/api/v1/overview", 200), ("/api/v1/remediations", 200), ("/healthz", 200)]
    assert unauthenticated == 401

    db = sqlite3.connect(tmp_path / "remediation.db")  # the embedded default is SQLite
    rems = {
        rid: (node, status) for rid, node, status in db.execute("select id, node, status from remediations")
    }
    done = {
        rid: {step for (step,) in db.execute(
            "select step from remediation_steps where remediation_id = ? and status = 'done'", (rid,))}
        for rid in rems
    }  # fmt: skip
    succeeded = [
        rid for rid, (_, status) in rems.items() if status == "succeeded" and HAPPY_STEPS <= done[rid]
    ]
    assert len(succeeded) >= 5, rems
    assert [node for node, status in rems.values() if status == "quarantined"] == ["gpu-node-9"]
    assert not [r for r in rems.values() if r[1] in ("running", "waiting")]
    audit = [a for (a,) in db.execute("select action from audit_log")]
    assert audit.count("breaker_open") >= 1 and audit.count("breaker_closed") >= 1
    nodes = {node for node, _ in rems.values()}
    assert "gpu-node-12" not in nodes  # the maintenance drain is recorded, never remediated
    assert "gpu-node-5" not in nodes  # the flapping Node never held NotReady long enough
    maintenance = db.execute(
        "select decision, decision_reason from events where node = 'gpu-node-12' and kind = 'unhealthy'"
    ).fetchall()
    assert maintenance and all(d == "record" and "ignore list" in why for d, why in maintenance)
    sources = {s for (s,) in db.execute("select distinct source from events")}
    assert {"slurm", "kubernetes"} <= sources  # both real watchers published
    assert "Traceback" not in "".join(lines)
