"""The pyslurm backend against the real slurmctld; runs only where pyslurm matches the installed Slurm.

PyPI has no pyslurm for Slurm 22.05 (pyslurm 25.11 needs Slurm 25.11), so on Debian 12's Slurm these
tests skip; the clear start-up error when pyslurm is missing is tested in tests/unit.
"""

from __future__ import annotations

import pytest

from tests.integration.slurm.conftest import SlurmCluster

pytest.importorskip("pyslurm")

from workers.adapters.slurm_pyslurm import PyslurmSlurm  # noqa: E402

pytestmark = pytest.mark.slurm


def test_pyslurm_reads_drains_and_resumes(slurm: SlurmCluster) -> None:
    backend = PyslurmSlurm(slurm.settings(backend="pyslurm"))
    assert sorted(n.name for n in backend.list_nodes()) == slurm.nodes
    backend.drain("gpu-node-1", "remediation: pyslurm")
    assert slurm.nodes_now()["gpu-node-1"] == ("IDLE", frozenset({"DRAIN"}), "remediation: pyslurm")
    backend.resume("gpu-node-1")
    assert "DRAIN" not in backend.get_node("gpu-node-1").flags
    assert backend.running_jobs("gpu-node-1") == 0
