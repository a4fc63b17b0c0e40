"""`remediation rehearse`'s progress bar: simulated days done and faults handled, redrawn at most every
``every_s`` of wall time, and wiped at the end so that the report starts on a clean line."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

from remediation.cli.simulate import progress_bar
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.rehearsal.loop import Tally
from remediation.rehearsal.trace import Fault

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def faults(days: list[float]) -> list[Fault]:
    out = []
    for i, d in enumerate(days):
        at = T0 + timedelta(days=d)
        out.append(Fault(at, NodeEvent(source=Source.SLURM, node=f"n{i}", kind=EventKind.UNHEALTHY, state="DOWN",
                                       observed_at=at, dedupe_key=f"k{i}")))
    return out


def test_bar_shows_days_and_faults_and_throttles() -> None:
    out, now = io.StringIO(), [0.0]
    draw, clear = progress_bar(faults([0, 10, 20]), out, every_s=1.0, tick=lambda: now[0])
    draw(T0 + timedelta(days=10), Tally(faults_handled=2))
    first = out.getvalue()
    assert "day 10.0/20.0" in first and "faults 2/3" in first and "#" * 15 + "." * 15 in first
    now[0] = 0.5
    draw(T0 + timedelta(days=15), Tally(faults_handled=2))
    assert out.getvalue() == first  # within every_s of the last drawing: not redrawn
    now[0] = 1.5
    draw(T0 + timedelta(days=20), Tally(faults_handled=3))
    assert "day 20.0/20.0" in out.getvalue() and "faults 3/3" in out.getvalue()
    clear()
    assert out.getvalue().endswith("\r" + " " * 72 + "\r")


def test_nothing_drawn_nothing_cleared() -> None:
    out = io.StringIO()
    _, clear = progress_bar([], out)
    clear()
    assert out.getvalue() == ""
