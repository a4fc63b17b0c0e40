"""The Slurm node states the service reasons about, spelled once.

slurmctld reports a node as one base state (IDLE, ALLOCATED, MIXED, DOWN, ...) plus flags (DRAIN, FAIL,
NOT_RESPONDING, ...); the parsers hand both over upper-cased, and the code asks which of a node's states
fall in these sets. :class:`SlurmState` members are strings, so ``node.states & DRAINED`` works on the
plain strings a parser produced. Pure vocabulary, no I/O.
"""

from __future__ import annotations

from enum import StrEnum


class SlurmState(StrEnum):
    """The states (base states and flags) the service's decisions depend on."""

    IDLE = "IDLE"
    ALLOCATED = "ALLOCATED"
    MIXED = "MIXED"  # some of its CPUs or GPUs allocated
    COMPLETING = "COMPLETING"  # jobs ending: their epilogs still run
    DOWN = "DOWN"
    DRAIN = "DRAIN"  # the drain flag; slurmctld shows it as DRAINING (jobs still run) or DRAINED
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"
    FAIL = "FAIL"  # the fail flag; FAILING while jobs still run
    FAILING = "FAILING"
    NOT_RESPONDING = "NOT_RESPONDING"  # slurmd missed its pings (shown as "*"); DOWN follows at SlurmdTimeout


S = SlurmState
#: Taken out of the pool by a drain (a human's or ours), whatever stage the drain is at.
DRAINED = frozenset({S.DRAIN, S.DRAINING, S.DRAINED})
#: Marked failed (a researcher's ``state=fail``, or ours).
FAILED = frozenset({S.FAIL, S.FAILING})
#: A verdict someone set with a reason of their own: a drain or a fail.
VERDICTS = DRAINED | FAILED
#: Not serving: down, not answering, or failed. A drain alone still serves its running jobs.
UNSERVING = frozenset({S.DOWN, S.NOT_RESPONDING}) | FAILED
#: Never a healthy observation, whether or not the policy remediates it.
BAD = UNSERVING | DRAINED
#: Jobs may still hold the node. A FAIL on an allocated node shows as FAILING or MIXED/ALLOCATED+FAIL:
#: its jobs are still there. Only a hint: squeue is always asked as well.
BUSY = frozenset({S.ALLOCATED, S.MIXED, S.COMPLETING, S.FAILING, S.DRAINING})


def named(state: str) -> frozenset[str]:
    """The states a state text names, upper-cased: ``"IDLE+FAIL"`` (as events carry it) or ``"idle, drain"``."""
    return frozenset(s for s in state.upper().replace(",", "+").replace(" ", "+").split("+") if s)
