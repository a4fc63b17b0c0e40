"""``retention``: how long observed events are kept (``REMEDIATION_RETENTION__*``), and the
duration syntax (``90d``, ``12h``) it and the CLI accept."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import Field, field_validator

from remediation.settings.base import Section


class RetentionSettings(Section):
    """How long observed events are kept (``remediation db prune``, run by beat).

    Only events no remediation points to are pruned: every remediation keeps its own events, and
    audit rows are never pruned at all. Refused payloads (``rejected_events``) go by the same age."""

    events_older_than: timedelta = Field(
        timedelta(days=90),
        description="Prune unlinked events observed, and refused payloads received, longer ago than this (e.g. 90d, 12h, or seconds). "
        "90 days outlasts the repeat-offender and lemon windows, so no decision loses its evidence.",
    )
    evidence_older_than: timedelta = Field(
        timedelta(days=365),
        description="Prune collected evidence (its rows, files and objects) of remediations closed longer ago "
        "than this. A year outlasts a vendor's RMA and the lemon window.",
    )
    prune_interval_s: float = Field(
        86400.0, ge=0, description="How often beat runs the prune, in seconds (default daily; 0: never).",
    )
    batch: int = Field(10000, ge=1, le=1_000_000,
                       description="Rows deleted per transaction, so a first prune of a big table "
                       "never holds one long lock.")

    @field_validator("events_older_than", "evidence_older_than", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return parse_duration(value) if isinstance(value, str) else value

    @field_validator("events_older_than", "evidence_older_than")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be a positive duration")
        return value


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """``90d``, ``12h``, ``30m``, ``45s``, ``2w`` or a bare number of seconds, as a timedelta."""
    raw = text.strip().lower()
    number, unit = (raw[:-1], raw[-1]) if raw and raw[-1] in _UNITS else (raw, "s")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration: use a number and a unit, e.g. 90d, 12h, 30m") from None
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"{text!r}: a duration must be a positive number")
    return timedelta(seconds=value * _UNITS[unit])
