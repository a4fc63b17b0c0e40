"""A storm in one pool, with real worker processes: events on the Redis stream, real Celery workers
(the memory world in a journal file, so every process sees one world and one call log), Postgres.

Two profiles split eight nodes. Two of pool-a's four nodes fail together: more than its own storm
breaker allows, so its latch opens and its remediations wait before any machine action, while a fault
in pool-b is remediated to the end. A human closes pool-a's breaker with the real CLI, and its held
remediations go on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from remediation.adapters.memory import MemoryWorld
from remediation.db.models import Node, Remediation
from remediation.db.queries import breaker_key, control_get
from remediation.domain.events import EventKind, NodeEvent, Source
from tests.conftest import REDIS_URL
from tests.faults import UNKNOWN_FAULT, show_fault
from tests.integration.test_celery_pipeline import bus, db  # noqa: F401  (fixtures; bus takes env from here)
from tests.integration.workerproc import ROOT, Worker, wait_for, worker_env

PROFILES = [
    {
        "name": "pool-a",
        "select": {"hostlist": "gpu-node-[0-3]"},
        "policy": {"breaker_min_failures": 2, "breaker_max_fraction": 0.3},
    },
    {"name": "pool-b", "select": {"hostlist": "gpu-node-[4-7]"}},
]


@pytest.fixture
def env(pg_url: str, redis_prefix: str, tmp_path: Path) -> dict[str, str]:
    # The fleet's own latch never opens here (3 of 8 is within 100%): only a pool's can.
    return worker_env(
        pg_url,
        REDIS_URL,
        redis_prefix,
        tmp_path,
        REMEDIATION_PROFILES=json.dumps(PROFILES),
        REMEDIATION_POLICY__BREAKER_MAX_FRACTION="1.0",
    )


def event(node: str, kind: EventKind, state: str) -> NodeEvent:
    return NodeEvent(
        source=Source.SLURM,
        node=node,
        kind=kind,
        state=state,
        observed_at=datetime.now(UTC),
        reason=UNKNOWN_FAULT if kind is EventKind.UNHEALTHY else "",  # the pool's workflow.ladder
        partitions=["gpu"] if kind is EventKind.INVENTORY else None,
        features=[] if kind is EventKind.INVENTORY else None,
    )


def rems(db: Engine) -> dict[str, Remediation]:
    with Session(db) as s:
        return {r.node: r for r in s.scalars(select(Remediation))}


def test_a_storm_in_one_pool_holds_that_pool_and_the_other_goes_on(env, bus, db, tmp_path) -> None:  # noqa: ANN001
    nodes = [f"gpu-node-{i}" for i in range(8)]
    world = MemoryWorld(nodes=nodes, journal=tmp_path / "world.json")
    worker = Worker(env, tmp_path)
    try:
        bus.publish([event(n, EventKind.INVENTORY, "IDLE") for n in nodes])  # the watcher's first resync
        wait_for(
            lambda: (
                _pools(db) == {**dict.fromkeys(nodes[:4], "pool-a"), **dict.fromkeys(nodes[4:], "pool-b")}
            ),
            30,
            "every node in its pool",
            worker,
        )
        failed = ("gpu-node-0", "gpu-node-1", "gpu-node-5")
        for n in failed:  # Slurm shows them failed, as the watcher saw
            show_fault(world, n, "FAIL", UNKNOWN_FAULT)
        bus.publish([event(n, EventKind.UNHEALTHY, "FAIL") for n in failed])
        wait_for(
            lambda: (r := rems(db).get("gpu-node-5")) is not None and r.status == "succeeded",
            60,
            "pool-b's remediation to the end",
            worker,
        )
        # The barrier: both of pool-a's remediations have reached the breaker and been held by it.
        held = wait_for(
            lambda: (
                all(
                    "profile pool-a's storm breaker open" in (r.wait_reason or "")
                    for r in [rems(db).get("gpu-node-0"), rems(db).get("gpu-node-1")]
                    if r
                )
                and len(rems(db)) == 3
                and rems(db)
            ),
            60,
            "pool-a held by its own breaker",
            worker,
        )
        assert {(held[n].step, held[n].status) for n in ("gpu-node-0", "gpu-node-1")} == {
            ("k8s_evict", "waiting")
        }
        assert not [
            c for c in world.calls("vm.restart", effect=True) if c["node"] in ("gpu-node-0", "gpu-node-1")
        ]
        assert [c["node"] for c in world.calls("vm.restart", effect=True)] == ["gpu-node-5"]
        with Session(db) as s:
            assert control_get(s, breaker_key("pool-a"))["open"] and not control_get(
                s, breaker_key(None)
            ).get("open")

        # A human closes pool-a's breaker with the CLI; its remediations re-check and go on.
        cli = subprocess.run(
            [
                sys.executable,
                "-c",
                "from remediation.cli.main import main; main()",
                "breaker",
                "close",
                "--profile",
                "pool-a",
                "-r",
                "leaf switch replaced",
            ],
            cwd=ROOT,
            env=env | {"USER": "oncall"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        assert "profile pool-a's storm breaker closed; 2 held remediation(s)" in cli.stdout
        wait_for(
            lambda: {rems(db)[n].status for n in ("gpu-node-0", "gpu-node-1")} == {"succeeded"},
            60,
            "pool-a's remediations after the close",
            worker,
        )
    finally:
        worker.stop()


def _pools(db: Engine) -> dict[str, str | None]:
    with Session(db) as s:
        return dict(s.execute(select(Node.name, Node.profile)).all())  # type: ignore[arg-type]
