"""On real Redis, a worker takes a lone fault's isolate task before the rest of another cluster's storm
and before the storm's follow-up steps: kombu's Redis transport serves the dispatcher's priorities."""

from __future__ import annotations

import redis

from remediation.adapters.celery import ISOLATE_TASK, WORKFLOW_QUEUE, CeleryDispatcher, make_app, step_task
from remediation.ports.dispatch import FollowUp
from remediation.settings import Settings
from tests.conftest import REDIS_URL


def test_a_lone_fault_is_taken_before_the_rest_of_a_storm(redis_client: redis.Redis, redis_prefix: str) -> None:
    app = make_app(Settings(broker={"redis_url": REDIS_URL, "key_prefix": redis_prefix}))
    dispatcher = CeleryDispatcher(app, isolate_batch=2)
    dispatcher.steps([FollowUp(i, "slurm_drain") for i in range(1, 6)])  # cluster A: five nodes at once
    dispatcher.steps([FollowUp(1, "return")])  # A's first, isolated, moves on
    dispatcher.steps([FollowUp(9, "slurm_drain")])  # cluster B: one node, in the ingest's next call
    taken = []
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(WORKFLOW_QUEUE, no_ack=True)
        for _ in range(5):
            message = queue.get(timeout=5)
            taken.append((message.headers["task"], message.payload[0]))
        queue.close()
    assert taken == [(ISOLATE_TASK, [[1, 2]]), (ISOLATE_TASK, [[9]]), (ISOLATE_TASK, [[3, 4]]),
                     (ISOLATE_TASK, [[5]]), (step_task("return"), [1])]  # fmt: skip
