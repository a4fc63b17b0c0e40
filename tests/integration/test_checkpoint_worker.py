"""A real Celery worker SIGKILLed right after it signalled the jobs: the worker that takes over never
signals them again.

The adapters are the memory world in a journal file shared by the worker processes and the test,
whose call log counts the signals. ``memory.call_delay_s`` holds the first worker inside the drain
step just after its ``scancel`` took effect, the way a worker dies between acting and recording;
it is killed there. The second worker runs the step again with the same idempotency key, finds the
request's intent on the step row and sends nothing; the audit row says the request was not
confirmed. Once the job has left, the remediation goes on as usual.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from remediation.adapters.bus import RedisEventBus
from remediation.adapters.memory import MemoryWorld
from remediation.db.models import AuditLog, RemediationStep
from remediation.domain.checkpoint import CheckpointRequest
from tests.integration.test_celery_pipeline import (  # noqa: F401  (fixtures)
    bus,
    db,
    env,
    fail_event,
    remediation_status,
)
from tests.integration.workerproc import Worker, wait_for

NODE = "gpu-node-1"
CHECKPOINT = {
    "REMEDIATION_WORKFLOW__CHECKPOINT_SIGNAL": "USR1",
    "REMEDIATION_WORKFLOW__CHECKPOINT_WAIT_S": "300",
}


def test_a_worker_killed_after_signalling_never_signals_twice(
    env: dict[str, str], bus: RedisEventBus, db: Engine, tmp_path: Path
) -> None:
    world = MemoryWorld(nodes=[NODE], journal=tmp_path / "world.json")
    world.set_jobs(NODE, ["4242"])
    world.set_slurm(NODE, flags=["FAIL"], reason="training hung", user="researcher")  # what the event reports
    first = Worker(
        {**env, **CHECKPOINT, "REMEDIATION_MEMORY__CALL_DELAY_S": '{"slurm.signal": 30}'}, tmp_path
    )
    try:
        bus.publish([fail_event(NODE, reason="training hung")])
        wait_for(lambda: world.calls("slurm.signal"), 60, "the signal", first)
    finally:
        first.kill()  # inside the step: the jobs were signalled, nothing after that was recorded
    with Session(db) as s:
        row = s.scalars(select(RemediationStep).where(RemediationStep.step == "slurm_drain")).one()
    assert row.status == "started"
    intent = CheckpointRequest.load(row.provider_op)
    assert intent is not None and intent.jobs == ("4242",) and intent.sent is None  # recorded before scancel

    second = Worker({**env, **CHECKPOINT}, tmp_path)
    try:

        def audited() -> list[AuditLog]:
            with Session(db) as s:
                return list(s.scalars(select(AuditLog).where(AuditLog.action == "checkpoint_requested")))

        (audit,) = wait_for(audited, 60, "the second worker to record the request", second)
        assert audit.detail["sent"] is False and audit.detail["jobs"] == ["4242"]
        world.set_jobs(NODE, [])  # the job saved its work and left
        wait_for(lambda: remediation_status(db, NODE) == "succeeded", 90, "the remediation", second)
    finally:
        second.stop()
    assert len(world.calls("slurm.signal")) == 1
