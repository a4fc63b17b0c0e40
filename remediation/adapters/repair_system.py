"""The repair system's adapters: a webhook POST, a file in a directory, and the dry-run twin.

The webhook's URL and token are credentials: an error names the HTTP status or the error's type only.

Why: docs/policy.md#repair-requests-handing-hardware-to-the-repair-system
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remediation.adapters.webhook import _Redact
from remediation.repair_requests.port import DeliveryFailed, RepairSystem
from remediation.repair_requests.settings import RepairDelivery, RepairSettings


@dataclass
class WebhookRepairSystem:
    """One POST per attempt, with the request's key as ``Idempotency-Key``."""

    url: str
    timeout_s: float
    token: str | None = None

    def send(self, key: str, body: dict[str, Any]) -> str:
        import httpx

        headers = {"Idempotency-Key": key, **({"Authorization": f"Bearer {self.token}"} if self.token else {})}
        redact, logger = _Redact(self.url), logging.getLogger("httpx")
        logger.addFilter(redact)
        try:
            resp = httpx.post(self.url, json=body, headers=headers, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise DeliveryFailed(f"repair webhook unreachable ({type(exc).__name__})") from None
        finally:
            logger.removeFilter(redact)
        if resp.status_code >= 300:
            raise DeliveryFailed(f"repair webhook answered HTTP {resp.status_code}")
        return f"posted (HTTP {resp.status_code})"


@dataclass
class DirectoryRepairSystem:
    """One file per request, ``<key>.json``, written whole (a temporary file renamed into place), so a
    site's tooling never reads half a request; a repeat attempt rewrites the same file."""

    directory: Path

    def send(self, key: str, body: dict[str, Any]) -> str:
        target = self.directory / f"{key}.json"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{key}.", suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                json.dump(body, out, indent=2, sort_keys=True)
            os.replace(tmp, target)
        except OSError as exc:
            raise DeliveryFailed(f"cannot write {target.name} in the repair directory: {exc.strerror}") from None
        return f"written as {target.name}"


@dataclass
class NoopRepairSystem:
    """The dry-run twin: records what it would have sent, sends nothing."""

    sent: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def send(self, key: str, body: dict[str, Any]) -> str:
        self.sent.append((key, body))
        return "would send (dry run): nothing was sent"


def repair_system(cfg: RepairSettings, *, dry_run: bool) -> RepairSystem:
    """The backend ``repair.delivery`` names, or the dry-run twin."""
    if dry_run:
        return NoopRepairSystem()
    if cfg.delivery is RepairDelivery.DIRECTORY:
        return DirectoryRepairSystem(cfg.directory)
    if cfg.webhook_url is None:
        raise ValueError("repair.webhook_url is not set")  # the settings refuse this at start-up
    return WebhookRepairSystem(cfg.webhook_url.get_secret_value(), cfg.timeout_s, cfg.bearer())
