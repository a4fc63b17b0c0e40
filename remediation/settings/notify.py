"""``notify``: webhook notifications (``REMEDIATION_NOTIFY__*``)."""

from __future__ import annotations

from pydantic import Field, SecretStr

from remediation.settings.base import Section


class NotifySettings(Section):
    """Slack-compatible webhook notifications, rate-limited."""
    webhook_url: SecretStr | None = Field(None, description="Slack-compatible incoming webhook; unset = off.")
    min_interval_s: float = Field(
        300.0, ge=0, description="At most one message per kind and node within this many seconds."
    )
    max_per_pass: int = Field(
        5,
        ge=1,
        le=100,
        description="Messages posted per outbox pass (every 10 s); anything beyond is collapsed into one "
        "summary message, so a storm pages a handful of times, not hundreds.",
    )
    max_age_s: float = Field(
        3600.0,
        gt=0,
        description="Audit rows older than this (seconds) are skipped, not posted: after an outage or "
        "on first enabling the webhook, stale news is not worth a page.",
    )
    timeout_s: float = Field(
        10.0, gt=0, le=60, description="Seconds before one webhook POST gives up (retried next pass)."
    )
    dashboard_url: str | None = Field(
        None, description="Public base URL of the dashboard; when set, messages link to the node's page."
    )
