"""What every watcher process shares: clean shutdown (its bus and leader lock come from
:mod:`remediation.adapters.factory`).

A watcher's loop is: wait for the leader lock, observe, publish, sleep until the next poll or until
SIGTERM/SIGINT. ``Stopper.wait`` is an interruptible sleep, so a signal ends the process within one
poll at most, after it has released its lock.
"""

from __future__ import annotations

import signal
import threading
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
