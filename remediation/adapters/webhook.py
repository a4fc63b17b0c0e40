"""The Slack-compatible webhook: one HTTP POST per message, and nothing of the URL in any log.

The outbox logic (what to send, when, how often) is :mod:`remediation.services.notify`; this module
only delivers. The webhook URL is the credential, so errors are reported by type and status code only.

Why: docs/on-call.md#on-call
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

Post = Callable[[str, dict[str, Any]], None]


class NotifyError(Exception):
    """A webhook post failed; the message never contains the URL."""


class _Redact(logging.Filter):
    """httpx logs every request's full URL at INFO; for a webhook the URL *is* the credential."""

    def __init__(self, secret: str) -> None:
        super().__init__()
        self.secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.secret in message:
            record.msg, record.args = message.replace(self.secret, "<webhook>"), ()
        return True


def httpx_post(timeout_s: float) -> Post:
    def post(url: str, payload: dict[str, Any]) -> None:
        import httpx

        redact = _Redact(url)
        logger = logging.getLogger("httpx")
        logger.addFilter(redact)
        try:
            resp = httpx.post(url, json=payload, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise NotifyError(f"webhook unreachable ({type(exc).__name__})") from None
        finally:
            logger.removeFilter(redact)
        if resp.status_code >= 300:
            raise NotifyError(f"webhook answered HTTP {resp.status_code}")

    return post
