"""Compare two snapshots of Slurm's nodes: which nodes turned bad, which recovered, which came and went.

A wire parser gives the watcher one :class:`~remediation.adapters.slurm.parse.NodeRecord` per node and
poll; this module decides what changed between two polls and names each bad condition with a key that
stays the same across polls, resyncs and watcher restarts, so the same condition is one event however
often it is seen. Pure functions over records, no I/O.

Why: docs/running.md#the-watchers
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from remediation.adapters.slurm.parse import NodeRecord
from remediation.domain.slurm_states import SlurmState

#: States that make a node "bad" for the watcher, most telling first: the first one a node has is the
#: state its event carries. FAIL and DOWN say more than DRAIN (a researcher's or slurmctld's verdict),
#: and NOT_RESPONDING alone is usually the first step towards DOWN.
BAD_PRIORITY = (SlurmState.FAIL, SlurmState.DOWN, SlurmState.DRAIN, SlurmState.NOT_RESPONDING)


def bad_state(status: NodeRecord, bad: frozenset[str]) -> str | None:
    """The state an event about this node carries, or None if the node is healthy."""
    states = status.flags | {status.state}
    if states.isdisjoint(bad):
        return None
    for state in BAD_PRIORITY:
        if state in bad and state in states:
            return state
    return min(states & bad)


def condition_key(status: NodeRecord, state: str) -> str:
    """Identity of one bad condition, stable across polls, resyncs and watcher restarts.

    Slurm stamps every reason change (``reason_changed_at``), so state + reason time + reason names
    one condition. A bare NOT_RESPONDING has no reason; the slurmd start time then tells one outage of
    a slurmd from the next. The reason's hash tells apart two reasons set within the same second."""
    digest = hashlib.blake2s(status.reason.encode(), digest_size=4).hexdigest()
    stamp = status.reason_changed_at or f"s{status.slurmd_start_time}"
    return f"slurm:{status.name}:{state}:{stamp}:{digest}"


@dataclass
class SnapshotDiff:
    """What the watcher publishes for one poll."""

    unhealthy: list[tuple[NodeRecord, str]] = field(default_factory=list)  # (node, its bad state)
    healthy: list[tuple[NodeRecord, NodeRecord, str]] = field(default_factory=list)  # (now, before, bad state before)
    added: list[NodeRecord] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.unhealthy or self.healthy or self.added or self.removed)


def _condition(status: NodeRecord, bad: frozenset[str]) -> tuple[str, str, int, int] | None:
    state = bad_state(status, bad)
    if state is None:
        return None
    start = 0 if status.reason_changed_at else status.slurmd_start_time
    return state, status.reason, status.reason_changed_at, start


def diff(previous: Mapping[str, NodeRecord], current: Mapping[str, NodeRecord], bad: Iterable[str]) -> SnapshotDiff:
    """Transitions from ``previous`` to ``current``: nodes that entered a bad condition (or moved to
    another one), nodes that returned to health, nodes first seen and nodes gone. A node first seen
    in a bad state counts as a transition into it (the watcher has no earlier knowledge)."""
    bad_set = frozenset(s.upper() for s in bad)
    out = SnapshotDiff()
    for name, now in current.items():
        before = previous.get(name)
        if before is now:  # the memoised parser hands back the same object for unchanged nodes
            continue
        if before is None:
            out.added.append(now)
            state = bad_state(now, bad_set)
            if state is not None:
                out.unhealthy.append((now, state))
            continue
        if before == now:
            continue
        cond_now = _condition(now, bad_set)
        cond_before = _condition(before, bad_set)
        if cond_now == cond_before:
            continue
        if cond_now is not None:
            out.unhealthy.append((now, cond_now[0]))
        elif cond_before is not None:
            out.healthy.append((now, before, cond_before[0]))
    if len(previous) + len(out.added) != len(current):  # else no node can be gone: skip the pass
        out.removed = [name for name in previous if name not in current]
    return out
