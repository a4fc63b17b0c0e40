"""Merged Slurm commands (remediation.adapters.slurm.merged) against the real slurmctld: one command for
many nodes answers each node as its own command would, and concurrent steps' calls share commands."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from remediation.adapters.slurm.cli import CliSlurm
from remediation.adapters.slurm.merged import MergedSlurm
from remediation.ports.errors import UnknownNode
from tests.integration.slurm.conftest import SlurmCluster
from tests.pace import within

pytestmark = pytest.mark.slurm


class Counted(MergedSlurm):
    """MergedSlurm that counts the commands it runs, by verb."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.commands: list[str] = []
        self._lock = threading.Lock()

    def _run(self, argv: list[str]) -> str:
        with self._lock:
            self.commands.append(" ".join(argv[1:3]))
        return super()._run(argv)


def test_one_command_reads_several_nodes_as_single_reads_do(slurm: SlurmCluster) -> None:
    cli = CliSlurm(slurm.settings())
    cli.drain("gpu-node-1", "remediation: xid 79")
    merged = cli.statuses(["gpu-node-0", "gpu-node-1"])
    assert merged == {"gpu-node-0": cli.status("gpu-node-0"), "gpu-node-1": cli.status("gpu-node-1")}
    with pytest.raises(UnknownNode):  # Slurm fails the whole list for one name it does not know
        cli.statuses(["gpu-node-0", "gpu-node-404"])


def test_concurrent_reads_answer_each_node_even_beside_an_unknown_one(slurm: SlurmCluster) -> None:
    merged = Counted(slurm.settings())
    names = ["gpu-node-0", "gpu-node-404", "gpu-node-2", "gpu-node-3"]

    def read(name: str) -> object:
        try:
            return merged.status(name).name
        except UnknownNode as exc:
            return exc

    with ThreadPoolExecutor(len(names)) as pool:
        answers = list(pool.map(read, names))
    assert answers[0] == "gpu-node-0" and answers[2:] == ["gpu-node-2", "gpu-node-3"]
    assert isinstance(answers[1], UnknownNode)


def test_jobs_of_several_nodes_are_each_nodes_own(slurm: SlurmCluster) -> None:
    cli = CliSlurm(slurm.settings())

    def submit(*argv: str) -> str:
        out = slurm.run("sbatch", "--parsable", *argv, "-o", "/dev/null", "-D", str(slurm.workdir), "--wrap",
                        "sleep 120").stdout  # fmt: skip
        return out.strip().split(";")[0]

    both = submit("-N", "2", "-w", "gpu-node-0,gpu-node-1")
    one = submit("-w", "gpu-node-2")
    try:
        deadline = within(20)
        while len(cli.jobs_on("gpu-node-0")) + len(cli.jobs_on("gpu-node-2")) < 2:
            assert time.monotonic() < deadline, "the jobs never started"
            time.sleep(0.1)
        jobs = cli.jobs_by_node(["gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3"])
        assert jobs == {"gpu-node-0": [both], "gpu-node-1": [both], "gpu-node-2": [one], "gpu-node-3": []}
        assert all(jobs[n] == cli.jobs_on(n) for n in jobs)
    finally:
        slurm.run("scancel", both, one, check=False)


def test_concurrent_drains_share_commands_and_each_is_recorded(slurm: SlurmCluster) -> None:
    merged = Counted(slurm.settings())
    nodes = ["gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3"]
    with ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(lambda n: merged.drain(n, "remediation: rack PDU lost power"), nodes))
    now = slurm.nodes_now()
    assert all(now[n][1] >= {"DRAIN"} and now[n][2] == "remediation: rack PDU lost power" for n in nodes)
    updates = [c for c in merged.commands if c.startswith("update")]
    reads = [c for c in merged.commands if c.startswith("show node")]
    assert 1 <= len(updates) <= len(nodes) and 1 <= len(reads) <= len(nodes)
    assert merged._drains.batches == len(updates)  # each run one command: nothing was refused
    merged.commands.clear()
    merged.drain("gpu-node-0", "remediation: rack PDU lost power")  # asks nothing new: read, no update
    assert merged.commands == ["show node"]


def test_a_drain_slurm_refuses_for_one_node_is_that_nodes_alone(slurm: SlurmCluster) -> None:
    merged = Counted(slurm.settings())
    answers = merged._drain_all([("gpu-node-1", "remediation: a"), ("gpu-node-404", "remediation: a")])
    assert answers[("gpu-node-1", "remediation: a")] is None
    assert isinstance(answers[("gpu-node-404", "remediation: a")], UnknownNode)
    assert slurm.nodes_now()["gpu-node-1"][2] == "remediation: a"
