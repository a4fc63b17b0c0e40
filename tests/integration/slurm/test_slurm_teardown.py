"""Stopping a test cluster (``scripts/slurm-down.sh``) ends everything it ran, on each release.

slurmstepd outlives slurmd and slurmctld by design (a job survives a daemon restart) and blocks
SIGTERM: a job still running when its cluster stops leaves its stepd behind, waiting for a controller
that is gone, and a pending job may start while the others end. A cluster of this test's own stops with
one job of each kind: running, pending, and running on a node whose slurmd was SIGKILLed under it
(Slurm cannot tell that stepd to end). Afterwards nothing runs that works in the cluster's directory,
names it, or holds a socket in it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from contextlib import contextmanager

import pytest

from tests.integration.slurm.conftest import VERSIONS, SlurmCluster, start_cluster
from tests.leftovers import find
from tests.pace import within

pytestmark = pytest.mark.slurm


def submit(cluster: SlurmCluster, node: str, *extra: str) -> str:
    out = cluster.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "-D", str(cluster.workdir), *extra,
                      "--wrap", "sleep 300")
    return out.stdout.strip().split(";")[0]


def wait_until(what: Callable[[], object], expected: object) -> None:
    deadline = within(30)
    while (now := what()) != expected:
        assert time.monotonic() < deadline, now
        time.sleep(0.2)


def jobs(cluster: SlurmCluster) -> dict[str, str]:
    return dict(line.split() for line in cluster.run("squeue", "-h", "-o", "%A %T").stdout.splitlines())


def stepds(cluster: SlurmCluster) -> list[str]:
    """The command lines of the cluster's slurmstepds (its spool holds their sockets)."""
    return sorted(x.cmdline for x in find(None, cluster.dir) if x.cmdline.startswith("slurmstepd:"))


@pytest.mark.parametrize("release", VERSIONS, ids=[f"slurm{v}" for v in VERSIONS])
def test_stopping_a_cluster_ends_its_jobs_and_their_stepds(
    release: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with contextmanager(start_cluster)(release, tmp_path_factory, leaves=0) as cluster:
        running, orphaned = submit(cluster, "gpu-node-0"), submit(cluster, "gpu-node-1")
        pending = submit(cluster, "gpu-node-2", "--begin=now+600")
        wait_until(lambda: jobs(cluster), {running: "RUNNING", orphaned: "RUNNING", pending: "PENDING"})
        wait_until(lambda: stepds(cluster), [f"slurmstepd: [{running}.batch]", f"slurmstepd: [{orphaned}.batch]"])
        slurmd = cluster.slurmd_pid("gpu-node-1")
        assert slurmd is not None
        os.kill(slurmd, signal.SIGKILL)
    assert find(None, cluster.dir) == []
