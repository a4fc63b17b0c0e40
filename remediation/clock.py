"""Clocks: the system clock, and a settable one so window and backoff tests run instantly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class FakeClock:
    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self._now

    def set(self, when: datetime) -> datetime:
        self._now = max(self._now, when)  # time never runs backwards
        return self._now

    def advance(self, seconds: float) -> datetime:
        self._now += timedelta(seconds=seconds)
        return self._now


def aware(value: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes for timezone-aware columns; they are UTC by construction."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)
