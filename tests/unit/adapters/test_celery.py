"""The dispatcher puts each cluster's isolation on that cluster's own queue, ahead of every other step,
so one cluster's storm cannot bury another cluster's lone fault (docs/architecture.md)."""

from __future__ import annotations

from typing import Any

from remediation.adapters.celery import (
    ISOLATE_TASK,
    ISOLATION,
    LATER_STEP,
    WORKFLOW_QUEUE,
    CeleryDispatcher,
    isolate_queue,
    step_task,
)
from remediation.ports.dispatch import FollowUp


class Broker:
    def __init__(self) -> None:
        self.sent: list[tuple[str, int, str, Any]] = []

    def send_task(self, name: str, args: Any = None, countdown: Any = None, queue: str = "",
                  priority: int = 0) -> None:
        self.sent.append((queue, priority, name, args))


def test_each_clusters_isolation_goes_on_its_own_queue_ahead_of_the_steps() -> None:
    broker = Broker()
    dispatcher = CeleryDispatcher(broker, isolate_batch=2)  # type: ignore[arg-type]
    dispatcher.steps([FollowUp(i, "slurm_drain") for i in range(1, 4)] + [FollowUp(5, "return")], "east")
    dispatcher.steps([FollowUp(9, "slurm_drain")], "west")
    assert broker.sent == [
        (isolate_queue("east"), ISOLATION, ISOLATE_TASK, [[1, 2]]),
        (isolate_queue("east"), ISOLATION, ISOLATE_TASK, [[3]]),
        (WORKFLOW_QUEUE, LATER_STEP, step_task("return"), [5]),
        (isolate_queue("west"), ISOLATION, ISOLATE_TASK, [[9]]),
    ]
    assert ISOLATION < LATER_STEP  # kombu's Redis transport serves the lower number first


def test_isolation_no_caller_names_a_cluster_for_goes_on_the_workflow_queue() -> None:
    broker = Broker()
    CeleryDispatcher(broker, isolate_batch=2).steps([FollowUp(1, "slurm_drain")])  # type: ignore[arg-type]
    assert broker.sent == [(WORKFLOW_QUEUE, ISOLATION, ISOLATE_TASK, [[1]])]
