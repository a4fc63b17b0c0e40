"""The reliability and operator-trust suite: each scenario is a test that also records its figures.

A scenario calls ``scenario_figures.record(...)``; the rows go to ``$REMEDIATION_RELIABILITY_OUT``
(a JSON-lines file) when set, which is how ``python -m bench.reliability`` builds its table. The scale
of the long scenarios comes from ``REMEDIATION_RELIABILITY_SCALE``: ``ci`` (default, shortened so the
suite fits in CI) or ``full`` (the sizes the issue names).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

FULL = os.environ.get("REMEDIATION_RELIABILITY_SCALE", "ci") == "full"


def scale(ci: int, full: int) -> int:
    """A size for this run: ``full`` when asked for, else the CI size."""
    return full if FULL else ci


@dataclass
class Figures:
    scenario: str
    runs: int = 0
    passed: int = 0
    lost_events: int = 0
    duplicate_actions: int = 0
    recovery_s: float | None = None
    notes: str = ""
    extra: dict[str, object] = field(default_factory=dict)


class Recorder:
    def __init__(self) -> None:
        self.rows: list[Figures] = []

    def record(self, scenario: str, **kw: object) -> Figures:
        row = Figures(scenario, **kw)  # type: ignore[arg-type]
        self.rows.append(row)
        out = os.environ.get("REMEDIATION_RELIABILITY_OUT")
        if out:
            with Path(out).open("a") as fh:
                fh.write(json.dumps(asdict(row), default=str) + "\n")
        return row


@pytest.fixture
def scenario_figures() -> Iterator[Recorder]:
    yield Recorder()
