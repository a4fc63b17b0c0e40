"""Beat keeps its schedule state under ``broker.beat_state_dir``, never in the directory it started in.

Beat (standalone, or embedded in a worker with ``-B``) runs on the in-memory broker, so no server is
needed, from an empty directory; it must leave that directory empty.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from celery.beat import PersistentScheduler

from remediation.settings import Settings
from remediation.workers.celery_app import ingests, make_app, sweeps
from tests.pace import within

BIN = Path(sys.executable).parent


def run_until_state(args: list[str], cwd: Path, env: dict[str, str], state_dir: Path) -> None:
    """Start ``remediation ARGS`` in ``cwd``, wait for beat's state file in ``state_dir``, stop it."""
    with subprocess.Popen(
        [str(BIN / "remediation"), *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    ) as proc:  # leaving the block closes the pipe
        try:
            deadline = within(60)
            while not list(state_dir.glob("celerybeat-schedule*")):
                assert proc.poll() is None, proc.communicate()[0].decode()
                assert time.monotonic() < deadline, "beat wrote no state"
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize(
    "args",
    [["beat"], ["worker", "-B", "-P", "solo", "--without-heartbeat", "--without-mingle", "--without-gossip"]],
    ids=["beat", "worker-B"],
)
def test_beat_leaves_the_directory_it_started_in_empty(tmp_path: Path, args: list[str]) -> None:
    cwd, state = tmp_path / "cwd", tmp_path / "state"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")}
    env |= {
        "REMEDIATION_BROKER__CELERY_BROKER_URL": "memory://",
        "REMEDIATION_BROKER__BEAT_STATE_DIR": str(state),
    }
    run_until_state(args, cwd, env, state)
    assert list(cwd.iterdir()) == []
    assert list(state.glob("celerybeat-schedule*"))


def test_the_default_state_dir_is_under_the_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # what gettempdir() answers
    app = make_app(Settings(broker={"key_prefix": "site-a"}))
    assert (
        Path(app.conf.beat_schedule_filename) == tmp_path / "node-remediation-site-a" / "celerybeat-schedule"
    )


def test_beat_sweeps_each_cluster_on_its_own() -> None:
    """A cluster whose slurmctld is slow to answer its probe holds up only its own sweep."""
    assert sweeps(Settings()) == {"sweep": {"task": "remediation.sweep", "schedule": 30.0}}
    fleet = sweeps(Settings(clusters=[{"name": "west"}, {"name": "east"}]))
    assert {key: entry["kwargs"] for key, entry in fleet.items()} == {
        "sweep-west": {"cluster": "west"}, "sweep-east": {"cluster": "east"}}


def test_beat_asks_for_each_clusters_ingest_on_its_own() -> None:
    """The safety net for a kick relay that is down: each cluster's stream is read by its own ingest."""
    (alone,) = ingests(Settings()).values()
    assert "kwargs" not in alone and alone["task"] == "remediation.ingest"
    fleet = ingests(Settings(clusters=[{"name": "west"}, {"name": "east"}]))
    assert {key: entry["kwargs"] for key, entry in fleet.items()} == {
        "ingest-safety-net-west": {"cluster": "west"}, "ingest-safety-net-east": {"cluster": "east"}}
    assert make_app(Settings(clusters=[{"name": "west"}])).conf.beat_schedule.keys() >= {"ingest-safety-net"}


def test_a_worker_consumes_each_served_clusters_isolate_queue_whatever_q_named() -> None:
    from types import SimpleNamespace

    from remediation.adapters.celery import WORKER_QUEUES, isolate_queue
    from remediation.workers import celery_app

    app = make_app(celery_app.settings)
    app.amqp.queues.select(list(WORKER_QUEUES))  # what `remediation worker` passes as -Q
    celery_app._isolate_queues(instance=SimpleNamespace(app=app))
    served = [isolate_queue(name) for name in celery_app.settings.fleet()]
    assert sorted(app.amqp.queues.consume_from) == sorted([*WORKER_QUEUES, *served])


def _scheduler(tmp_path: Path) -> Any:
    from remediation.workers.health import BeatScheduler

    app = make_app(Settings(broker={"redis_url": "memory://"}))
    return BeatScheduler(app=app, schedule_filename=str(tmp_path / "beat-schedule"))


def test_a_pass_after_the_schedule_closed_ends_beat_rather_than_failing(tmp_path: Path) -> None:
    """Celery's SIGTERM handler closes the schedule, then raises SystemExit; a pass that runs anyway
    (the exit lost under load, seen in CI) ends beat cleanly instead of reading the closed shelf."""
    sched = _scheduler(tmp_path)
    sched.close()
    sched.close()  # beat's own shutdown closes it again: nothing to do
    with pytest.raises(SystemExit) as ended:
        sched.tick()
    assert ended.value.code == 0


def test_a_close_in_the_middle_of_a_pass_ends_beat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sched = _scheduler(tmp_path)

    def signalled_mid_pass(self: Any, *args: Any, **kwargs: Any) -> float:
        self.close()  # what the signal handler does, its SystemExit lost
        return len(self.schedule)  # the pass goes on to read the schedule

    monkeypatch.setattr(PersistentScheduler, "tick", signalled_mid_pass)
    with pytest.raises(SystemExit):
        sched.tick()


def test_a_pass_that_fails_while_open_still_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sched = _scheduler(tmp_path)

    def broken(self: Any, *args: Any, **kwargs: Any) -> float:
        raise ValueError("not a shutdown")

    monkeypatch.setattr(PersistentScheduler, "tick", broken)
    with pytest.raises(ValueError, match="not a shutdown"):
        sched.tick()
    sched.close()
