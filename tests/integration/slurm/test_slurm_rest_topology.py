"""Switch domains for the rest backend, on the real slurmctld of every release under test.

slurmrestd serves no switch list (none of 22.05, 24.11 or 26.05 does), so the rest backend's watcher
learns the domains from the cluster's topology.conf when ``slurm.topology_conf`` names it, else from
``scontrol show topology`` where scontrol is installed, and otherwise learns none and says so at
start-up. The topology cluster (conftest ``slurm_topo``): leaf0 = gpu-node-[0-1], leaf1 =
gpu-node-[2-3], one spine. Each source must give the watcher exactly what slurmctld itself reports.
"""

from __future__ import annotations

import logging

import pytest
import redis

from remediation.adapters.slurm.cli import CliSlurm
from remediation.domain.events import EventKind
from remediation.domain.topology import LEAF_SWITCH, SWITCH, slurm_domains
from remediation.settings import Settings, load_settings
from tests.conftest import REDIS_URL
from tests.integration.slurm.conftest import REST_APIS, SlurmCluster
from tests.integration.slurm.test_slurm_watcher import events, started, watcher

pytestmark = pytest.mark.slurm


def rest_watcher_settings(cluster: SlurmCluster, prefix: str, **slurm: object) -> Settings:
    release = f"{cluster.release[0]}.{cluster.release[1]:02d}"
    options = {**cluster.slurm_options(), **cluster.rest_options(REST_APIS[release][-1]), **slurm}
    return load_settings(
        broker={"redis_url": REDIS_URL, "key_prefix": prefix},
        slurm=options,
        incidents={"enabled": True, "slurm_topology": True},
    )


def domains_published(client: redis.Redis, prefix: str) -> dict[str, dict[str, str]]:
    return {e.node: dict(e.domains or {}) for e in events(client, prefix) if e.kind is EventKind.DOMAINS}


def what_slurmctld_says(cluster: SlurmCluster) -> dict[str, dict[str, str]]:
    return slurm_domains(CliSlurm(cluster.settings()).topology())


def learn(
    cluster: SlurmCluster,
    settings: Settings,
    client: redis.Redis,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> tuple[dict[str, dict[str, str]], list[logging.LogRecord]]:
    """Run the real watcher until its first resync and topology publish; what it published and said."""
    with caplog.at_level(logging.INFO, logger="remediation.watchers.slurm.watcher"), watcher(settings, client, prefix) as running:
        started(client, prefix, cluster.nodes)
        running.had_its_chance()  # the topology is published in the same passes as the first resync
    said = [r for r in caplog.records if "switch domains" in r.getMessage()]
    return domains_published(client, prefix), said


def test_the_rest_backend_learns_the_domains_from_a_configured_topology_conf(
    slurm_topo: SlurmCluster, redis_client: redis.Redis, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    conf = slurm_topo.dir / "topology.conf"  # the file slurmctld itself reads
    # No scontrol beside this watcher: the file alone must do.
    settings = rest_watcher_settings(
        slurm_topo, redis_prefix, topology_conf=str(conf), scontrol="/nonexistent"
    )
    published, said = learn(slurm_topo, settings, redis_client, redis_prefix, caplog)
    assert published == what_slurmctld_says(slurm_topo)
    assert published["gpu-node-2"] == {LEAF_SWITCH: "leaf1", SWITCH: "spine"}
    assert [(r.levelno, r.getMessage()) for r in said] == [
        (logging.INFO, f"switch domains from topology.conf at {conf} (slurm.topology_conf)")
    ]


def test_the_rest_backend_falls_back_to_scontrol_where_the_watcher_has_it(
    slurm_topo: SlurmCluster, redis_client: redis.Redis, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = rest_watcher_settings(slurm_topo, redis_prefix)  # the cluster's scontrol (its chroot wrapper)
    published, said = learn(slurm_topo, settings, redis_client, redis_prefix, caplog)
    assert published == what_slurmctld_says(slurm_topo) and len(published) == len(slurm_topo.nodes)
    assert [r.getMessage() for r in said] == [
        "switch domains from scontrol show topology (slurmrestd serves no switch list)"
    ]


def test_with_no_source_the_rest_backend_says_so_and_publishes_no_domains(
    slurm_topo: SlurmCluster, redis_client: redis.Redis, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = rest_watcher_settings(slurm_topo, redis_prefix, scontrol="/nonexistent/scontrol")
    published, said = learn(slurm_topo, settings, redis_client, redis_prefix, caplog)
    assert published == {}  # after the barrier: the watcher had its polls
    [warning] = said
    assert warning.levelno == logging.WARNING
    assert "slurmrestd serves no switch list, slurm.topology_conf is unset" in warning.getMessage()
