"""The run's last line, naming the Slurm releases it tested against: a pytest plugin (loaded by
tests/conftest.py).

The Slurm fixtures (tests/integration/slurm/conftest.py) call :func:`record` when a cluster is up. In
one pytest process that is all; in a run split over xdist workers each worker hands what it started to
the controller (``workeroutput``), which prints the one line for the whole run.
"""

from __future__ import annotations

from typing import Any

import pytest

#: Release ("22.05") -> exact version its commands reported ("22.05.8"), in this process.
STARTED: dict[str, str] = {}
_KEY = "slurm_versions"


def record(release: str, version: str) -> None:
    STARTED[release] = version


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller prints the line
        workeroutput[_KEY] = dict(STARTED)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist: a worker finished; take the versions it started."""
    STARTED.update(getattr(node, "workeroutput", {}).get(_KEY, {}))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """After pytest's own summary ("N passed in ..."), so that the run's very last line names them."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if STARTED and reporter is not None and getattr(config, "workeroutput", None) is None:
        versions = ", ".join(STARTED[v] for v in sorted(STARTED))
        reporter.write_line(f"slurm versions under test: {versions}")
