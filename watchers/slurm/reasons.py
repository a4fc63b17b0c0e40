"""Which part of a Slurm node's reason belongs to the fault the watcher sees now.

Slurm 24.11 keeps a node's reason after a resume. The kept reason is learnt from the node's history (a
reason shown while in service or merely not responding) and cut from its next DOWN; a DRAIN or FAIL keeps
its reason. Pure: no I/O.

Why: docs/slurm-releases.md#kept-reasons
"""

from __future__ import annotations

from remediation.adapters.slurm.parse import NodeRecord
from remediation.domain.slurm_states import VERDICTS, SlurmState

#: What slurmctld writes between a kept reason and its own when it marks a node DOWN.
APPENDED = " : "


def _history_shown(status: NodeRecord) -> bool:
    """True when slurmctld has set no reason for the node's present state: in service, or only not
    responding (no verdict, not DOWN)."""
    return status.states.isdisjoint(VERDICTS | {SlurmState.DOWN})


class KeptReasons:
    """Each node's reason from an earlier episode, as last seen; ``strip`` cuts it from fresh reads."""

    def __init__(self) -> None:
        self._kept: dict[str, str] = {}
        # Each node's last record in and what it became: a reader hands back the same object for a node
        # that did not change, and cutting it again would give the same, so a poll costs what changed.
        self._last: dict[str, tuple[NodeRecord, NodeRecord]] = {}

    def get(self, name: str) -> str | None:
        return self._kept.get(name)

    def strip(self, current: dict[str, NodeRecord]) -> dict[str, NodeRecord]:
        """Replace, in ``current``, every record whose reason is (or starts with) its node's kept reason
        by one carrying only the new fault's reason; remember what each node shows as history."""
        last = self._last
        for name, status in current.items():
            seen = last.get(name)
            if seen is not None and seen[0] is status:
                cut = seen[1]
            else:
                cut = self._cut(name, status)
                last[name] = (status, cut)
            if cut is not status:
                current[name] = cut
        return current

    def _cut(self, name: str, status: NodeRecord) -> NodeRecord:
        if _history_shown(status):
            if not status.reason:
                self._kept.pop(name, None)
                return status
            self._kept[name] = status.reason
            if SlurmState.NOT_RESPONDING not in status.states:
                return status  # in service: nothing is published about its reason
            return status._replace(reason="", reason_user=None, reason_changed_at=0)
        kept = self._kept.get(name)
        if kept is None:
            return status
        if not status.states.isdisjoint(VERDICTS):
            del self._kept[name]
            return status
        if status.reason == kept:
            return status._replace(reason="", reason_user=None, reason_changed_at=0)
        if status.reason.startswith(kept + APPENDED):
            return status._replace(reason=status.reason[len(kept) + len(APPENDED) :])
        del self._kept[name]
        return status
