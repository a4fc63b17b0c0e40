"""The repair system as the service sees it: one method that hands a request over.

Why: docs/policy.md#repair-requests-handing-hardware-to-the-repair-system
"""

from __future__ import annotations

from typing import Any, Protocol


class DeliveryFailed(Exception):
    """A request did not reach the repair system; the message names no URL and no token."""


class RepairSystem(Protocol):
    """Where repair requests go: a webhook, a directory, or the dry-run twin that only records."""

    def send(self, key: str, body: dict[str, Any]) -> str:
        """Hand ``body`` over under ``key`` (the same key for every attempt of one request, so a receiver
        can drop a repeat); return what was done, for people. Raises :class:`DeliveryFailed`."""
        ...
