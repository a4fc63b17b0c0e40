"""Flap suppression for Kubernetes Node conditions: publish a bad condition only once it has held.

A bad ``Type=Status`` pair starts an *episode*, published once it has lasted ``min_hold_s`` and still
bad then; its end is published as a recovery. ``lastTransitionTime`` dates the start only when clearly
older than our first sighting (by more than ``skew_s``). Pure, on an injected clock: the watcher turns
the returned :class:`Change` values into NodeEvents.

Why: docs/policy.md#a-conditions-hold-when-its-episode-began
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from remediation.domain.events import EventKind


@dataclass(frozen=True)
class Condition:
    """One entry of a Node's ``status.conditions``."""

    type: str
    status: str
    message: str = ""
    last_transition: datetime | None = None


@dataclass(frozen=True)
class Change:
    """Something to publish: a bad condition that held (UNHEALTHY) or its end (HEALTHY)."""

    node: str
    kind: EventKind
    state: str  # "Ready=False"
    message: str
    key: str
    since: datetime  # start of the episode (UNHEALTHY) or the moment it ended (HEALTHY)
    at: datetime | None = None  # when the filter decided it: the hold ended, or the end was seen


@dataclass
class _Episode:
    status: str
    message: str
    last_transition: datetime | None
    since: datetime
    published: Change | None = None


def parse_bad(conditions: Iterable[str]) -> dict[str, frozenset[str]]:
    """``["Ready=False", "Ready=Unknown"]`` -> ``{"Ready": {"False", "Unknown"}}``."""
    bad: dict[str, set[str]] = {}
    for item in conditions:
        type_, _, status = item.partition("=")
        if not type_ or not status:
            raise ValueError(f"condition {item!r} must look like Type=Status")
        bad.setdefault(type_.strip(), set()).add(status.strip())
    return {k: frozenset(v) for k, v in bad.items()}


def _key(node: str, type_: str, status: str, *, at: datetime | None, fallback: datetime) -> str:
    return f"k8s:{node}:{type_}={status}:{(at or fallback).isoformat()}"


class FlapFilter:
    def __init__(
        self,
        bad: Iterable[str],
        min_hold_s: float,
        clock: Callable[[], datetime],
        *, skew_s: float = 5.0,
    ) -> None:
        self.bad = parse_bad(bad)
        self.hold = timedelta(seconds=min_hold_s)
        self.skew = timedelta(seconds=skew_s)
        self.clock = clock
        self._episodes: dict[tuple[str, str], _Episode] = {}

    def observe(self, node: str, conditions: Iterable[Condition]) -> list[Change]:
        """Take a Node's current conditions; return what is due now (for this node)."""
        now = self.clock()
        current = {c.type: c for c in conditions if c.type in self.bad}
        changes: list[Change] = []
        for type_ in self.bad:
            cond = current.get(type_)
            episode = self._episodes.get((node, type_))
            if cond is not None and cond.status in self.bad[type_]:
                if episode is None:
                    since = now
                    if cond.last_transition is not None and cond.last_transition < now - self.skew:
                        since = cond.last_transition
                    self._episodes[(node, type_)] = _Episode(
                        cond.status, cond.message, cond.last_transition, since
                    )
                else:
                    episode.status, episode.message = cond.status, cond.message
                    episode.last_transition = cond.last_transition
            elif episode is not None:
                del self._episodes[(node, type_)]
                if episode.published is not None:
                    status = cond.status if cond is not None else "Absent"
                    at = cond.last_transition if cond is not None else None
                    changes.append(
                        Change(
                            node,
                            EventKind.HEALTHY,
                            f"{type_}={status}",
                            cond.message if cond is not None else "",
                            _key(node, type_, status, at=at, fallback=now),
                            now,
                            now,
                        )
                    )
        return changes + self._due(now, node)

    def forget(self, node: str) -> None:
        """The Node is gone: drop its episodes without publishing anything."""
        for key in [k for k in self._episodes if k[0] == node]:
            del self._episodes[key]

    def relist(self, nodes: Mapping[str, Iterable[Condition]]) -> list[Change]:
        """A full list replaces what we knew: observe every Node, forget the ones that vanished."""
        for node in {n for n, _ in self._episodes} - set(nodes):
            self.forget(node)
        changes: list[Change] = []
        for node, conditions in nodes.items():
            changes.extend(self.observe(node, conditions))
        return changes

    def due(self) -> list[Change]:
        """Episodes whose hold has elapsed by now and that are not yet published."""
        return self._due(self.clock(), None)

    def next_due(self) -> datetime | None:
        pending = [e.since + self.hold for e in self._episodes.values() if e.published is None]
        return min(pending, default=None)

    def published(self) -> list[Change]:
        """The bad conditions currently published (re-published on resync; same dedupe keys)."""
        return [e.published for e in self._episodes.values() if e.published is not None]

    def _due(self, now: datetime, node: str | None) -> list[Change]:
        changes = []
        for (name, type_), episode in self._episodes.items():
            if (
                episode.published is None
                and (node is None or name == node)
                and now - episode.since >= self.hold
            ):
                episode.published = Change(
                    name,
                    EventKind.UNHEALTHY,
                    f"{type_}={episode.status}",
                    episode.message,
                    _key(name, type_, episode.status, at=episode.last_transition, fallback=episode.since),
                    episode.since,
                    now,
                )
                changes.append(episode.published)
        return changes
