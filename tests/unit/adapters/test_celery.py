"""The dispatcher puts each cluster's isolation on that cluster's own queue, ahead of every other step,
so one cluster's storm cannot bury another cluster's lone fault (docs/architecture.md)."""

from __future__ import annotations

from datetime import UTC, datetime
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
        self.kwargs: list[dict[str, Any]] = []

    def send_task(self, name: str, args: Any = None, countdown: Any = None, queue: str = "",
                  priority: int = 0, kwargs: Any = None) -> None:
        self.sent.append((queue, priority, name, args))
        self.kwargs.append(kwargs or {})


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


def test_a_step_carries_the_schedule_it_was_sent_for() -> None:
    broker = Broker()
    due = datetime(2026, 3, 1, 12, 0, 5, 123456, tzinfo=UTC)
    CeleryDispatcher(broker, isolate_batch=2).steps([FollowUp(5, "vm_restart", 5.0, due=due),  # type: ignore[arg-type]
                                                     FollowUp(6, "return")])
    assert broker.kwargs == [{"due": "2026-03-01T12:00:05.123456+00:00"}, {}]
    assert datetime.fromisoformat(broker.kwargs[0]["due"]) == due  # read back to the microsecond
