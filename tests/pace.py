"""How long a test may wait on this machine: every wait budget in the suite was set on a fast machine
and is stretched by this run's slowness.

The controller times a fixed CPU loop once, before the xdist workers start, against ``REFERENCE_S`` (its
time where the budgets were set); the factor (1 to ``MOST``) reaches the workers and what they start as
``REMEDIATION_TEST_SLOWNESS``, which may also be set by hand. Deadlines (:func:`within`), timeouts
(:func:`budget`) and pytest's per-test timeouts stretch; a window in which nothing may happen does not.

Why: CONTRIBUTING.md, "Wait budgets on a slow machine".
"""

from __future__ import annotations

import os
import time

import pytest

ENV = "REMEDIATION_TEST_SLOWNESS"
#: The loop's best wall time on the machine where the budgets were set (2 cores, 2026-11-29, the day
#: ``bench.slurm_scale`` measured 134 ms for its full parse).
REFERENCE_S = 0.053
#: A machine this much slower is broken rather than slow: stretching further only hides a hang.
MOST = 4.0


def _loop() -> float:
    """Wall seconds of a fixed mix of dict, string and integer work, the kind the test processes do."""
    start = time.perf_counter()
    table: dict[str, int] = {}
    for i in range(300_000):
        key = f"gpu-node-{i % 997}"
        table[key] = table.get(key, 0) + i * 7 % 13
    "".join(sorted(table)).upper().split("-")
    return time.perf_counter() - start


def measure() -> float:
    """This machine's slowness against the reference: the best of several runs, so a moment's noise
    does not stretch every budget."""
    best = min(_loop() for _ in range(7))
    return min(MOST, max(1.0, best / REFERENCE_S))


def slowness() -> float:
    """The factor set for this run (by the controller, or by hand), else 1."""
    try:
        return min(MOST, max(1.0, float(os.environ.get(ENV, "1"))))
    except ValueError:
        return 1.0


def budget(seconds: float) -> float:
    """A wait budget set on the reference machine, stretched for this one."""
    return seconds * slowness()


def within(seconds: float) -> float:
    """The monotonic deadline of a wait whose budget is ``seconds`` on the reference machine."""
    return time.monotonic() + budget(seconds)


def pytest_configure(config: pytest.Config) -> None:
    """Time the machine once, in the controller (or a run without xdist); workers inherit the result."""
    if hasattr(config, "workerinput") or ENV in os.environ:
        return
    os.environ[ENV] = f"{measure():.2f}"


def pytest_report_header(config: pytest.Config) -> str:
    return f"wait budgets stretched x{slowness():.2f} for this machine ({ENV})"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Stretch each test's pytest timeout (its own marker, else the configured one)."""
    factor = slowness()
    if factor == 1.0:
        return
    default = float(config.getoption("timeout", None) or config.getini("timeout") or 0)
    for item in items:
        base = _timeout_of(item.get_closest_marker("timeout"), default)
        if base > 0:
            item.add_marker(pytest.mark.timeout(base * factor), append=False)


def _timeout_of(marker: pytest.Mark | None, default: float) -> float:
    """The seconds a ``timeout`` marker gives (positionally or by name), else ``default``."""
    if marker is None:
        return default
    return float(marker.args[0] if marker.args else marker.kwargs.get("timeout", default))
