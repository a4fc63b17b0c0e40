"""The pyslurm backend against the real Slurm releases under test: refused, honestly.

Untested: no matching Slurm could be installed. PyPI's pyslurm is 25.11 (Slurm 25.11 only) and Debian
offers 22.05, 24.11 and 26.05, so on every Slurm here the backend must refuse to start, naming both
releases and the Slurm this pyslurm needs, rather than pretend. The release it checks against is read from the real cluster's commands.
"""

from __future__ import annotations

import sys
import types

import pytest

from remediation.adapters.slurm.backend import make_slurm
from remediation.adapters.slurm.pyslurm_backend import PyslurmUnavailable
from remediation.settings import load_settings
from tests.integration.slurm.conftest import SlurmCluster

pytestmark = pytest.mark.slurm


def test_a_pyslurm_for_another_slurm_is_refused_at_start_up(
    slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What `pip install pyslurm` gives today: 25.11, built for Slurm 25.11 (its C extension cannot load
    # here, so only its version is stood in; the Slurm release is the real cluster's).
    monkeypatch.setitem(sys.modules, "pyslurm", types.SimpleNamespace(__version__="25.11.0"))
    settings = load_settings(slurm=slurm.slurm_options(backend="pyslurm"))
    major, minor = slurm.release
    with pytest.raises(PyslurmUnavailable, match=rf"built for Slurm 25\.11, but this Slurm is {major}\.{minor:02d}") as info:
        make_slurm(settings)
    assert "untested: no matching Slurm could be installed" in info.value.message
    assert "this one needs Slurm 25.11" in info.value.message


def test_a_pyslurm_of_the_same_release_passes_the_check(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    major, minor = slurm.release
    monkeypatch.setitem(sys.modules, "pyslurm", types.SimpleNamespace(__version__=f"{major}.{minor:02d}.0"))
    backend = make_slurm(load_settings(slurm=slurm.slurm_options(backend="pyslurm")))
    assert type(backend).__name__ == "PyslurmSlurm"  # constructed; no call made through the stand-in
