"""The real processes' health endpoints: two Slurm watchers (a leader and a standby), a Kubernetes
watcher, a Celery worker (prefork) and beat, each started as in production (``python -m remediation.watchers.slurm.watcher``,
``celery -A remediation.workers.celery_app worker|beat``) with ``health.port`` 0, and queried over HTTP on the port
each says it bound.

Also: the worker's liveness holds through a Redis outage while its readiness says the broker is gone,
and every series the alert rules (deploy/base/prometheus-rules.yaml) and the Grafana dashboard read is
one these endpoints or the API's /metrics export."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from remediation.adapters.queues import queue_depth
from remediation.api.app import create_app
from remediation.settings import load_settings
from remediation.simulator.kube.api import KubeAPIServer
from tests.conftest import REDIS_URL
from tests.integration.workerproc import ROOT, Worker, celery_worker_argv, spawn, wait_for, worker_env
from tests.ports import HEALTH_LINE, reported_port
from tests.redisproc import PrivateRedis
from tests.unit.repo.test_alerts import alerts, series_names


def get(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            body = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as exc:
        body, status = exc.read().decode(), exc.code
    except OSError:
        return 0, None  # not listening (yet)
    return status, (json.loads(body) if path != "/metrics" else body)


def samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample line of a Prometheus exposition."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def names(text: str) -> set[str]:
    return {key.split("{", 1)[0] for key in samples(text)}


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def families(text: str) -> set[str]:
    """The series names a /metrics declares (``# TYPE``), samples or not: a labelled family with no
    row yet (no events recorded) still exports its name."""
    out = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            out |= {name.removesuffix("_total") + suffix for suffix in SUFFIXES.get(kind, ("",))}
    return out


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    log: Path

    @functools.cached_property
    def port(self) -> int:
        """The health port the process bound (it starts on port 0), read from its output once it says."""
        return reported_port(self.log, HEALTH_LINE, self.proc)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def start(argv: list[str], env: dict[str, str], tmp: Path, name: str) -> Proc:
    log = tmp / f"{name}.log"
    proc = spawn([sys.executable, *argv], log, cwd=ROOT, env=env | {"REMEDIATION_HEALTH__PORT": "0"},
                 start_new_session=True)
    return Proc(proc, log)


@dataclass
class Stack:
    slurm: list[Proc]
    kube: Proc
    worker: Proc
    beat: Proc
    env: dict[str, str]


@pytest.fixture(scope="module")
def stack(pg_module_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("health")
    prefix = f"health-{os.getpid()}-{time.monotonic_ns()}"
    env = worker_env(pg_module_db, REDIS_URL, prefix, tmp, REMEDIATION_SLURM__POLL_INTERVAL_S="0.5")
    kube_api = KubeAPIServer(token="test-token", bookmark_interval_s=0.2)
    kube_api.start()
    kube_api.add_node("n1")
    procs: list[Proc] = []
    try:
        procs.append(start(["-m", "remediation.watchers.slurm.watcher"], env, tmp, "slurm-1"))
        # The second starts once the first leads, so which one is the standby is known.
        wait_for(lambda: get(procs[0].port, "/readyz")[1], 30, "the first Slurm watcher", procs[0])
        wait_for(lambda: get(procs[0].port, "/readyz")[1]["role"] == "leader", 30, "a leader", procs[0])
        procs.append(start(["-m", "remediation.watchers.slurm.watcher"], env, tmp, "slurm-2"))
        kube_env = env | {
            "REMEDIATION_KUBE__BACKEND": "kubernetes",
            "REMEDIATION_KUBE__HOST": kube_api.url,
            "REMEDIATION_KUBE__TOKEN": kube_api.token,
            "REMEDIATION_KUBE__CA_FILE": str(kube_api.ca_file),
            "REMEDIATION_KUBE__MAPPING": "node",
        }
        procs.append(start(["-m", "remediation.watchers.kube.watcher"], kube_env, tmp, "kube"))
        worker_argv = celery_worker_argv(concurrency=2, name="h")
        procs.append(start(worker_argv, env, tmp, "worker"))
        procs.append(
            start(
                [
                    "-m",
                    "celery",
                    "-A",
                    "remediation.workers.celery_app",
                    "beat",
                    "-s",
                    str(tmp / "beat-schedule"),
                    "--loglevel",
                    "INFO",
                ],
                env,
                tmp,
                "beat",
            )
        )
        yield Stack(slurm=procs[:2], kube=procs[2], worker=procs[3], beat=procs[4], env=env)
    finally:
        for p in procs:
            p.stop()
        kube_api.stop()


def test_slurm_watchers_report_leader_and_a_healthy_standby(stack: Stack) -> None:
    leader, standby = stack.slurm
    wait_for(lambda: get(standby.port, "/livez")[0] == 200, 30, "the standby's endpoint", standby)
    status, body = get(standby.port, "/readyz")
    assert (status, body["ok"], body["role"]) == (200, True, "standby")
    status, body = get(standby.port, "/livez")
    assert (status, body["ok"], body["watcher"], body["role"]) == (200, True, "slurm", "standby")
    assert body["loop_age_s"] < 5
    status, body = get(leader.port, "/readyz")
    assert (status, body["role"]) == (200, "leader") and body["last_success_age_s"] < 5
    lead = samples(get(leader.port, "/metrics")[1])
    stand = samples(get(standby.port, "/metrics")[1])
    assert lead['remediation_watcher_leader{watcher="slurm"}'] == 1
    assert stand['remediation_watcher_leader{watcher="slurm"}'] == 0
    assert lead['remediation_watcher_last_success_timestamp_seconds{watcher="slurm"}'] > time.time() - 30
    assert stand['remediation_watcher_last_success_timestamp_seconds{watcher="slurm"}'] == 0
    assert lead['remediation_watcher_poll_duration_seconds_count{watcher="slurm"}'] > 0

    # The leader goes (SIGTERM releases the lock): the standby takes over and says so.
    leader.stop()
    wait_for(lambda: get(standby.port, "/readyz")[1]["role"] == "leader", 30, "the takeover", standby)
    taken = samples(get(standby.port, "/metrics")[1])
    assert taken['remediation_watcher_leader{watcher="slurm"}'] == 1


def test_kube_watcher_reports_its_list_and_watch(stack: Stack) -> None:
    port = stack.kube.port
    wait_for(
        lambda: (get(port, "/readyz")[1] or {}).get("role") == "leader",
        30,
        "the kube leader",
        stack.kube,
    )
    assert get(port, "/livez")[0] == 200
    # It leads before its first list ends: the list is reported when it ends.
    def after_first_list() -> dict[str, float] | None:
        metrics = samples(get(port, "/metrics")[1])
        return metrics if metrics['remediation_watcher_poll_duration_seconds_count{watcher="kube"}'] >= 1 else None

    metrics = wait_for(after_first_list, 30, "the kube leader's first list to be reported", stack.kube)
    assert metrics['remediation_watcher_leader{watcher="kube"}'] == 1
    listed = metrics['remediation_watcher_last_success_timestamp_seconds{watcher="kube"}']
    assert listed > 0
    # A quiet watch still answers (bookmarks every 0.2 s here): the last success moves on.
    wait_for(
        lambda: (
            samples(get(port, "/metrics")[1])[
                'remediation_watcher_last_success_timestamp_seconds{watcher="kube"}'
            ]
            > listed
        ),
        10,
        "a watch response",
    )


def test_worker_reports_liveness_readiness_and_counts_tasks_in_its_pool(stack: Stack) -> None:
    port = stack.worker.port
    wait_for(lambda: get(port, "/readyz")[0] == 200, 60, "the worker's readiness", stack.worker)
    status, body = get(port, "/livez")
    assert status == 200 and body["broker"] == "connected"
    # Beat queues the ingest safety net every 5 s; the prefork children run it and count it.
    key = 'remediation_worker_tasks_total{outcome="succeeded",task="remediation.ingest"}'
    wait_for(
        lambda: samples(get(port, "/metrics")[1]).get(key, 0) >= 2,
        60,
        "two counted ingests",
        stack.worker,
    )
    metrics = samples(get(port, "/metrics")[1])
    assert metrics['remediation_worker_tasks_total{outcome="failed",task="remediation.ingest"}'] == 0
    assert 'remediation_worker_tasks_total{outcome="retried",task="remediation.sweep"}' in metrics
    assert "pid=" not in get(port, "/metrics")[1]  # summed over the pool, not one series per child


def test_beat_reports_its_ticks(stack: Stack) -> None:
    port = stack.beat.port
    wait_for(lambda: get(port, "/readyz")[0] == 200, 30, "beat's readiness", stack.beat)
    status, body = get(port, "/readyz")
    assert body["last_send"] == "ok" and body["tick_age_s"] < 10
    first = samples(get(port, "/metrics")[1])["remediation_beat_last_tick_timestamp_seconds"]
    assert first > time.time() - 30
    wait_for(
        lambda: samples(get(port, "/metrics")[1])["remediation_beat_last_tick_timestamp_seconds"] > first,
        15,
        "the next tick",
        stack.beat,
    )


def test_every_series_the_alerts_read_is_exported(stack: Stack, pg_module_db: str) -> None:
    exported: set[str] = set()  # series with samples now
    declared: set[str] = set()  # families declared, with samples or not
    wait_for(
        lambda: all(
            get(p.port, "/metrics")[0] == 200 for p in (stack.slurm[1], stack.kube, stack.worker, stack.beat)
        ),
        60,
        "every endpoint",
    )
    for proc in (stack.slurm[1], stack.kube, stack.worker, stack.beat):
        text = get(proc.port, "/metrics")[1]
        exported |= names(text)
        declared |= families(text)
    settings = load_settings(database={"url": pg_module_db}, broker={"redis_url": REDIS_URL})
    # As `remediation api` builds it (remediation/cli/main.py), with the broker's queue depth.
    with TestClient(create_app(settings, queue_depth=lambda: queue_depth(settings))) as api:
        resp = api.get("/metrics")
        assert resp.status_code == 200
        exported |= names(resp.text)
        declared |= families(resp.text)
    read = {name for alert in alerts() for name in series_names(alert["expr"])}
    assert read and read <= exported, sorted(read - exported)
    # The Grafana dashboard likewise reads only exported series, the processes' new ones included.
    dashboard = json.loads((ROOT / "deploy/grafana/node-remediation.json").read_text())
    charted = {
        name
        for panel in dashboard["panels"]
        for t in panel.get("targets", [])
        for name in series_names(t["expr"])
    }
    assert charted <= declared, sorted(charted - declared)
    assert {
        "remediation_watcher_last_success_timestamp_seconds",
        "remediation_worker_tasks_total",
        "remediation_beat_last_tick_timestamp_seconds",
        "remediation_watcher_leader",
    } <= charted


def test_worker_stays_live_through_a_redis_outage_and_is_unready_meanwhile(
    pg_url: str, tmp_path: Path
) -> None:
    (tmp_path / "redis").mkdir()
    redis = PrivateRedis(tmp_path / "redis", persistence="volatile")
    redis.start()
    env = worker_env(
        pg_url,
        redis.url,
        "outage",
        tmp_path,
        REMEDIATION_HEALTH__PORT="0",
        REMEDIATION_HEALTH__LIVENESS_STALE_S="2",
    )
    worker = Worker(env, tmp_path, concurrency=1, beat=False)
    try:
        port = reported_port(worker.log, HEALTH_LINE, worker.proc)
        wait_for(lambda: get(port, "/readyz")[0] == 200, 60, "the worker's readiness", worker)
        redis.stop()
        wait_for(lambda: get(port, "/readyz")[0] == 503, 30, "readiness to see the outage", worker)
        status, body = get(port, "/readyz")
        assert body["broker"] == "connecting"
        # Past the liveness threshold (2 s) with the broker still gone: the worker is alive throughout.
        seen = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            seen.append(get(port, "/livez")[0])
            time.sleep(0.25)
        assert set(seen) == {200}, seen
        redis.start()
        wait_for(lambda: get(port, "/readyz")[0] == 200, 60, "readiness after Redis is back", worker)
    finally:
        worker.stop()
        redis.close()
