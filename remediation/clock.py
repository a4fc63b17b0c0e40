"""Clocks: the system clock, and a settable one so window and backoff tests run instantly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import overload


class SystemClock:
    """The host's clock; ``offset_s`` stands for a host whose clock is that far ahead (behind, when
    negative) of the others, as a test's worker ahead of slurmctld. Nothing in production sets it."""

    def __init__(self, offset_s: float = 0.0) -> None:
        self.offset = timedelta(seconds=offset_s)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset


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


@overload
def aware(value: datetime) -> datetime: ...
@overload
def aware(value: None) -> None: ...
@overload
def aware(value: datetime | None) -> datetime | None: ...
def aware(value: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes for timezone-aware columns; they are UTC by construction."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)
