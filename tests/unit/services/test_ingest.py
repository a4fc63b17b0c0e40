"""urgent_first: which payloads of a batch the ingest records first."""

from __future__ import annotations

from datetime import UTC, datetime

from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.services.ingest import urgent_first
from remediation.settings import PolicySettings

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def payload(node: str, reason: str, state: str = "GpuXidError=True") -> bytes:
    return NodeEvent(source=Source.KUBERNETES, node=node, kind=EventKind.UNHEALTHY, state=state, reason=reason,
                     observed_at=T0).to_json().encode()  # fmt: skip


APP = "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception"
FATAL = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus"


def test_a_faults_node_goes_first_with_all_its_events_in_order() -> None:
    batch = [payload("a", APP), payload("b", APP), b"not json", payload("b", FATAL), payload("c", APP)]
    first, rest = urgent_first(batch, PolicySettings())
    assert first == [batch[1], batch[3]]  # b's application XID stays before its fault
    assert rest == [batch[0], batch[2], batch[4]]  # the noise and what does not parse, in order


def test_a_batch_of_one_kind_is_one_part() -> None:
    noise = [payload("a", APP), payload("b", APP)]
    faults = [payload("a", FATAL)]
    assert urgent_first(noise, PolicySettings()) == (noise, [])
    assert urgent_first(faults, PolicySettings()) == (faults, [])
