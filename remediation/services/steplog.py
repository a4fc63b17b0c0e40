"""The workflow's decision log: one INFO line per step decision, with its five fields as record fields.

Each line carries ``remediation_id``, ``node``, ``step``, ``attempt`` and ``outcome`` as ``extra=``
fields, so a JSON log search can follow one remediation. Outcomes: done, wait, escalate, quarantine,
hold, cancel, retry (transient), held (not the node's error) and "gated" (not admitted; the
log's word, kept for searches).

Why: docs/architecture.md#a-step-runs-in-three-phases
"""

from __future__ import annotations

import logging

from remediation.domain.outcomes import Outcome

log = logging.getLogger("remediation.workflow")


def decided(remediation_id: int, node: str, step: str, *, attempt: int, outcome: str, why: str) -> None:
    log.info(
        "remediation %s %s attempt %s on %s: %s (%s)",
        remediation_id,
        step,
        attempt,
        node,
        outcome,
        why[:300],
        extra={
            "remediation_id": remediation_id,
            "node": node,
            "step": step,
            "attempt": attempt,
            "outcome": outcome,
        },
    )


def name(outcome: Outcome) -> str:
    """done, wait, escalate, quarantine, hold or cancel."""
    return type(outcome).__name__.lower()


def why(outcome: Outcome) -> str:
    return str(getattr(outcome, "reason", None) or getattr(outcome, "outcome", "") or "")
