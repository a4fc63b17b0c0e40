"""What every watcher process shares: clean shutdown and a count of its polls (its bus and leader lock come
from :mod:`remediation.adapters.factory`).

``Stopper.wait`` is an interruptible sleep, so SIGTERM/SIGINT ends the process within one poll, lock
released. ``Polls`` counts the loop's passes and keeps each pass's clock reading.

Why: docs/running.md#the-watchers
"""

from __future__ import annotations

import signal
import threading
from datetime import datetime
from types import FrameType


class Stopper:
    """Set by SIGTERM or SIGINT; ``wait`` sleeps until the timeout or the signal."""

    def __init__(self, install: bool = True) -> None:
        self._event = threading.Event()
        if install and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._handle)
            signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._event.set()

    def stop(self) -> None:
        self._event.set()

    @property
    def stopped(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; True if asked to stop."""
        return self._event.wait(timeout)


class Polls:
    """How many passes the watcher loop completed, and the clock it last decided with (thread-safe)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.count = 0
        self.last_at: datetime | None = None

    def tick(self, at: datetime) -> None:
        """One pass done: everything it saw has been decided on (published, held or queued)."""
        with self._cond:
            self.count += 1
            self.last_at = at
            self._cond.notify_all()

    def wait(self, count: int, timeout: float, at: datetime | None = None) -> bool:
        """Wait until ``count`` passes are done (and, with ``at``, one decided at or after ``at``)."""
        def done() -> bool:
            return self.count >= count and (at is None or (self.last_at is not None and self.last_at >= at))

        with self._cond:
            return self._cond.wait_for(done, timeout)

    def advance(self, passes: int, timeout: float, at: datetime | None = None) -> bool:
        """Wait for ``passes`` more passes from now (see :meth:`wait`)."""
        return self.wait(self.count + passes, timeout, at)
