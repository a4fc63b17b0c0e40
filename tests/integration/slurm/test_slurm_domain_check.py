"""The domain check on the real slurmctld of 24.11 and 26.05: one job over every node of block b1.

The block cluster (conftest ``slurm_block_cluster``) runs no slurmd; conftest's ``b1`` starts one for
each of b1's nodes, as a site's ResumeProgram would boot a powered-down tray. The check is the configured default (srun of all_reduce_perf, 4 ranks per node) with a
stand-in ``all_reduce_perf`` first on the PATH the job inherits. Slurm itself (scontrol, squeue) says
it was one job, on the 4 nodes, in the one reservation, and what it exited with. The same runs over the
plain cluster's 4 nodes through sbatch and through slurmrestd.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from remediation.adapters.slurm.validator import SlurmValidator, parse_job
from remediation.settings import Settings, load_settings
from remediation.validation.port import ValidationCheck
from tests.integration.slurm.conftest import BLOCK_SIZE, SlurmCluster
from tests.integration.workerproc import wait_for

pytestmark = pytest.mark.slurm
# The plain-cluster test runs with each backend where slurmrestd writes (not 22.05's): see conftest.
SLURM_WRITES = True

PREFIX = "remediation:"
#: nccl-tests' all_reduce_perf as far as the validator can tell: one line per rank, and exit 3 from the
#: ranks on the node named in the file ``fail-on`` beside it (a broken link on that tray).
STAND_IN = """#!/bin/sh
here=$(dirname "$0")
echo "all_reduce_perf stand-in: rank $SLURM_PROCID of $SLURM_NTASKS on $SLURMD_NODENAME ($*)"
if [ "$(cat "$here/fail-on" 2>/dev/null)" = "$SLURMD_NODENAME" ]; then
  echo "#  Out of bounds values : 1 FAILED"
  exit 3
fi
echo "# Avg bus bandwidth    : 0.0"
"""


@pytest.fixture
def domain(slurm_block_cluster: SlurmCluster, b1: list[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """b1 drained by us, a work directory with the stand-in on the PATH the validator (and its job) has;
    after the test no job, no reservation, b1 idle."""
    cluster = slurm_block_cluster
    work = cluster.workdir / f"domain-{time.monotonic_ns()}"
    (work / "bin").mkdir(parents=True)
    (work / "bin" / "all_reduce_perf").write_text(STAND_IN)
    (work / "bin" / "all_reduce_perf").chmod(0o755)
    monkeypatch.setenv("PATH", f"{work / 'bin'}{os.pathsep}{os.environ['PATH']}")
    cluster.scontrol("update", f"nodename={','.join(b1)}", "state=drain", f"reason={PREFIX} nvswitch sxid")
    yield work
    cluster.put_back(b1, "the check jobs")


def settings_for(cluster: SlurmCluster, work: Path) -> Settings:
    return load_settings(slurm=cluster.slurm_options(),
                         validation={"backend": "slurm", "slurm_workdir": str(work), "poll_interval_s": 0.2})


def job(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    return parse_job(cluster.scontrol("show", "job", "-o", job_id).stdout)


def run_check(cluster: SlurmCluster, nodes: list[str], work: Path, name: str) -> tuple[SlurmValidator, dict[str, Any], dict[str, str]]:
    """Start the domain check over ``nodes``, wait until it ends; the validator, its ref and the job as
    slurmctld showed it while it ran and once it ended."""
    cfg = settings_for(cluster, work)
    validator = SlurmValidator(cfg.slurm, cfg.validation)
    check = ValidationCheck(nodes[1], name, tuple(cfg.validation.domain_check_for("nvswitch")),
                            cfg.validation.domain_check_timeout_s, cause_class="nvswitch",
                            purpose="run domain check", nodes=tuple(nodes))
    ref = {**validator.start(check), "node": check.node}
    assert validator.start(check)["job_id"] == ref["job_id"]  # found again as ours: it covers every node
    # Slurm's own word while the reservation stands: one job, in it, over the four nodes.
    reservation = cluster.scontrol("show", "reservation", name).stdout
    assert f"ReservationName={name} " in reservation and "Nodes=gpu-node-[0-3] " in reservation
    assert cluster.run("squeue", "-h", f"--name={name}", "-t", "all", "-o", "%i").stdout.split() == [ref["job_id"]]
    wait_for(lambda: validator.poll(ref).done, 60, "the domain check to end")
    return validator, ref, job(cluster, ref["job_id"])


def test_one_job_over_the_block_passes_and_the_domain_is_put_back(
    slurm_block_cluster: SlurmCluster, b1: list[str], domain: Path,
) -> None:
    cluster = slurm_block_cluster
    validator, ref, info = run_check(cluster, b1, domain, "nr-domain-r1-a1")
    assert (info["NumNodes"], info["NodeList"], info["Reservation"]) == ("4", "gpu-node-[0-3]", "nr-domain-r1-a1")
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0")
    result = validator.poll(ref)
    assert result.passed and result.exit_code == 0
    ranks = [line for line in result.output.splitlines() if line.startswith("all_reduce_perf stand-in")]
    assert len(ranks) == 4 * BLOCK_SIZE and {r.split(" on ")[1].split()[0] for r in ranks} == set(b1)
    assert "(-b 8 -e 8G -f 2 -g 1)" in ranks[0]  # the default's arguments reached the stand-in
    note = validator.finish(ref)
    assert note.count("drained again") == 4 and note.endswith("reservation nr-domain-r1-a1 deleted")
    assert "nr-domain-r1-a1" not in cluster.scontrol("show", "reservation", check=False).stdout
    for node in b1:
        state, flags, reason = cluster.nodes_now()[node]
        assert "DRAIN" in flags and reason == f"{PREFIX} nvswitch sxid", (node, state, flags, reason)


def test_a_rank_failing_on_one_tray_fails_the_check_with_its_exit_code(
    slurm_block_cluster: SlurmCluster, b1: list[str], domain: Path,
) -> None:
    """The ranks on gpu-node-2 exit 3: the one job fails with 3; a human's drain placed on gpu-node-3
    while the check ran is left as they placed it, the others drained again as they were."""
    cluster = slurm_block_cluster
    (domain / "bin" / "fail-on").write_text(b1[2])
    validator, ref, info = run_check(cluster, b1, domain, "nr-domain-r2-a1")
    assert (info["NumNodes"], info["Reservation"], info["JobState"]) == ("4", "nr-domain-r2-a1", "FAILED")
    assert info["ExitCode"] == "3:0"
    result = validator.poll(ref)
    assert result.done and not result.passed and result.exit_code == 3
    assert "Out of bounds values : 1 FAILED" in result.output
    cluster.scontrol("update", f"nodename={b1[3]}", "state=drain", "reason=ops: cable check")
    note = validator.finish(ref)
    assert note.count("drained again") == 3 and "gpu-node-3: left the drain someone placed meanwhile" in note
    assert "nr-domain-r2-a1" not in cluster.scontrol("show", "reservation", check=False).stdout
    reasons = {node: cluster.nodes_now()[node][2] for node in b1}
    assert reasons == {**{n: f"{PREFIX} nvswitch sxid" for n in b1[:3]}, b1[3]: "ops: cable check"}


def test_through_either_backend_the_check_spans_every_node_of_the_plain_cluster(
    slurm: SlurmCluster, slurm_backend: str, request: pytest.FixtureRequest,
) -> None:
    """The same over the plain cluster's four nodes (one slurmd each), through sbatch or, where its API
    version creates reservations (26.05), slurmrestd: its job has a fixed PATH, so the stand-in is named
    by its path."""
    work = slurm.workdir / f"domain-{slurm_backend}-{time.monotonic_ns()}"
    work.mkdir()
    (work / "all_reduce_perf").write_text(STAND_IN)
    (work / "all_reduce_perf").chmod(0o755)
    cfg = settings_for(slurm, work)
    validator = SlurmValidator(cfg.slurm, cfg.validation)
    request.addfinalizer(validator.close)
    name = f"nr-domain-r3-a1-{slurm_backend}"  # slurmctld remembers the other backend's job (MinJobAge)
    check = ValidationCheck(slurm.nodes[0], name, ("srun", "--ntasks-per-node=1", str(work / "all_reduce_perf")),
                            60, nodes=tuple(slurm.nodes))
    slurm.scontrol("update", f"nodename={','.join(slurm.nodes)}", "state=drain", f"reason={PREFIX} imex down")
    ref = {**validator.start(check), "node": check.node}
    wait_for(lambda: validator.poll(ref).done, 60, "the domain check to end")
    info = job(slurm, ref["job_id"])
    assert (info["NumNodes"], info["NodeList"], info["Reservation"], info["ExitCode"]) == (
        "4", "gpu-node-[0-3]", name, "0:0")
    assert validator.poll(ref).passed
    assert validator.finish(ref).count("drained again") == 4
    assert name not in slurm.scontrol("show", "reservation", check=False).stdout
    assert validator.io.through == ("scontrol and sbatch" if slurm_backend == "cli" or slurm.release < (25, 5)
                                    else f"slurmrestd {cfg.slurm.rest_api_version}")
