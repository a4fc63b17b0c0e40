"""``repair``: the hand-off of quarantined hardware to a repair system (``REMEDIATION_REPAIR__*``).
The webhook's URL and its bearer token are credentials: read here, never echoed in an error or a log.

Why: docs/policy.md#repair-requests-handing-hardware-to-the-repair-system
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import Field, SecretStr, model_validator

from remediation.settings.base import Section


class RepairDelivery(StrEnum):
    """How a repair request reaches the repair system."""

    WEBHOOK = "webhook"  # one JSON POST per request
    DIRECTORY = "directory"  # one JSON file per request, for a site's own tooling to pick up


def _read(path: Path, field: str) -> SecretStr:
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"repair.{field}: cannot read {path}: {exc.strerror}") from None
    if not value:
        raise ValueError(f"repair.{field}: {path} is empty")
    return SecretStr(value)


class RepairSettings(Section):
    """Open a repair request when a node is quarantined for hardware (its reason says RMA). Off by
    default: nothing is sent anywhere until a site names where to."""

    enabled: bool = Field(False, description="Open repair requests at all. Off: a hardware quarantine is "
                          "a plain quarantine, as before.")
    delivery: RepairDelivery = Field(RepairDelivery.WEBHOOK, description="webhook: POST the request; "
                                     "directory: write it as a file in `directory`.")
    webhook_url: SecretStr | None = Field(None, description="webhook: where requests are POSTed (a "
                                          "credential: never logged). Give this or webhook_url_file.")
    webhook_url_file: Path | None = Field(None, description="webhook: a file holding the URL (a mounted "
                                          "Secret), read at start-up.")
    token_file: Path | None = Field(None, description="webhook: a file holding a bearer token sent as "
                                    "Authorization; unset: none is sent.")
    directory: Path = Field(Path("/var/lib/node-remediation/repair-requests"),
                            description="directory: where request files are written (one per request).")
    backoff_base_s: float = Field(30.0, gt=0, le=3600, description="Seconds before the first retry of a "
                                  "failed delivery; each retry waits twice the one before.")
    backoff_max_s: float = Field(3600.0, gt=0, le=86400, description="The longest wait between retries, "
                                 "seconds: a receiver down for a day is tried hourly, never given up on.")
    timeout_s: float = Field(10.0, gt=0, le=120, description="Seconds one POST may take before it counts "
                             "as failed (and is retried).")

    @model_validator(mode="after")
    def _where(self) -> RepairSettings:
        if self.webhook_url_file is not None:
            if self.webhook_url is not None:
                raise ValueError("repair: give webhook_url or webhook_url_file, not both")
            self.webhook_url = _read(self.webhook_url_file, "webhook_url_file")
        if self.enabled and self.delivery is RepairDelivery.WEBHOOK and self.webhook_url is None:
            raise ValueError("repair.enabled with delivery webhook needs repair.webhook_url or webhook_url_file")
        if self.token_file is not None:
            self.bearer()  # a missing or empty token file fails at start-up, not at the first request
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError("repair.backoff_max_s must be at least repair.backoff_base_s")
        return self

    def bearer(self) -> str | None:
        """The webhook's bearer token, read from ``token_file`` (None: none is sent)."""
        return _read(self.token_file, "token_file").get_secret_value() if self.token_file else None
