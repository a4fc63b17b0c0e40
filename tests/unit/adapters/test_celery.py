"""The dispatcher's priorities: a burst's first isolate task ahead of the rest of any burst and of every
other step, so one cluster's storm cannot bury another cluster's lone fault (docs/architecture.md)."""

from __future__ import annotations

from typing import Any

from remediation.adapters.celery import ISOLATE_TASK, CeleryDispatcher, step_task
from remediation.ports.dispatch import FollowUp


class Broker:
    """The workflow queue as kombu's Redis transport serves it: lowest priority first, then in order sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, int, str, Any]] = []

    def send_task(self, name: str, args: Any = None, countdown: Any = None, queue: str = "",
                  priority: int = 0) -> None:
        self.sent.append((priority, len(self.sent), name, args))

    def taken(self) -> list[tuple[str, Any]]:
        return [(name, args) for _, _, name, args in sorted(self.sent)]


def test_a_lone_fault_is_isolated_before_the_rest_of_another_clusters_storm_and_its_steps() -> None:
    broker = Broker()
    dispatcher = CeleryDispatcher(broker, isolate_batch=2)  # type: ignore[arg-type]
    dispatcher.steps([FollowUp(i, "slurm_drain") for i in range(1, 6)])  # cluster A: five nodes at once
    dispatcher.steps([FollowUp(i, "return") for i in range(1, 3)])  # A's first two, isolated, move on
    dispatcher.steps([FollowUp(9, "slurm_drain")])  # cluster B: one node, in the ingest's next call
    assert broker.taken()[:2] == [(ISOLATE_TASK, [[1, 2]]), (ISOLATE_TASK, [[9]])]
    assert broker.taken()[2:] == [(ISOLATE_TASK, [[3, 4]]), (ISOLATE_TASK, [[5]]),
                                  (step_task("return"), [1]), (step_task("return"), [2])]  # fmt: skip

