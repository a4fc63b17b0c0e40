"""Intents kept in this process: the simulated world's stand-in for the step rows.

The workers record an intent (:mod:`remediation.ports.intents`) on its step row in Postgres. The
policy rehearsal and unit tests run no database; they keep intents here, with the same contract.

Why: docs/architecture.md#glossary
"""

from __future__ import annotations

from typing import Any


class MemoryIntents:
    """:class:`remediation.ports.intents.Intents` in a dict, by idempotency key."""

    def __init__(self) -> None:
        self.ops: dict[str, dict[str, Any]] = {}

    def recorded(self, key: str) -> dict[str, Any] | None:
        return dict(self.ops[key]) if key in self.ops else None

    def claim(self, key: str, op: dict[str, Any]) -> dict[str, Any] | None:
        if key in self.ops:
            return dict(self.ops[key])
        self.ops[key] = dict(op)
        return None

    def settle(self, key: str, op: dict[str, Any]) -> None:
        self.ops[key] = dict(op)

    def release(self, key: str, op: dict[str, Any]) -> None:
        if self.ops.get(key) == op:
            del self.ops[key]
