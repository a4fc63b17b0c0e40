"""A leader paused past its lease while Redis fails over publishes nothing that counts.

The leading Slurm watcher (``python -m remediation.watchers.slurm.watcher`` on the simulated cluster) is SIGSTOPped right
after it read a new fault and before it could publish it; the Redis primary is SIGKILLed at the same
time; the standby takes the lock on the promoted replica and publishes; the old leader is let go, and
publishes what it read under its old fencing token. Counted at ingest, from the stream itself in its
order: every event published under the replaced leadership was fenced, none recorded.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import redis
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from remediation.adapters.memory import MemoryWorld
from remediation.db.models import Event, LeaderFence, RejectedEvent
from remediation.domain.events import NodeEvent
from tests.haproc import SentinelSet, fail_over, sentinel_env
from tests.integration.workerproc import ROOT, Worker, spawn, wait_for, worker_env
from tests.ports import HEALTH_LINE, reported_port
from tests.reliability.conftest import Recorder
from tests.reliability.test_restarts import statuses


class WatcherProc:
    """``python -m remediation.watchers.slurm.watcher`` on the simulated cluster's journal, with its health endpoint."""

    def __init__(self, env: dict[str, str], tmp: Path, name: str) -> None:
        self.log = tmp / f"{name}.log"
        self.proc = spawn([sys.executable, "-m", "remediation.watchers.slurm.watcher"], self.log, cwd=ROOT,
                          env=env | {"REMEDIATION_HEALTH__PORT": "0"}, start_new_session=True)

    @functools.cached_property
    def port(self) -> int:
        """The health port the watcher bound (it starts on port 0), as its output names it."""
        return reported_port(self.log, HEALTH_LINE, self.proc)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def role(self) -> str | None:
        try:
            body = httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return None
        return str(body.get("role"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.mark.scenario("Leader paused past its lease, Redis failover")
def test_a_paused_leader_publishes_nothing_that_counts(
    sentinels: SentinelSet, pg_url: str, tmp_path: Path, scenario_figures: Recorder
) -> None:
    prefix = "ha-leader"
    world = MemoryWorld(nodes=[f"gpu-node-{i}" for i in range(8)], journal=tmp_path / "world.json")
    env = worker_env(
        pg_url,
        "",
        prefix,
        tmp_path,
        **sentinel_env(sentinels),
        REMEDIATION_BROKER__STREAM_MAX_LEN="100000",  # keep the stream: the count reads it
        REMEDIATION_SLURM__POLL_INTERVAL_S="0.25",
        # Each read of the simulated Slurm is marked and then takes half a second before
        # the watcher can publish what it read: the window in which the leader is paused.
        REMEDIATION_MEMORY__CALL_DELAY_S='{"slurm.list_nodes": 0.5}',
    )
    db = create_engine(pg_url, poolclass=NullPool)
    worker = Worker(env, tmp_path, concurrency=2)
    first = WatcherProc(env, tmp_path, "watcher-1")
    second: WatcherProc | None = None
    try:
        wait_for(lambda: first.role() == "leader", 30, "the first watcher to lead", first)
        second = WatcherProc(env, tmp_path, "watcher-2")
        wait_for(lambda: second.role() == "standby", 30, "the second watcher to stand by", second)
        world.set_slurm("gpu-node-1", flags=["FAIL"], reason="xid 79", user="researcher")
        wait_for(lambda: "gpu-node-1" in statuses(db), 30, "the leader's event to open a remediation", worker)
        # A new fault; the leader is paused right after it read it, before it could publish it.
        world.set_slurm("gpu-node-2", flags=["FAIL"], reason="xid 79", user="researcher")
        changed = time.time()
        wait_for(
            lambda: any(
                c["pid"] == first.proc.pid and c["at"] > changed for c in world.calls("slurm.list_nodes")
            ),
            10,
            "the leader to read the fault",
            first,
        )
        os.killpg(first.proc.pid, signal.SIGSTOP)  # paused, lock, token, read and all, past its lease
        paused_at = time.monotonic()
        failover_s, rejoin_s = fail_over(sentinels)
        wait_for(lambda: second.role() == "leader", 40, "the standby to take over", second)
        took_over = time.monotonic() - paused_at
        wait_for(lambda: "gpu-node-2" in statuses(db), 30, "the new leader's event to be recorded", worker)
        # The old leader wakes with the fault in hand and its old token, believing it still leads.
        os.killpg(first.proc.pid, signal.SIGCONT)
        wait_for(
            lambda: first.role() == "standby" and "lost the leader lock" in first.output(),
            30,
            "the woken leader to find its lock gone",
            first,
        )
        primary = redis.Redis(port=sentinels.primary_port() or 0)
        wait_for(
            lambda: (
                primary.xinfo_groups(f"{prefix}:events:slurm")[0]["lag"] == 0
                and primary.xinfo_groups(f"{prefix}:events:slurm")[0]["pending"] == 0
            ),
            30,
            "the ingest to have read and acknowledged the whole stream",
            worker,
        )
        entries = primary.xrange(f"{prefix}:events:slurm")
    finally:
        first.stop()
        if second is not None:
            second.stop()
        worker.stop()
    # Counted from the stream itself, in its order: an entry whose token is below a token published
    # earlier came from a replaced leader.
    highest, stale, tokens = 0, [], Counter[int]()
    for _id, fields in entries:
        event = NodeEvent.parse(fields[b"e"])
        assert event.fence is not None and event.fence.lock == "slurm", event
        tokens[event.fence.token] += 1
        if event.fence.token < highest:
            stale.append(fields[b"e"].decode())
        highest = max(highest, event.fence.token)
    with Session(db) as s:
        rejected = set(s.scalars(select(RejectedEvent.payload)))
        fence = s.get(LeaderFence, ("default", "slurm"))
        recorded_keys = set(s.scalars(select(Event.dedupe_key)))
    accepted_stale = [p for p in stale if p not in rejected]
    assert fence is not None and fence.token == highest
    scenario_figures.record(
        notes=(
            f"leader SIGSTOPped, primary SIGKILLed: sentinels promoted in {failover_s:.1f}s, old primary "
            f"a replica again {rejoin_s:.1f}s later, standby led {took_over:.1f}s after the pause; "
            f"tokens {sorted(tokens)}; {len(stale)} event(s) published under the replaced leadership, "
            f"{len(accepted_stale)} of them recorded, {fence.fenced} fenced at ingest"
        ),
        extra={"tokens": dict(tokens), "stale": len(stale), "fenced": fence.fenced},
    )
    assert len(tokens) == 2, f"two holdings, two tokens: {tokens}"
    assert not accepted_stale, accepted_stale
    assert len(stale) >= 1, "the woken leader published nothing: the fence was not put to the test"
    assert fence.fenced == len(stale)
    assert any(k for k in recorded_keys if "gpu-node-2" in k), "the new leader's event was recorded"
    db.dispose()
