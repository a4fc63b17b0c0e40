"""Every process logs one format: with ``log_format: json`` each stderr line is a JSON object with
``level`` and ``message``, from the watchers, the worker, beat, the API and the CLI alike; a workflow
step's line carries ``remediation_id``, ``node``, ``step``, ``attempt`` and ``outcome``.

Each process is started for real (``python -m ...`` with stderr to a file) and stopped with SIGTERM;
the barrier for "it has logged" is a known line appearing in its stderr, never a sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from remediation.db.models import Node
from remediation.db.session import make_engine, make_session_factory
from remediation.settings import DatabaseSettings
from remediation.simulator.kube.api import KubeAPIServer
from tests.conftest import REDIS_URL
from tests.integration.apiproc import ROOT, ApiProcess, base_env
from tests.integration.workerproc import celery_worker_argv, worker_env
from tests.pace import within

JSON = {"REMEDIATION_LOG_FORMAT": "json"}
STEP_FIELDS = ("remediation_id", "node", "step", "attempt", "outcome")


def records(text: str) -> list[dict[str, Any]]:
    """Every stderr line as a JSON record; a line that is not one fails the test with the line."""
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rest = "\n".join(lines[i:i + 40])  # a traceback says where it came from
            raise AssertionError(f"a stderr line is not JSON: {line!r}, from:\n{rest}") from None
        assert isinstance(rec, dict) and {"level", "message", "time", "logger"} <= rec.keys(), line
        out.append(rec)
    return out


class Proc:
    """A process with its stderr in a file, stopped with SIGTERM to its process group."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._err = log.open("wb")
        self.proc = subprocess.Popen(
            args, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=self._err, start_new_session=True
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, found: Callable[[list[dict[str, Any]]], bool], what: str, timeout: float = 90) -> None:
        deadline = within(timeout)
        while time.monotonic() < deadline:
            lines = [line for line in self.text().splitlines() if line.startswith("{") and line.endswith("}")]
            if found([json.loads(line) for line in lines]):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)  # polling a file another process appends to
        raise AssertionError(f"no {what} in the log: {self.text()[-3000:]}")

    def stop(self) -> str:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._err.close()
        return self.text()


def said(text: str) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda recs: any(text in r["message"] for r in recs)


def worker_args() -> list[str]:
    return [sys.executable, *celery_worker_argv()]


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def test_worker_and_cli_log_json_and_a_step_line_has_its_five_fields(
    pg_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    env = worker_env(pg_url, REDIS_URL, redis_prefix, tmp_path, **JSON)
    engine = make_engine(DatabaseSettings(url=pg_url))
    sessions: sessionmaker[Session] = make_session_factory(engine)
    now = datetime.now(UTC)
    with sessions() as s, s.begin():
        s.add(Node(name="gpu-node-1", status="healthy", first_seen_at=now, updated_at=now))
    engine.dispose()
    worker = Proc(worker_args(), env, tmp_path / "worker.err")
    try:
        worker.wait_for(said(" ready."), "worker ready line")
        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "remediation.cli",
                "--actor",
                "tester",
                "report",
                "gpu-node-1",
                "-r",
                "xid 79 on the bench",
            ],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert cli.returncode == 0, cli.stderr
        records(cli.stderr)
        worker.wait_for(lambda recs: any("outcome" in r for r in recs), "step decision line")
    finally:
        text = worker.stop()
    recs = records(text)
    steps = [r for r in recs if "outcome" in r]
    first = steps[0]
    assert all(k in first for k in STEP_FIELDS), first
    assert first["node"] == "gpu-node-1" and first["attempt"] == 1 and first["level"] == "INFO"
    assert isinstance(first["remediation_id"], int) and first["step"] and first["outcome"]
    assert any(r["logger"].startswith("celery") for r in recs)  # Celery's own INFO lines, in our format


def test_a_pool_childs_death_is_logged_as_json(pg_url: str, redis_prefix: str, tmp_path: Path) -> None:
    """systemd's default stop signals every process in the unit, so a pool child can die first: the
    worker's line about it is a JSON record like any other, not billiard's bare text."""
    env = worker_env(pg_url, REDIS_URL, redis_prefix, tmp_path, **JSON)
    worker = Proc(worker_args(), env, tmp_path / "worker.err")
    try:
        worker.wait_for(said(" ready."), "worker ready line")
        (child,) = children(worker.proc.pid)
        os.kill(child, signal.SIGKILL)
        worker.wait_for(
            lambda recs: any(r["logger"] == "multiprocessing" for r in recs), "child's death line"
        )
    finally:
        text = worker.stop()
    died = [r for r in records(text) if r["logger"] == "multiprocessing"]
    assert (
        died[0]["level"] == "ERROR" and f"pid:{child} exited with 'signal 9 (SIGKILL)'" in died[0]["message"]
    )


def test_beat_logs_json(pg_url: str, redis_prefix: str, tmp_path: Path) -> None:
    env = worker_env(pg_url, REDIS_URL, redis_prefix, tmp_path, **JSON)
    beat = Proc(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "remediation.workers.celery_app",
            "beat",
            "-s",
            str(tmp_path / "beat-schedule"),
        ],
        env,
        tmp_path / "beat.err",
    )
    try:
        # Every entry is due at start, sent in no set order: wait for the sweep's own line.
        beat.wait_for(lambda recs: any("Sending due task" in r["message"] and "remediation.sweep" in r["message"]
                                       for r in recs), "beat's due-task line for the sweep")
    finally:
        text = beat.stop()
    assert any("remediation.sweep" in r["message"] for r in records(text))


def test_slurm_watcher_logs_json(pg_url: str, redis_prefix: str, tmp_path: Path) -> None:
    env = worker_env(pg_url, REDIS_URL, redis_prefix, tmp_path, **JSON)
    watcher = Proc([sys.executable, "-m", "remediation.watchers.slurm.watcher"], env, tmp_path / "slurm.err")
    try:
        watcher.wait_for(said("slurm watcher is the leader"), "leader line")
    finally:
        text = watcher.stop()
    assert {r["logger"] for r in records(text)} >= {"remediation.watchers.slurm.watcher"}
    assert "slurm watcher stopped" in text


def test_kube_watcher_logs_json(redis_prefix: str, tmp_path: Path) -> None:
    api = KubeAPIServer(token="test-token", bookmark_interval_s=0.2)
    api.start()
    env = base_env(
        "sqlite://",
        REMEDIATION_KUBE__HOST=api.url,
        REMEDIATION_KUBE__TOKEN=api.token,
        REMEDIATION_KUBE__CA_FILE=str(api.ca_file),
        REMEDIATION_KUBE__MAPPING="node",
        REMEDIATION_BROKER__REDIS_URL=REDIS_URL,
        REMEDIATION_BROKER__KEY_PREFIX=redis_prefix,
        **JSON,
    )
    watcher = Proc([sys.executable, "-m", "remediation.watchers.kube.watcher"], env, tmp_path / "kube.err")
    try:
        watcher.wait_for(said("leader lock acquired"), "leader line")
    finally:
        text = watcher.stop()
        api.stop()
    assert "kube watcher stopped" in {r["message"] for r in records(text)}


def test_api_logs_json_with_uvicorn_in_it(pg_url: str, tmp_path: Path) -> None:
    api = ApiProcess(base_env(pg_url, **JSON), tmp_path / "api.err")
    try:
        api.wait_ready()
    finally:
        api.stop()
    recs = records(api.log.read_text())
    loggers = {r["logger"] for r in recs}
    assert {"uvicorn.error", "uvicorn.access"} <= loggers, loggers
    assert any("/healthz" in r["message"] for r in recs if r["logger"] == "uvicorn.access")


def test_cli_logs_json_and_honours_log_level(pg_url: str) -> None:
    def prune(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "remediation.cli", "db", "prune", "--older-than", "30d"],
            env=base_env(pg_url, **JSON, **extra),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    out = prune()
    assert out.returncode == 0, out.stderr
    events, evidence = records(out.stderr)  # the events' line, then collected evidence's
    assert events["level"] == "INFO" and events["message"].startswith("prune: deleted 0 event(s)")
    assert evidence["level"] == "INFO" and evidence["message"].startswith("prune: deleted 0 collected evidence")
    quiet = prune(REMEDIATION_LOG_LEVEL="warning")
    assert quiet.returncode == 0 and quiet.stderr == "" and "deleted 0 event(s)" in quiet.stdout
