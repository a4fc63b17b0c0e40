"""``remediation reliability`` pauses the cycle collector only while it builds the report
(remediation.cli.reliability)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from remediation.cli.reliability import _collector_paused


@pytest.fixture
def collector() -> Iterator[None]:
    was = gc.isenabled()
    yield
    gc.enable() if was else gc.disable()


@pytest.mark.parametrize("enabled", [True, False], ids=["enabled before", "disabled before"])
def test_the_collector_is_paused_inside_and_as_it_was_after(collector: None, enabled: bool) -> None:
    gc.enable() if enabled else gc.disable()
    with _collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled() is enabled


def test_an_error_inside_leaves_the_collector_running(collector: None) -> None:
    gc.enable()
    with pytest.raises(RuntimeError), _collector_paused():
        raise RuntimeError("the database went away")
    assert gc.isenabled()
