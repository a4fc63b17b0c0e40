"""A Slurm-only site whose hammer is Slurm's own reboot, on the real slurmctld 22.05, run by real workers.

``kube.backend: none``, ``machine.backend: slurm`` and ``validation.backend: slurm``: a researcher's
FAIL "xid 79" is drained, rebooted with ``scontrol reboot`` (the test cluster's RebootProgram restarts
that node's slurmd as a reboot would, ``slurmd -b``), proven back by slurmd's registration with a new
BootTime after the request, checked by the real check job in a maintenance reservation, and returned;
a node whose check fails after the reboot is quarantined. Xid 79 is RESTART_BM in NVIDIA's catalogue:
the shipped ladder's host move is a reboot at a site that can only reboot. Every step row says what
happened, and the verdicts are read through the CLI.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.slurm.conftest import SlurmCluster, slurm, slurm_cluster  # noqa: F401  (fixtures)
from tests.integration.test_absence import SlurmOnlySite, check_dir, checked_to_the_end  # noqa: F401

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def rebooting(slurm_cluster: SlurmCluster, pg_module_db: str, check_dir: Path,  # noqa: F811
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmOnlySite]:
    site = SlurmOnlySite(slurm_cluster, pg_module_db, tmp_path_factory.mktemp("rebooting"), check_dir, "slurm")
    yield site
    site.close()


def boots(cluster: SlurmCluster, node: str) -> int:
    """Reboots the test cluster's RebootProgram carried out on ``node`` (its own log)."""
    log = cluster.dir / "log" / "reboot.log"
    return len(re.findall(rf"reboot {re.escape(node)} ", log.read_text())) if log.exists() else 0


def test_a_rebooted_node_is_proven_back_checked_and_returned(slurm: SlurmCluster, rebooting: SlurmOnlySite,  # noqa: F811
                                                            check_dir: Path) -> None:  # noqa: F811
    node = slurm.nodes[1]
    before = boots(slurm, node)
    rid, status, steps = checked_to_the_end(rebooting, slurm, check_dir, node, 0)
    assert status == "succeeded", steps
    assert [s[:2] for s in steps] == [("slurm_drain", "done"), ("collect_evidence", "done"), ("vm_restart", "done"),
                                      ("verify", "done"), ("validate", "done"), ("return", "done")]
    # The state is kept before the reboot, by a job like the check (no GPU tools on this machine: each
    # command is recorded missing; the journal line is written before the reboot).
    assert steps[1][2].startswith(f"collected from {node}: nvidia-smi-q missing"), steps[1]
    assert steps[2][2].startswith("restart completed"), steps[2]
    assert steps[4][2].startswith("GPU check passed"), steps[4]
    assert steps[5][2] == "resumed in Slurm" and not any(s[3] for s in steps)
    assert boots(slurm, node) == before + 1  # one reboot, carried out by slurmd's RebootProgram
    state, flags, _ = slurm.nodes_now()[node]
    assert state == "IDLE" and not flags & {"DRAIN", "FAIL", "REBOOT_REQUESTED", "REBOOT_ISSUED"}, (state, flags)
    shown = rebooting.show(rid, "-o", "json")
    assert (shown["status"], shown["context"]["no_kubernetes"]) == ("succeeded", True)


def test_a_node_whose_check_fails_after_the_reboot_is_quarantined(slurm: SlurmCluster, rebooting: SlurmOnlySite,  # noqa: F811
                                                                 check_dir: Path) -> None:  # noqa: F811
    node = slurm.nodes[2]
    rid, status, steps = checked_to_the_end(rebooting, slurm, check_dir, node, 1)
    assert status == "quarantined", steps
    assert [s[:2] for s in steps][:4] == [("slurm_drain", "done"), ("collect_evidence", "done"),
                                          ("vm_restart", "done"), ("verify", "done")]
    # The state after the reboot is kept again before the quarantine.
    assert ("validate", "failed") in [s[:2] for s in steps] and [s[:2] for s in steps][-2:] == [
        ("collect_evidence", "done"), ("quarantine", "done")]
    _, flags, reason = slurm.nodes_now()[node]
    assert "DRAIN" in flags and "quarantined" in reason
    assert rebooting.show(rid, "-o", "json")["status"] == "quarantined"
