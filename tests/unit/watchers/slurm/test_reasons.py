"""The Slurm watcher's kept reasons: what a node showed in service (or while only not responding) is
history, cut from the reason of the fault that follows, whatever its text. The sequences are the ones
slurmctld 24.11.5 printed for a killed slurmd (Reason and Timestamp as ``scontrol show node`` gave them)."""

from __future__ import annotations

import pytest

from remediation.adapters.slurm.parse import NodeRecord
from remediation.watchers.slurm.reasons import KeptReasons

NODE = "gpu-node-3"


def rec(state: str, flags: str = "", reason: str = "", at: int = 0) -> NodeRecord:
    return NodeRecord(
        NODE,
        state,
        frozenset(f for f in flags.split("+") if f),
        reason,
        "root" if reason else None,
        at,
        1_000,
    )


def seen(*reads: NodeRecord) -> list[str]:
    """The reason the watcher keeps from each read, in order."""
    kept = KeptReasons()
    return [kept.strip({NODE: r})[NODE].reason for r in reads]


CASES = {
    # A node resumed after an earlier outage keeps "Not responding"; slurmd dies again.
    "kept 'Not responding', seen in service first": (
        [
            rec("IDLE", "", "Not responding", 10),
            rec("IDLE", "NOT_RESPONDING", "Not responding", 10),
            rec("DOWN", "NOT_RESPONDING", "Not responding : Not responding", 50),
        ],
        ["Not responding", "", "Not responding"],
    ),
    # The watcher started between a resume and slurmctld's next ping: its first read is idle*.
    "kept 'Not responding', first seen not responding": (
        [
            rec("IDLE", "NOT_RESPONDING", "Not responding", 10),
            rec("DOWN", "NOT_RESPONDING", "Not responding : Not responding", 50),
        ],
        ["", "Not responding"],
    ),
    "kept reason of our own, first seen not responding": (
        [
            rec("IDLE", "NOT_RESPONDING", "remediation: xid 79", 10),
            rec("DOWN", "NOT_RESPONDING", "remediation: xid 79 : Not responding", 50),
        ],
        ["", "Not responding"],
    ),
    "kept human reason, whatever its text": (
        [
            rec("IDLE", "", "maintenance : PSU", 10),
            rec("DOWN", "NOT_RESPONDING", "maintenance : PSU : Not responding", 50),
        ],
        ["maintenance : PSU", "Not responding"],
    ),
    "a DOWN shown with exactly the kept reason": (
        [rec("IDLE", "", "Not responding", 10), rec("DOWN", "", "Not responding", 10)],
        ["Not responding", ""],
    ),
    "a new verdict keeps its reason": (
        [rec("IDLE", "", "Not responding", 10), rec("IDLE", "FAIL", "Not responding : xid 79", 50)],
        ["Not responding", "Not responding : xid 79"],
    ),
    "a human DOWN with a new reason keeps it": (
        [rec("IDLE", "", "Not responding", 10), rec("DOWN", "", "bad PSU", 50)],
        ["Not responding", "bad PSU"],
    ),
    "22.05 clears the reason on resume: nothing to cut": (
        [rec("IDLE"), rec("IDLE", "NOT_RESPONDING"), rec("DOWN", "NOT_RESPONDING", "Not responding", 50)],
        ["", "", "Not responding"],
    ),
    "first seen DOWN: no history, taken as read": (
        [rec("DOWN", "NOT_RESPONDING", "Not responding : Not responding", 50)],
        ["Not responding : Not responding"],
    ),
}


@pytest.mark.parametrize(("reads", "expected"), CASES.values(), ids=CASES.keys())
def test_kept_reasons(reads: list[NodeRecord], expected: list[str]) -> None:
    assert seen(*reads) == expected


def test_a_cut_reason_is_keyed_by_slurmds_start_not_by_the_old_stamp() -> None:
    kept = KeptReasons()
    kept.strip({NODE: rec("IDLE", "", "Not responding", 10)})
    now = kept.strip({NODE: rec("IDLE", "NOT_RESPONDING", "Not responding", 10)})[NODE]
    assert (now.reason, now.reason_user, now.reason_changed_at, now.slurmd_start_time) == ("", None, 0, 1_000)


def test_a_verdict_ends_the_history() -> None:
    kept = KeptReasons()
    kept.strip({NODE: rec("IDLE", "", "Not responding", 10)})
    kept.strip({NODE: rec("IDLE", "DRAIN", "remediation: xid 79", 50)})
    assert kept.get(NODE) is None
    # Resumed with our reason kept, then slurmd dies: the old drain reason is cut from the DOWN.
    assert seen(
        rec("IDLE", "", "remediation: xid 79", 50),
        rec("DOWN", "NOT_RESPONDING", "remediation: xid 79 : Not responding", 90),
    ) == ["remediation: xid 79", "Not responding"]


@pytest.mark.parametrize(("reads", "expected"), CASES.values(), ids=CASES.keys())
def test_a_read_handed_back_unchanged_is_cut_the_same(reads: list[NodeRecord], expected: list[str]) -> None:
    """The delta reader hands back the same object for a node that did not change: each read repeated
    (as a quiet poll repeats it) keeps the reason the first gave, as a fresh copy of it would."""
    kept, fresh = KeptReasons(), KeptReasons()
    for read, reason in zip(reads, expected, strict=True):
        for _ in range(3):
            assert kept.strip({NODE: read})[NODE].reason == reason
            assert fresh.strip({NODE: read._replace()})[NODE] == kept.strip({NODE: read})[NODE]
