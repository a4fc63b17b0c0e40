"""`remediation rehearse`: the rehearsal takes exactly the decisions live processing takes.

Live: the events go through Redis to real Celery worker processes and Postgres, batch by batch, each
batch after the previous one settled. Rehearsal: the same events, one simulated hour apart, through
remediation.rehearsal.run on SQLite. The decision recorded for every event must match.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis
import yaml
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from remediation.adapters.bus import RedisEventBus
from remediation.adapters.memory import MemoryWorld
from remediation.db.models import Event, Remediation
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.statemachine import OPEN_STATUSES
from remediation.rehearsal.run import Pace, rehearse
from remediation.rehearsal.trace import Fault, read_mix
from remediation.settings import Settings, load_settings
from remediation.workers.celery_app import make_app
from tests.conftest import REDIS_URL
from tests.integration.workerproc import ROOT, Worker, wait_for, worker_env

T0 = datetime(2026, 5, 1, tzinfo=UTC)
NODES = [f"gpu-node-{i}" for i in range(8)]


def ev(i: int, node: str, state: str, reason: str = "", kind: EventKind = EventKind.UNHEALTHY,
       source: Source = Source.SLURM) -> NodeEvent:
    return NodeEvent(source=source, node=node, kind=kind, state=state, reason=reason,
                     observed_at=T0, dedupe_key=f"case:{i}")


BATCHES = [
    [ev(1, "gpu-node-1", "FAIL", "xid 79"), ev(2, "gpu-node-2", "DRAIN", "maintenance: PSU swap"),
     ev(3, "gpu-node-3", "DOWN", "Not responding"), ev(4, "gpu-node-4", "IDLE", kind=EventKind.HEALTHY),
     ev(5, "gpu-node-5", "DRAIN", "remediation: slurm FAIL: old"), ev(6, "gpu-node-7", "IDLE")],
    [ev(7, "gpu-node-1", "FAIL", "xid 48"),
     ev(8, "gpu-node-6", "Ready=False", "KubeletNotReady", source=Source.KUBERNETES),
     ev(9, "gpu-node-0", "MemoryPressure=True", source=Source.KUBERNETES)],
    [ev(10, "gpu-node-1", "FAIL", "xid 62")],
    [ev(11, "gpu-node-1", "FAIL", "xid 79 again"), ev(12, "gpu-node-3", "DOWN", "Not responding again")],
]
# The shipped defaults (fault classes and the lemon score on), in the worker processes and the rehearsal.
POLICY = {"breaker_max_fraction": 1.0, "min_restart_gap_s": 0, "repeat_offender_count": 3,
          "faults": {"classify": True}, "lemon": {"enabled": True}}


def test_rehearsal_decides_like_live_processing(pg_url: str, redis_client: redis.Redis, redis_prefix: str,
                                                tmp_path: Path) -> None:
    MemoryWorld(nodes=NODES, journal=tmp_path / "world.json")
    env = worker_env(pg_url, REDIS_URL, redis_prefix, tmp_path,
                     REMEDIATION_POLICY__BREAKER_MAX_FRACTION="1.0", REMEDIATION_MEMORY__NODES="gpu-node-[0-7]")
    app = make_app(load_settings(broker={"redis_url": REDIS_URL, "key_prefix": redis_prefix}))
    bus = RedisEventBus(redis_client, redis_prefix, kick=lambda: app.send_task("remediation.ingest", queue="ingest"))
    db = create_engine(pg_url, poolclass=NullPool)
    worker = Worker(env, tmp_path)
    expected = 0
    try:
        for batch in BATCHES:
            now = datetime.now(UTC)
            bus.publish([e.model_copy(update={"observed_at": now}) for e in batch])
            expected += len(batch)

            def settled(expected: int = expected) -> bool:
                with Session(db) as s:
                    decided = s.scalars(select(Event.id).where(Event.decision != "")).all()
                    open_ = s.scalars(select(Remediation.id).where(Remediation.status.in_(OPEN_STATUSES))).all()
                return len(decided) == expected and not open_

            wait_for(settled, 90, "the batch to settle", worker)
    finally:
        worker.stop()
    with Session(db) as s:
        live = {k: (d, r) for k, d, r in s.execute(select(Event.dedupe_key, Event.decision, Event.decision_reason))}
    db.dispose()

    faults = [Fault(T0 + timedelta(hours=i), e.model_copy(update={"observed_at": T0 + timedelta(hours=i)}))
              for i, batch in enumerate(BATCHES) for e in batch]
    report = rehearse(faults, Settings(policy=POLICY), NODES, pace=Pace(reboot_s=60))
    rehearsed = {k: (d, r) for k, d, r in report.per_event}
    assert rehearsed == live
    assert live["case:10"][0] == "quarantine" and live["case:11"][0] == "record"
    assert report.outcomes == {"succeeded": 5, "quarantined": 1}  # node-1 x2, node-3 x2, node-6


def test_simulate_command_on_the_published_mix(tmp_path: Path) -> None:
    trace = ROOT / "remediation" / "data" / "llama3-405b-interruptions.csv"
    # An events trace carries signals, not what fixes them: for the replay of the dumped events to be
    # the same world, every fault here is one a restart fixes and none is the fabric's.
    (tmp_path / "restart-fixes.yaml").write_text(yaml.safe_dump({"categories": {
        r.category: {"p_restart": 1.0, "p_move": 1.0, "source": "test"} for r in read_mix(trace)}}))
    env_cmd = [sys.executable, "-c", "from remediation.cli.main import main; main()", "rehearse", "--trace", str(trace),
               "--nodes", "32", "--days", "54", "--seed", "2", "-o", "json", "--dump-events", str(tmp_path / "t.jsonl"),
               "--truth", str(tmp_path / "restart-fixes.yaml")]
    proc = subprocess.run(env_cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["faults"] == len((tmp_path / "t.jsonl").read_text().splitlines()) > 0
    assert out["wall_s"] > 0 and out["runs"] > 0
    assert out["max_vm_in_flight"] <= 4
    assert sum(out["outcomes"].values()) == out["decisions"].get("open", 0) + out["decisions"].get("quarantine", 0)
    # The dumped events replay to the same decisions.
    again = subprocess.run(env_cmd[:5] + [str(tmp_path / "t.jsonl"), "--nodes", "32", "-o", "json"], cwd=ROOT,
                           capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["decisions"] == out["decisions"]


def test_simulate_rejects_a_bad_trace_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("what,ever\n")
    proc = subprocess.run([sys.executable, "-c", "from remediation.cli.main import main; main()", "rehearse", "--trace",
                           str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: ") and "needs the columns" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_side_by_side_rehearsal_shows_what_fault_intelligence_changes(tmp_path: Path) -> None:
    """The default policy against deploy/policies/naive-ladder.yaml on one trace, judged by the world:
    the fabric's nodes get no VM action and no quarantine, far fewer VM actions are wasted."""
    trace = ROOT / "remediation" / "data" / "llama3-405b-interruptions.csv"
    proc = subprocess.run(
        [sys.executable, "-c", "from remediation.cli.main import main; main()", "rehearse", "--trace", str(trace),
         "--nodes", "256", "--days", "54", "--seed", "3", "--baseline",
         str(ROOT / "deploy" / "policies" / "naive-ladder.yaml"), "-o", "json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")})  # the shipped defaults
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    policy, base, ratios = out["policy"], out["baseline"], out["ratios"]
    assert out["truth"] == "truth-llama3.yaml" and out["wall_s"] > 0
    assert base["fabric_vm_actions"] > 0, base  # the naive ladder restarts the fabric's nodes...
    assert policy["fabric_vm_actions"] == 0 and policy["fabric_quarantines"] == 0  # ...one incident does not
    assert policy["incidents"] >= 1 and base["incidents"] == 0
    assert policy["wasted_vm_actions"] <= 0.25 * base["wasted_vm_actions"], ratios
    assert policy["auto_fixed"] >= base["auto_fixed"], ratios
    assert ratios["wasted_vm_actions"] == round(policy["wasted_vm_actions"] / base["wasted_vm_actions"], 3)


def _simulate(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", "from remediation.cli.main import main; main()", *args, "-o", "json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")} | {
            "REMEDIATION_LOG_LEVEL": "WARNING"})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_a_mixed_fleet_rehearsed_per_pool_under_profiles_and_one_global_policy() -> None:
    """The shipped mixed fleet (an NVL72, an H100 and an inference pool) under its profiles and under one
    global policy on the same trace: every figure per pool, both read by the same pools."""
    policies = ROOT / "deploy" / "policies"
    out = _simulate("--config", str(policies / "mixed-fleet-profiles.yaml"), "rehearse", "--trace",
                    str(ROOT / "remediation" / "data" / "llama3-405b-interruptions.csv"), "--nodes", "256",
                    "--days", "20", "--seed", "2", "--node-facts", str(policies / "mixed-fleet-nodes.yaml"),
                    "--baseline", str(policies / "mixed-fleet-global.yaml"))
    mine, theirs = out["policy"]["profiles"], out["baseline"]["profiles"]
    assert set(mine) == set(theirs) == {"nvl72", "h100", "inference"}
    assert {p: r["nodes"] for p, r in mine.items()} == {"nvl72": 72, "h100": 128, "inference": 56}
    for figures, whole in ((mine, out["policy"]), (theirs, out["baseline"])):
        # Every fault, VM action and node-hour belongs to exactly one pool.
        assert sum(r["faults"] for r in figures.values()) == whole["faults"]
        assert sum(r["vm_actions_total"] for r in figures.values()) == whole["vm_actions_total"]
        assert abs(sum(r["node_hours_out"] for r in figures.values()) - whole["node_hours_out"]) < 0.5
    assert mine["inference"]["max_vm_in_flight"] <= 1  # the inference profile's own max_concurrent


def test_a_profile_off_in_the_rehearsal_opens_nothing_in_its_pool(tmp_path: Path) -> None:
    config = tmp_path / "off.yaml"
    config.write_text(yaml.safe_dump({"profiles": [{"name": "dark", "select": {"hostlist": "gpu-node-[0-31]"},
                                                    "mode": "off"}]}))
    out = _simulate("--config", str(config), "simulate", "--trace",  # the old name, an alias
                    str(ROOT / "remediation" / "data" / "llama3-405b-interruptions.csv"), "--nodes", "64",
                    "--days", "54", "--seed", "1")
    dark, rest = out["profiles"]["dark"], out["profiles"]["(base)"]
    assert dark["faults"] > 0 and dark["outcomes"] == {} and dark["vm_actions_total"] == 0
    assert rest["outcomes"] and rest["nodes"] == 32
