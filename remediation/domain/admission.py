"""Admission: what an event read from the stream may claim, judged before it is recorded.

An event is refused when it claims to be a human's report (``source: manual``) or another source's,
carries another lock's fence, a token its lock never handed out, or no fence where one is due, or has
times beyond the clock-skew bound; an ``observed_at`` a little ahead of the ingest's clock is clamped
to it. Rules alone, on plain values; :mod:`remediation.services.payloads` applies them to each payload.

Why: docs/architecture.md#believe-nothing-unchecked
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from remediation.domain.events import NodeEvent, Source
from remediation.domain.topology import BLOCK, LEAF_SWITCH, SWITCH
from remediation.vocabulary import DEFAULT_CLUSTER


class Refusal(StrEnum):
    """Why an event from the stream is not recorded; the first word of its ``rejected_events`` row."""

    UNPARSEABLE = "unparseable"  # not a NodeEvent, however it failed
    OVERSIZE = "oversize"  # larger than broker.max_event_bytes
    MANUAL = "manual"  # a human's report, which only the API or the CLI may record
    FUTURE = "future"  # observed (or begun, or published) beyond the skew bound ahead of the ingest's clock
    STALE = "stale"  # observed longer ago than the age bound
    FOREIGN_SOURCE = "foreign-source"  # another source's event on a watcher's stream
    FOREIGN_FENCE = "foreign-fence"  # a fence of a lock its publisher may not hold
    FORGED_TOKEN = "forged-token"  # a token above what its lock's counter ever handed out
    UNFENCED = "unfenced"  # no fence, from a publisher whose lock hands out tokens
    FOREIGN_FACT = "foreign-fact"  # a domain kind, label key or inventory field its source does not have
    FOREIGN_CLUSTER = "foreign-cluster"  # another cluster's event on this cluster's stream


class Publisher(StrEnum):
    """A watcher, as the stream it appends to names it (``<prefix>:events:<publisher>``, the only
    stream its Redis user may write); also the name of its leader lock."""

    SLURM = "slurm"
    KUBE = "kube"


class Published(bytes):
    """A stream entry's payload with the :class:`Publisher` whose stream it was read from (None: the
    workers' own stream) and the cluster that stream is of. Still bytes, so whatever handles payloads
    handles it unchanged."""

    publisher: Publisher | None
    cluster: str

    def __new__(cls, payload: bytes, publisher: Publisher | None, cluster: str = DEFAULT_CLUSTER) -> Published:
        made = super().__new__(cls, payload)
        made.publisher = publisher
        made.cluster = cluster
        return made


#: The one source each publisher reports.
SOURCE_OF = {Publisher.SLURM: Source.SLURM, Publisher.KUBE: Source.KUBERNETES}


@dataclass(frozen=True)
class Reportable:
    """What a watcher may say of a node besides its health: the Slurm watcher its topology's switch
    and block kinds and the node's partitions and features; the Kubernetes watcher the label keys
    configured as failure domains (``incidents.label_keys``) and those the profiles select on. None:
    not checked (a setting this ingest was not given)."""

    label_domains: frozenset[str] | None = None
    profile_labels: frozenset[str] | None = None

    def domain_kinds(self, publisher: Publisher) -> frozenset[str] | None:
        if publisher is Publisher.SLURM:
            return frozenset({LEAF_SWITCH, SWITCH, BLOCK})
        return self.label_domains


@dataclass(frozen=True)
class Rejection:
    """An event (or a payload) refused, and why: ``refusal`` is what code branches on, ``detail`` is
    for people."""

    refusal: Refusal
    detail: str

    def __str__(self) -> str:
        return f"{self.refusal.value}: {self.detail}"


@dataclass(frozen=True)
class TimeBounds:
    """How far an event's timestamps may be from the ingest's clock: ``skew`` ahead, ``age`` behind."""

    skew: timedelta
    age: timedelta


def admit(
    event: NodeEvent,
    now: datetime,
    bounds: TimeBounds | None,
    *, publisher: Publisher | None = None,
    counters: Mapping[str, int] | None = None,
    reportable: Reportable | None = None,
) -> NodeEvent | Rejection:
    """``event`` as the ingest records it (its future timestamps clamped to ``now``), or why not.
    ``publisher``: the stream it was read from (None: the workers' own, which no watcher may write).
    ``counters``: each lock's fencing-token counter as Redis holds it now (None: not checked).
    ``reportable``: the facts each publisher may report (None: not checked).
    Without ``bounds`` the timestamps are taken as written (a rehearsal's simulated clock)."""
    if event.source is Source.MANUAL:
        return Rejection(
            Refusal.MANUAL, "a human's report comes through the API or the CLI, never the stream"
        )
    if (refused := bound(event, publisher, counters)) is not None:
        return refused
    if publisher is not None and reportable is not None and (why := foreign_fact(event, publisher, reportable)):
        return Rejection(Refusal.FOREIGN_FACT, why)
    if bounds is None:
        return event
    ahead = now + bounds.skew
    for name, at in (
        ("observed_at", event.observed_at),
        ("since", event.since),
        ("published_at", event.published_at),
    ):
        if at is not None and at > ahead:
            return Rejection(
                Refusal.FUTURE,
                f"{name} {at.isoformat()} is more than {_seconds(bounds.skew)} "
                f"ahead of the ingest's clock ({now.isoformat()})",
            )
    if event.observed_at < now - bounds.age:
        return Rejection(
            Refusal.STALE,
            f"observed_at {event.observed_at.isoformat()} is more than "
            f"{_seconds(bounds.age)} before the ingest's clock ({now.isoformat()})",
        )
    clamped = {
        name: now
        for name, at in (("observed_at", event.observed_at), ("since", event.since))
        if at is not None and at > now
    }
    return event.model_copy(update=clamped) if clamped else event


def foreign_cluster(event: NodeEvent, cluster: str | None) -> Rejection | None:
    """Why ``event`` is not to be recorded as ``cluster``'s, the cluster whose stream it was read from
    (None: it is, or it was not read from a stream): a watcher reports only its own cluster's nodes."""
    if cluster is None or event.cluster == cluster:
        return None
    return Rejection(Refusal.FOREIGN_CLUSTER, f"an event of cluster {event.cluster} on cluster {cluster}'s stream")


def bound(
    event: NodeEvent, publisher: Publisher | None, counters: Mapping[str, int] | None
) -> Rejection | None:
    """Why ``event`` is not its publisher's to report (None: it is). A watcher reports its own source,
    stamped with its own lock's fence once that lock hands out tokens; and no token may be above its
    lock's counter, which only the lock's script raises."""
    fence = event.fence
    if publisher is not None:
        if event.source is not SOURCE_OF[publisher]:
            why = f"a {event.source.value} event on the {publisher.value} stream"
            return Rejection(Refusal.FOREIGN_SOURCE, why)
        if fence is None and counters is not None and publisher.value in counters:
            why = (
                f"no fence, and the {publisher.value} lock hands out tokens (at {counters[publisher.value]})"
            )
            return Rejection(Refusal.UNFENCED, why)
        if fence is not None and fence.lock != publisher.value:
            why = f"the {fence.lock} lock's fence on the {publisher.value} stream"
            return Rejection(Refusal.FOREIGN_FENCE, why)
    if fence is None or counters is None:
        return None
    drawn = counters.get(fence.lock)
    if drawn is None or fence.token > drawn:
        at = "has never handed one out" if drawn is None else f"is at {drawn}"
        why = f"{fence.lock} token {fence.token} was never handed out: the lock's counter {at}"
        return Rejection(Refusal.FORGED_TOKEN, why)
    return None


def foreign_fact(event: NodeEvent, publisher: Publisher, reportable: Reportable) -> str | None:
    """What in ``event`` its publisher's source does not have (None: nothing): a domain kind, a label
    key, or an inventory field, each of which would re-profile nodes or group them into incidents."""
    kinds = reportable.domain_kinds(publisher)
    if event.domains and kinds is not None and (extra := sorted(set(event.domains) - kinds)):
        return f"the {publisher.value} watcher reports no domain of kind {', '.join(extra)}"
    if event.labels is not None:
        keys = reportable.profile_labels if publisher is Publisher.KUBE else frozenset()
        if keys is not None and (extra := sorted(set(event.labels) - keys)):
            return f"the {publisher.value} watcher reports no label {', '.join(extra)}"
    if publisher is not Publisher.SLURM and (event.partitions is not None or event.features is not None):
        return f"the {publisher.value} watcher reports no partitions or features"
    return None


def _seconds(span: timedelta) -> str:
    return f"{int(span.total_seconds())} s"
