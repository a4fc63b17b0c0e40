"""On real Redis, a worker takes a lone fault's isolate task before the rest of another cluster's storm
and before every follow-up step: each cluster's isolation has its own queue, read in turn (kombu's round
robin), and isolation goes ahead of the steps (message priorities)."""

from __future__ import annotations

from typing import Any

import redis
from kombu import Exchange, Queue

from remediation.adapters.celery import (
    ISOLATE_TASK,
    WORKFLOW_QUEUE,
    CeleryDispatcher,
    isolate_queue,
    make_app,
    step_task,
)
from remediation.ports.dispatch import FollowUp
from remediation.settings import Settings
from tests.conftest import REDIS_URL


def test_a_lone_fault_is_taken_before_the_rest_of_a_storm(redis_client: redis.Redis, redis_prefix: str) -> None:
    app = make_app(Settings(broker={"redis_url": REDIS_URL, "key_prefix": redis_prefix}))
    names = [isolate_queue("east"), isolate_queue("west"), WORKFLOW_QUEUE]
    queues = [Queue(name, Exchange(name), routing_key=name) for name in names]  # as a worker declares them
    taken: list[tuple[str, Any]] = []

    def took(body: Any, message: Any) -> None:
        taken.append((message.headers["task"], body[0]))
        message.ack()

    with app.connection_for_write() as conn:
        for queue in queues:
            queue(conn.default_channel).declare()
    dispatcher = CeleryDispatcher(app, isolate_batch=2)
    dispatcher.steps([FollowUp(i, "slurm_drain") for i in range(1, 8)], "east")  # east: seven nodes at once
    dispatcher.steps([FollowUp(1, "return")], "east")  # east's first, isolated, moves on
    dispatcher.steps([FollowUp(9, "slurm_drain")], "west")  # west: one node, in a later batch
    with app.connection_for_read() as conn, conn.Consumer(queues, callbacks=[took], accept=["json"],
                                                          prefetch_count=1):
        while len(taken) < 6:
            conn.drain_events(timeout=5)
    assert taken[:2] == [(ISOLATE_TASK, [[1, 2]]), (ISOLATE_TASK, [[9]])]
    assert taken[2:] == [(ISOLATE_TASK, [[3, 4]]), (ISOLATE_TASK, [[5, 6]]), (ISOLATE_TASK, [[7]]),
                         (step_task("return"), [1])]  # fmt: skip
