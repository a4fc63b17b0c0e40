"""The ingest task queues each cluster's follow-ups, naming the cluster (its own isolate queue), as soon as
that part of a batch is recorded, not once the whole backlog is read: a fault read early in a long
backlog is isolated while the rest is read."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from remediation.adapters import memstream
from remediation.domain.admission import Published
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.ports.dispatch import FollowUp
from remediation.workers import tasks


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, object]]]:
    """What the task did, in order: each cluster's part it recorded, and each dispatch of follow-ups."""
    done: list[tuple[str, object]] = []

    def recorded(rt: object, cluster: str, payloads: Sequence[bytes]) -> tuple[list[FollowUp], list[int]]:
        done.append(("recorded", cluster))
        return [FollowUp(len(done), "slurm_drain")], []

    rt = SimpleNamespace(embedded=True, settings=SimpleNamespace(broker=SimpleNamespace(ingest_batch=2)))
    monkeypatch.setattr(tasks.DomainTask, "rt", property(lambda self: rt))
    monkeypatch.setattr(tasks, "ingest_cluster", recorded)
    monkeypatch.setattr(tasks, "enqueue", lambda followups, cluster, repairs: done.append(
        ("queued", cluster, [f.remediation_id for f in followups])))
    memstream._queue.clear()
    yield done
    memstream._queue.clear()


def published(cluster: str, node: str) -> Published:
    event = NodeEvent(source=Source.SLURM, cluster=cluster, node=node, kind=EventKind.UNHEALTHY, state="DOWN",
                      observed_at=datetime(2026, 3, 1, tzinfo=UTC))
    return Published(event.to_json().encode(), None, cluster)


def test_each_clusters_follow_ups_are_queued_as_its_part_of_a_batch_is_recorded(steps) -> None:
    memstream._queue.extend([published("east", "gpu-node-1"), published("west", "gpu-node-1"),
                             published("west", "gpu-node-2"), published("west", "gpu-node-3")])
    assert tasks.ingest() == 4
    assert steps == [("recorded", "east"), ("queued", "east", [1]), ("recorded", "west"), ("queued", "west", [3]),
                     ("recorded", "west"), ("queued", "west", [5])]  # the second batch  # fmt: skip


def test_a_clusters_lone_fault_is_recorded_before_another_clusters_storm_in_the_same_batch(
        steps, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks.DomainTask, "rt", property(lambda self: SimpleNamespace(
        embedded=True, settings=SimpleNamespace(broker=SimpleNamespace(ingest_batch=500)))))
    storm = [published("east", f"gpu-node-{i}") for i in range(5)]
    memstream._queue.extend([*storm, published("west", "gpu-node-1")])  # the storm was read first
    assert tasks.ingest() == 6
    assert [step[:2] for step in steps] == [("recorded", "west"), ("queued", "west"), ("recorded", "east"),
                                            ("queued", "east")]
