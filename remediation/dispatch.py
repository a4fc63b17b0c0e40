"""Where work goes after a lever or an ingest commits.

The domain does not import Celery; the composition root (``workers.cli`` for the console script and
the API, the demo runner for the embedded mode) installs a dispatcher that does. Without one, step
follow-ups are still safe: they were committed with ``next_run_at`` set, so the sweeper resumes them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from remediation.workflow import FollowUp

log = logging.getLogger(__name__)


class Dispatcher(Protocol):
    def steps(self, followups: Sequence[FollowUp | None]) -> None: ...

    def release(self, node: str) -> None: ...


class SweeperOnly:
    """No broker: steps wait for the sweeper; a release cannot be carried out."""

    def steps(self, followups: Sequence[FollowUp | None]) -> None:
        if any(followups):
            log.info("no dispatcher installed; the sweeper will pick up %d step(s)", len(followups))

    def release(self, node: str) -> None:
        raise RuntimeError("no dispatcher installed: cannot queue release actions")


_current: Dispatcher = SweeperOnly()


def set_dispatcher(dispatcher: Dispatcher) -> None:
    global _current
    _current = dispatcher


def dispatcher() -> Dispatcher:
    return _current
