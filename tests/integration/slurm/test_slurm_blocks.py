"""Block domains (topology/block) on the real slurmctld of 24.11 and 26.05; 22.05 has no topology/block.

The block cluster (conftest ``slurm_block_cluster``): a controller alone, 16 CLOUD nodes in blocks
b1..b4 of 4, BlockSizes=4; 24.11 is given a topology.conf, 26.05 a topology.yaml. What ``scontrol show
topology`` answers, what our parser makes of the file slurmctld was given, and what the watcher's
source learns must be one and the same.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from remediation.adapters.slurm.cli import CliSlurm
from remediation.adapters.slurm.topology import read_topology_conf, topology_source
from remediation.domain.topology import BLOCK, Switch, slurm_domains
from remediation.hostlist import expand
from tests.integration.slurm.conftest import BLOCK_RELEASES, BLOCK_SIZE, BLOCKS, SlurmCluster
from tests.integration.workerproc import wait_for

pytestmark = pytest.mark.slurm


def scontrol_topology(cluster: SlurmCluster) -> list[Switch]:
    return CliSlurm(cluster.settings()).topology()


def test_scontrol_shows_the_blocks_of_the_file_slurmctld_was_given(slurm_block_cluster: SlurmCluster) -> None:
    cluster = slurm_block_cluster
    given = cluster.dir / f"topology.{BLOCK_RELEASES[f'{cluster.release[0]}.{cluster.release[1]:02d}']}"
    shown = scontrol_topology(cluster)
    assert [(s.kind, s.name, s.nodes, s.block_size) for s in shown] == [
        (BLOCK, f"b{b}", tuple(expand(f"gpu-node-[{(b - 1) * BLOCK_SIZE}-{b * BLOCK_SIZE - 1}]")), BLOCK_SIZE)
        for b in range(1, BLOCKS + 1)
    ]
    assert read_topology_conf(given) == shown  # our parser of the very file slurmctld read
    # The watcher's source, given slurm.conf's directory as a site would: the same domains.
    source = topology_source(cluster.settings(backend="rest", topology_conf=str(cluster.dir)), object())
    assert source.origin.startswith(f"{given.name} at {given} ")
    assert source.read is not None and slurm_domains(source.read()) == slurm_domains(shown)
    assert slurm_domains(shown)["gpu-node-5"] == {BLOCK: "b2"}


@pytest.fixture
def rewritten(slurm_block_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The block cluster, its topology files put back (and slurmctld reconfigured) after the test."""
    cluster = slurm_block_cluster
    kept = {p: p.read_text() for p in cluster.dir.glob("topology.*")}
    yield cluster
    for path in cluster.dir.glob("topology.*"):
        if path not in kept:
            path.unlink()
    for path, text in kept.items():
        path.write_text(text)
    reconfigure_until(cluster, [f"b{b}" for b in range(1, BLOCKS + 1)])


def reconfigure_until(cluster: SlurmCluster, names: list[str], timeout: float = 20) -> list[Switch]:
    """``scontrol reconfigure``, then wait until slurmctld shows the blocks ``names``: the barrier that it
    has read its files again."""
    cluster.scontrol("reconfigure")

    def shown() -> list[Switch] | None:
        blocks = scontrol_topology(cluster) if cluster.scontrol("ping", check=False).returncode == 0 else []
        return blocks if [s.name for s in blocks] == names else None

    found: list[Switch] = wait_for(shown, timeout, f"slurmctld to show blocks {names} after reconfigure")
    return found


def test_topology_yaml_comes_before_topology_conf_from_25_05_on(rewritten: SlurmCluster) -> None:
    cluster = rewritten
    yaml_file, conf = cluster.dir / "topology.yaml", cluster.dir / "topology.conf"
    # Two blocks of 8 in a topology.yaml; one other block of all 16 in a topology.conf beside it.
    yaml_file.write_text(
        "- topology: nvl\n  cluster_default: true\n  block:\n    block_sizes: [8]\n    blocks:\n"
        "      - {block: c1, nodes: 'gpu-node-[0-7]'}\n      - {block: c2, nodes: 'gpu-node-[8-15]'}\n"
    )
    conf.write_text("BlockName=x1 Nodes=gpu-node-[0-15]\nBlockSizes=16\n")
    if cluster.release < (25, 5):  # 24.11 knows no topology.yaml: it reads topology.conf alone
        assert [(s.name, s.block_size) for s in reconfigure_until(cluster, ["x1"])] == [("x1", 16)]
        return
    shown = reconfigure_until(cluster, ["c1", "c2"])
    assert {s.block_size for s in shown} == {8}
    # The watcher's source, named the topology.conf, reads the topology.yaml beside it, as slurmctld did.
    source = topology_source(cluster.settings(backend="rest", topology_conf=str(conf)), object())
    assert source.read is not None and source.read() == shown
    assert source.origin.startswith(f"topology.yaml at {yaml_file} ")
