"""The workflow's decision log: one INFO line per step decision, with its five fields as record fields.

Every line carries ``remediation_id``, ``node``, ``step``, ``attempt`` and ``outcome`` as ``extra=``
fields, so with ``log_format: json`` (:mod:`remediation.adapters.logs`) a log search can follow one
remediation or one node without parsing prose; the text format shows the same facts in the message.
Outcomes: done, wait, escalate, quarantine, hold, cancel (the step's own verdict), retry (a transient
error, retried after a backoff), held (an error that is not the node's: the remediation holds, maybe
automation pauses) and "gated" (not admitted: admission or an incident kept the step from starting;
the log's word, kept for searches).
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
