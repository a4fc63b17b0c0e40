"""How often one client may try to log in to the dashboard (``api.login_attempts_per_minute``).

Per client address (as uvicorn reports it) in a sliding minute; one more is a 429 with Retry-After, before
the token is compared. The count is per API process.

Why: docs/running.md#the-api-and-the-dashboard
"""

from __future__ import annotations

import threading
from collections import deque
from datetime import datetime, timedelta

WINDOW = timedelta(minutes=1)
MAX_CLIENTS = 10_000  # clients remembered at once; past this, those idle for a window are forgotten


class LoginLimiter:
    """Sliding-window counts of login attempts per client, in memory."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._seen: dict[str, deque[datetime]] = {}
        self._lock = threading.Lock()  # the login route runs in a thread pool

    def retry_after(self, client: str, now: datetime) -> float | None:
        """Record an attempt by ``client``; the seconds it must wait if this one is over the limit."""
        with self._lock:
            if len(self._seen) >= MAX_CLIENTS:
                self._forget_idle(now)
            times = self._seen.setdefault(client, deque())
            while times and times[0] <= now - WINDOW:
                times.popleft()
            if len(times) >= self.per_minute:
                return max(1.0, (times[0] + WINDOW - now).total_seconds())
            times.append(now)
            return None

    def _forget_idle(self, now: datetime) -> None:
        for client in [c for c, t in self._seen.items() if not t or t[-1] <= now - WINDOW]:
            del self._seen[client]
