"""Missing infrastructure: a failure in CI, a skip only on a developer's machine.

A reliability scenario or a deploy test that cannot find its binary (redis-server, initdb, kubectl)
must not quietly drop its row of the table or its check in CI: with ``CI=true`` it fails and says what
is missing; locally it is skipped with the same message.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(what: str) -> NoReturn:
    """Fail (CI) or skip (local run) a test whose binary ``what`` names is not installed."""
    message = f"{what} is not installed"
    if in_ci():
        pytest.fail(
            f"{message}: in CI a test that needs it fails, it is never skipped (scripts/setup.sh installs it)"
        )
    pytest.skip(message)
