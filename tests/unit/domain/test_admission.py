"""What an event read from the stream may claim: no human's report, no time beyond the clock bounds,
and a future observed_at within the skew clamped to the ingest's clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from remediation.domain.admission import Publisher, Refusal, Rejection, Reportable, TimeBounds, admit
from remediation.domain.events import EventKind, Fence, InvalidEvent, NodeEvent, Source

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
BOUNDS = TimeBounds(skew=timedelta(minutes=5), age=timedelta(days=1))


def event(source: Source = Source.SLURM, **times: datetime) -> NodeEvent:
    return NodeEvent(
        source=source,
        node="gpu-node-1",
        kind=EventKind.UNHEALTHY,
        state="FAIL",
        reason="xid 79",
        **{"observed_at": NOW, **times},
    )


@pytest.mark.parametrize(
    ("ev", "refusal"),
    [
        (event(Source.MANUAL), Refusal.MANUAL),
        (event(observed_at=NOW + timedelta(minutes=6)), Refusal.FUTURE),
        (event(since=NOW + timedelta(hours=1)), Refusal.FUTURE),
        (event(published_at=NOW + timedelta(days=300)), Refusal.FUTURE),
        (event(observed_at=NOW - timedelta(days=1, seconds=1)), Refusal.STALE),
    ],
    ids=[
        "manual",
        "observed past the skew",
        "begun past the skew",
        "published past the skew",
        "older than the age",
    ],
)
def test_an_event_the_stream_may_not_report_is_refused(ev: NodeEvent, refusal: Refusal) -> None:
    verdict = admit(ev, NOW, BOUNDS)
    assert isinstance(verdict, Rejection) and verdict.refusal is refusal
    assert str(verdict).startswith(f"{refusal.value}: ")


def test_a_future_time_within_the_skew_is_clamped_to_the_ingests_clock() -> None:
    ahead = NOW + timedelta(minutes=4)
    admitted = admit(event(observed_at=ahead, since=ahead), NOW, BOUNDS)
    assert isinstance(admitted, NodeEvent)
    assert admitted.observed_at == NOW and admitted.since == NOW
    assert admitted.dedupe_key == event(observed_at=ahead).dedupe_key  # the same condition as published


def test_an_event_within_the_bounds_is_taken_as_written() -> None:
    ev = event(observed_at=NOW - timedelta(hours=23))
    assert admit(ev, NOW, BOUNDS) is ev


def test_without_bounds_only_a_humans_report_is_refused() -> None:
    far = event(observed_at=NOW + timedelta(days=3650))
    assert admit(far, NOW, None) is far
    assert isinstance(admit(event(Source.MANUAL), NOW, None), Rejection)


@pytest.mark.parametrize(
    "stamp", ["9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00"], ids=["last", "first"]
)
def test_a_time_no_utc_datetime_holds_is_an_invalid_event(stamp: str) -> None:
    payload = (
        '{"source": "slurm", "node": "gpu-node-1", "kind": "unhealthy", "state": "FAIL", '
        f'"observed_at": "{stamp}"}}'
    )
    with pytest.raises(InvalidEvent, match="observed_at"):
        NodeEvent.parse(payload)


def fenced(lock: str = "slurm", token: int = 5, source: Source = Source.SLURM) -> NodeEvent:
    return event(source).model_copy(update={"fence": Fence(lock=lock, token=token)})


@pytest.mark.parametrize(
    ("ev", "publisher", "counters", "refusal"),
    [
        (fenced(source=Source.KUBERNETES), Publisher.SLURM, {"slurm": 9}, Refusal.FOREIGN_SOURCE),
        (fenced("kube"), Publisher.SLURM, {"slurm": 9, "kube": 9}, Refusal.FOREIGN_FENCE),
        (fenced(token=10), Publisher.SLURM, {"slurm": 9}, Refusal.FORGED_TOKEN),
        (fenced(), Publisher.SLURM, {}, Refusal.FORGED_TOKEN),
        (event(), Publisher.SLURM, {"slurm": 9}, Refusal.UNFENCED),
        (fenced("kube", 10), None, {"kube": 9}, Refusal.FORGED_TOKEN),
    ],
    ids=[
        "another source",
        "another lock's fence",
        "above the counter",
        "a lock that drew none",
        "unfenced",
        "the workers' stream, above the counter",
    ],
)
def test_a_publisher_reports_its_own_source_under_its_own_fence(
    ev: NodeEvent, publisher: Publisher | None, counters: dict[str, int], refusal: Refusal
) -> None:
    verdict = admit(ev, NOW, BOUNDS, publisher=publisher, counters=counters)
    assert isinstance(verdict, Rejection) and verdict.refusal is refusal, verdict


@pytest.mark.parametrize(
    ("ev", "publisher", "counters"),
    [
        (fenced(token=9), Publisher.SLURM, {"slurm": 9}),
        (fenced(source=Source.KUBERNETES, lock="kube"), Publisher.KUBE, {"kube": 9}),
        (event(), Publisher.SLURM, {}),
        (fenced(token=10**12), Publisher.SLURM, None),
    ],
    ids=["its token", "the kube watcher's", "unfenced before its lock drew a token", "counters not read"],
)
def test_what_its_publisher_may_report_is_admitted(
    ev: NodeEvent, publisher: Publisher, counters: dict[str, int] | None
) -> None:
    assert isinstance(admit(ev, NOW, BOUNDS, publisher=publisher, counters=counters), NodeEvent)


def fact(source: Source, kind: EventKind, **facts: object) -> NodeEvent:
    return NodeEvent(source=source, node="gpu-node-1", kind=kind, state="x", reason="", observed_at=NOW, **facts)


REPORTABLE = Reportable(label_domains=frozenset({"nvidia.com/gpu.clique"}), profile_labels=frozenset({"pool"}))


@pytest.mark.parametrize(
    ("publisher", "ev", "why"),
    [
        (Publisher.SLURM, fact(Source.SLURM, EventKind.DOMAINS, domains={"nvidia.com/gpu.clique": "c.1"}),
         "no domain of kind nvidia.com/gpu.clique"),
        (Publisher.KUBE, fact(Source.KUBERNETES, EventKind.DOMAINS, domains={"block": "b1"}), "of kind block"),
        (Publisher.KUBE, fact(Source.KUBERNETES, EventKind.LABELS, labels={"tier": "gold"}), "no label tier"),
        (Publisher.SLURM, fact(Source.SLURM, EventKind.LABELS, labels={"pool": "shadow"}), "no label pool"),
        (Publisher.KUBE, fact(Source.KUBERNETES, EventKind.INVENTORY, partitions=["gpu"]), "no partitions"),
    ],
    ids=["slurm-label-domain", "kube-slurm-domain", "kube-unselected-label", "slurm-labels", "kube-inventory"],
)
def test_a_fact_its_publishers_source_does_not_have_is_refused(
    publisher: Publisher, ev: NodeEvent, why: str
) -> None:
    verdict = admit(ev, NOW, BOUNDS, publisher=publisher, counters=None, reportable=REPORTABLE)
    assert isinstance(verdict, Rejection) and verdict.refusal is Refusal.FOREIGN_FACT
    assert why in verdict.detail


@pytest.mark.parametrize(
    ("publisher", "ev"),
    [
        (Publisher.SLURM, fact(Source.SLURM, EventKind.DOMAINS, domains={"block": "b1", "leaf-switch": "s1"})),
        (Publisher.SLURM, fact(Source.SLURM, EventKind.INVENTORY, partitions=["gpu"], features=["h100"])),
        (Publisher.KUBE, fact(Source.KUBERNETES, EventKind.DOMAINS, domains={"nvidia.com/gpu.clique": "c.1"})),
        (Publisher.KUBE, fact(Source.KUBERNETES, EventKind.LABELS, labels={"pool": "a"})),
        (Publisher.KUBE, fact(Source.KUBERNETES, EventKind.DOMAINS, domains={})),
    ],
    ids=["slurm-topology", "slurm-inventory", "kube-clique", "kube-selected-label", "kube-no-domains"],
)
def test_the_facts_its_source_has_are_admitted(publisher: Publisher, ev: NodeEvent) -> None:
    assert admit(ev, NOW, BOUNDS, publisher=publisher, counters=None, reportable=REPORTABLE) == ev
