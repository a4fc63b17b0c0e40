"""Intents: where an action that must not be sent twice is recorded before it is sent.

A step claims the action on its step row (by the step's idempotency key) in a transaction of its own
and sends only a claim it won; a rerun that finds the claim sends nothing.
:class:`remediation.db.intents.StepIntents` keeps them in Postgres.

Why: docs/architecture.md#claim-before-sending-what-has-no-request-id
"""

from __future__ import annotations

from typing import Any, Protocol


class Intents(Protocol):
    """Intents kept on the step rows, by idempotency key."""

    def recorded(self, key: str) -> dict[str, Any] | None:
        """The intent already recorded for ``key``, if any."""
        ...

    def claim(self, key: str, op: dict[str, Any]) -> dict[str, Any] | None:
        """Record ``op`` unless an intent is there already; None: ``op`` is the key's own (send it),
        else the intent recorded first (send nothing)."""
        ...

    def settle(self, key: str, op: dict[str, Any]) -> None:
        """Replace the key's intent with what came of it."""
        ...

    def release(self, key: str, op: dict[str, Any]) -> None:
        """Take back an intent that was refused before it did anything."""
        ...
