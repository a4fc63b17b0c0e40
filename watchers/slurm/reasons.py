"""Which part of a Slurm node's reason belongs to the fault the watcher sees now.

Slurm 24.11 keeps a node's last reason after the node is resumed (22.05 clears it). When that node
later stops responding, slurmctld shows the old reason beside NOT_RESPONDING, and when it marks the
node DOWN it appends its own: "OLD : Not responding", stamped anew (seen on 24.11.5). A reason from an
earlier episode is not the reason of the new fault: an old ``remediation:`` reason would make a new
fault look like our own action, and an old human reason would put it on the ignore list.

The kept reason is learnt from the node's own history, never from its wording: slurmctld sets no reason
of its own for a node that is in service or merely not responding, so a reason shown then is history
(whatever its text, including a kept "Not responding"). The first read counts too, so a watcher that
starts while a node is between a resume and its next ping learns the kept reason there. Once the node
is DOWN, the kept reason, or the kept reason and slurmctld's " : " before its own words, is cut off. A
DRAIN or FAIL is a new verdict (a human's or ours) and keeps its reason as set; so does a DOWN whose
reason does not start with the kept one. A watcher that first sees a node already DOWN has no history
and takes the reason as read. Pure: no I/O.
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

    def get(self, name: str) -> str | None:
        return self._kept.get(name)

    def strip(self, current: dict[str, NodeRecord]) -> dict[str, NodeRecord]:
        """Replace, in ``current``, every record whose reason is (or starts with) its node's kept reason
        by one carrying only the new fault's reason; remember what each node shows as history."""
        for name, status in current.items():
            cut = self._cut(name, status)
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
