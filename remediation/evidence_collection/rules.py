"""Collected evidence, the pure part: when a remediation collects, the job that does it, and what
its output says.

Why: docs/policy.md#collected-evidence-the-nodes-state-before-the-hammer
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum


class EvidenceStatus(StrEnum):
    """How one command of the evidence job ended."""

    COLLECTED = "collected"  # exit 0
    FAILED = "failed"  # another exit code: its output is kept all the same
    TIMED_OUT = "timed-out"  # stopped at its deadline
    MISSING = "missing"  # not on the node (exit 126/127)
    CUT = "cut"  # the job was stopped (evidence.max_wait_s) before this command ended


@dataclass(frozen=True)
class Item:
    """One command's output as the job kept it: ``content`` is at most the command's ``max_bytes``;
    ``total_bytes`` is what the command wrote (more: ``truncated``)."""

    name: str
    status: EvidenceStatus
    content: bytes
    total_bytes: int
    exit_code: int | None = None
    duration_s: float | None = None

    @property
    def truncated(self) -> bool:
        return self.total_bytes > len(self.content)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()
