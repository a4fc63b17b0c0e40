"""Scenario 5, storm: half of the nodes fail within a minute.

Real Celery worker processes run the workflow against the in-memory world (shared journal, so the
call log is how actions are counted); the on-call webhook is a local stdlib HTTP receiver fed by the
real notification pass (the beat's ``remediation.notify`` in the workers, and one last pass run here).

What must hold:
- the storm breaker opens, once (one ``breaker_open`` audit row);
- no more than ``policy.max_concurrent`` VM actions are in flight at any time (a VM action is in
  flight from the provider call in the world's log to its ``verify`` result in the step rows, which
  lies inside the span admission counts), and none is admitted or called while the breaker is open;
- every failed node is still drained in Slurm, those that failed after the breaker opened while it
  was open;
- on-call gets one "breaker open" message;
- the breaker latches; this scenario opts in to ``breaker_auto_close_s`` (as long as the
  short ``breaker_window_s``), so it closes once the window has slid past the failures and the pool
  has been quiet that long, and then every remediation completes, each action exactly once. (The
  human close of a latched breaker on the real slurmctld is scenario 12.)
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from remediation.adapters.bus import RedisEventBus
from remediation.adapters.memory import MemoryWorld
from remediation.db.models import AuditLog, Node, Remediation, RemediationStep
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.services.notify import run_pass
from remediation.settings import NotifySettings, load_settings
from remediation.workers.celery_app import make_app
from tests.conftest import REDIS_URL
from tests.faults import SOFTWARE_FAULT
from tests.integration.workerproc import Worker, settled, wait_for, worker_env
from tests.reliability.conftest import Recorder, scale

MAX_CONCURRENT = 4


class Receiver:
    """A Slack-compatible webhook: records every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                posts.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T0/B0/storm"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, text: str) -> int:
        return sum(str(p.get("text", "")).count(text) for p in self.posts)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()  # shutdown() only ends the loop; the listening socket stays open until this


def event(node: str, kind: EventKind, state: str, reason: str = "") -> NodeEvent:
    return NodeEvent(source=Source.SLURM, node=node, kind=kind, state=state, reason=reason,
                     observed_at=datetime.now(UTC))


def audit_times(db: Engine, action: str) -> list[float]:
    with Session(db) as s:
        rows = s.scalars(select(AuditLog.at).where(AuditLog.action == action).order_by(AuditLog.id)).all()
    return [at.timestamp() for at in rows]


def max_in_flight(spans: list[tuple[float, float]]) -> int:
    """Most spans overlapping at one instant (an end at the same instant as a start comes first)."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
    peak = level = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


@pytest.mark.scenario("5 Storm: 50% of the nodes fail")
def test_storm_opens_the_breaker_throttles_vm_actions_and_pages_once(
    pg_url: str, redis_prefix: str, tmp_path: Path, receiver: Receiver, scenario_figures: Recorder
) -> None:
    pool, spread_s, window_s = scale(32, 64), scale(3, 45), scale(10, 60)
    nodes = [f"gpu-node-{i}" for i in range(pool)]
    failing = nodes[::2]  # 50% of the pool
    world = MemoryWorld(nodes=nodes, journal=tmp_path / "world.json")
    for node in failing:
        world.set_slurm(node, flags=["FAIL"], reason=SOFTWARE_FAULT, user="researcher")
    env = worker_env(
        pg_url, REDIS_URL, redis_prefix, tmp_path,
        REMEDIATION_MEMORY__NODES=f"gpu-node-[0-{pool - 1}]",
        REMEDIATION_MEMORY__OP_POLLS="3",  # a VM restart spans a few polls, so concurrent ones overlap
        REMEDIATION_POLICY__MAX_CONCURRENT=str(MAX_CONCURRENT),
        REMEDIATION_POLICY__BREAKER_WINDOW_S=str(window_s),  # the window slides in seconds
        REMEDIATION_POLICY__BREAKER_AUTO_CLOSE_S=str(window_s),  # opt-in: closes after a quiet window
        REMEDIATION_NOTIFY__WEBHOOK_URL=receiver.url,
    )
    client = redis.Redis.from_url(REDIS_URL)
    app = make_app(load_settings(broker={"redis_url": REDIS_URL, "key_prefix": redis_prefix}))
    bus = RedisEventBus(client, redis_prefix, kick=lambda: app.send_task("remediation.ingest", queue="ingest"))
    db = create_engine(pg_url, poolclass=NullPool)
    scenario_figures.count_in(db)

    def count(model: type, *where: Any) -> int:
        with Session(db) as s:
            return int(s.scalar(select(func.count()).select_from(model).where(*where)) or 0)

    def all_closed() -> bool:
        return count(Remediation, Remediation.status == "succeeded") == len(failing)

    workers = [Worker(env, tmp_path, concurrency=3), Worker(env, tmp_path, concurrency=3, beat=False)]
    try:
        # The watchers' resync: every node exists (the breaker's pool).
        bus.publish([event(n, EventKind.INVENTORY, "IDLE") for n in nodes])
        wait_for(lambda: count(Node) == pool, 30, "the inventory", workers[0])
        # The storm: a burst, then the rest spread over a few seconds (a minute at full scale).
        storm_started = time.time()
        # The burst alone is more than breaker_max_fraction (10%) of the pool: the breaker opens at once.
        burst, rest = failing[: pool // 10 + 1], failing[pool // 10 + 1 :]
        bus.publish([event(n, EventKind.UNHEALTHY, "IDLE+FAIL", SOFTWARE_FAULT) for n in burst])
        for i, node in enumerate(rest):
            time.sleep(max(0.0, storm_started + spread_s * (i + 1) / len(rest) - time.time()))
            bus.publish([event(node, EventKind.UNHEALTHY, "IDLE+FAIL", SOFTWARE_FAULT)])
        wait_for(lambda: audit_times(db, "breaker_open"), 30, "the breaker to open", workers[0])
        wait_for(all_closed, window_s + 60, "every remediation to complete", workers[0])
        wait_for(lambda: audit_times(db, "breaker_closed"), 10, "the breaker to close", workers[0])
        settled(workers, client, redis_prefix)  # a late duplicate (a redelivered task, a sweep) had its chance
    finally:
        for w in workers:
            w.stop()
    # The notification outbox: the beat's passes ran in the workers; one more pass sends what is left.
    run_pass(sessionmaker(db), NotifySettings(webhook_url=receiver.url))

    opened, closed = audit_times(db, "breaker_open"), audit_times(db, "breaker_closed")
    open_at, closed_at = opened[0], closed[0]
    with Session(db) as s:
        rows = s.execute(select(RemediationStep.remediation_id, RemediationStep.step, RemediationStep.started_at,
                                RemediationStep.finished_at)).all()
        rems = s.execute(select(Remediation.id, Remediation.node, Remediation.status,
                                Remediation.closed_at)).all()
    vm_start = {rid: a.timestamp() for rid, step, a, _ in rows if step == "vm_restart"}
    verified = {rid: b.timestamp() for rid, step, _, b in rows if step == "verify" and b is not None}
    calls = world.calls(effect=True)
    # A VM action is in flight from the provider call (logged by the world, after the claim that
    # admitted it committed) to its verification (stamped before that result commits): inside the span
    # admission counts, so an overlap above max_concurrent here is a real one, never clock jitter.
    node_of = {rid: node for rid, node, *_ in rems}
    called = {c["node"]: c["at"] for c in calls if c["op"] == "vm.restart"}
    spans = {rid: (called[node_of[rid]], verified[rid]) for rid in verified}
    peak = max_in_flight(list(spans.values()))
    busiest = max(spans.values(), key=lambda sp: sum(a <= sp[0] < b for a, b in spans.values()))[0]
    busiest_spans = sorted((round(a - busiest, 3), round(b - busiest, 3), rid)
                           for rid, (a, b) in spans.items() if a <= busiest < b)
    effective = Counter((c["op"], c["node"]) for c in calls)
    dups = sum(n - 1 for n in effective.values() if n > 1)
    drained_at = {c["node"]: c["at"] for c in calls if c["op"] == "slurm.drain"}
    vm_calls = [c for c in calls if c["op"].startswith("vm.")]
    vm_while_open = [c for c in vm_calls if open_at <= c["at"] < closed_at]
    claimed_while_open = [rid for rid, at in vm_start.items() if open_at <= at < closed_at]
    after_open = [n for n in failing if drained_at.get(n, 0) >= open_at]
    pages_open, pages_closed = receiver.count("Storm breaker OPEN"), receiver.count("Storm breaker closed")
    succeeded = [node for _, node, status, _ in rems if status == "succeeded"]
    last_closed = max(c.timestamp() for *_, c in rems if c is not None)
    lost = scenario_figures.record(
        db=db, duplicate_actions=dups, recovery_s=round(last_closed - closed_at, 2),
        notes=(f"{len(succeeded)}/{len(failing)} remediated; {len(failing)}/{pool} nodes failed over {spread_s}s; breaker open {closed_at - open_at:.1f}s "
               f"(window {window_s}s), {len(after_open)} drains while open, {len(vm_while_open)} VM actions "
               f"and {len(claimed_while_open)} VM steps claimed while open; "
               f"peak {peak} VM actions in flight (max {MAX_CONCURRENT}); on-call paged {pages_open}x "
               f"open, {pages_closed}x closed; recovery = breaker closed to last remediation done"),
        extra={"breaker_open_rows": len(opened), "breaker_closed_rows": len(closed), "peak_vm": peak,
               "pages": [p.get("text", "")[:120] for p in receiver.posts]},
    )
    assert lost == 0, f"{lost} published events are not in Postgres"
    assert len(opened) == 1 and len(closed) == 1 and open_at < closed_at, (opened, closed)
    assert sorted(succeeded) == sorted(failing)
    assert 0 < peak <= MAX_CONCURRENT, f"VM actions in flight at the busiest moment: {busiest_spans}"
    assert not vm_while_open and not claimed_while_open, (vm_while_open, claimed_while_open)
    for node in failing:
        assert effective[("slurm.drain", node)] == 1 and drained_at[node] < closed_at, node
        assert effective[("vm.restart", node)] == 1, node
    assert len(after_open) >= len(rest), "nodes failing after the breaker opened are drained while it is open"
    assert dups == 0, effective
    assert pages_open == 1, receiver.posts
    assert pages_closed == 1, receiver.posts
    db.dispose()
    client.close()
