"""Intents: where an action that must not be sent twice is recorded before it is sent.

A signal to a job, like a BMC reset, takes no request id: sent twice, it acts twice. The step that
sends one first claims it on its step row (found by the step's idempotency key), in a transaction of
its own, and sends only a claim it won; a worker killed after the claim leaves it there, and the next
run of the step finds it and sends nothing. :class:`remediation.db.intents.StepIntents` keeps them in
Postgres; the entry points hand it to the adapter factory.
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
