"""Switch domains from a topology.conf, and the choice of source the Slurm watcher logs at start-up."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from remediation.adapters.slurm.topology import read_topology_conf, topology_source
from remediation.domain.topology import (
    BLOCK,
    LEAF_SWITCH,
    SWITCH,
    TopologyError,
    parse_topology,
    parse_topology_conf,
)
from remediation.ports.errors import ConfigError
from remediation.settings import Settings, SlurmSettings
from tests.unit.domain.test_topology import TREE_2411

# What scripts/slurm-up.sh writes for SLURM_CI_LEAVES=2 and 4 nodes; slurmctld prints TREE_2411 for it.
CONF = "SwitchName=leaf0 Nodes=gpu-node-[0-1]\nSwitchName=leaf1 Nodes=gpu-node-[2-3]\nSwitchName=spine Switches=leaf[0-1]\n"


def test_a_topology_conf_gives_what_scontrol_prints_for_it() -> None:
    assert parse_topology_conf(CONF) == parse_topology(TREE_2411)


def test_comments_continuations_and_any_case_of_keys_are_read_as_slurm_reads_them() -> None:
    text = (
        "# two pods\n"
        "switchname=leaf0 nodes=n[1-2] LinkSpeed=100  # rack 1\n"
        "SwitchName=leaf1 \\\n   Nodes=n[3-4]\n"
        "\n"
        "SwitchName=agg Switches=leaf[0-1]\n"
        "SwitchName=core Switches=agg\n"
    )
    switches = {s.name: s for s in parse_topology_conf(text)}
    assert (switches["leaf1"].kind, switches["leaf1"].nodes) == (LEAF_SWITCH, ("n3", "n4"))
    assert (switches["agg"].kind, switches["agg"].level, len(switches["agg"].nodes)) == (SWITCH, 1, 4)
    assert (switches["core"].level, switches["core"].nodes) == (2, ("n1", "n2", "n3", "n4"))


def test_blocks_are_block_domains() -> None:
    text = "BlockName=b1 Nodes=node[01-18]\nBlockName=b2 Nodes=node[19-36]\nBlockSizes=18,36\n"
    assert [(s.kind, s.name, len(s.nodes)) for s in parse_topology_conf(text)] == [
        (BLOCK, "b1", 18),
        (BLOCK, "b2", 18),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SwitchName=a Nodes=n1\nSwitchName=a Nodes=n2\n", "line 2: switch 'a' is defined twice"),
        ("SwitchName=top Switches=leaf9\n", "switch 'top' names undefined switch 'leaf9'"),
        ("SwitchName=a Switches=b\nSwitchName=b Switches=a\n", "switches loop through a -> b -> a"),
        ("SwitchName=a Nodes=n[1-\n", "line 1"),
        ("Nodes=n1\n", "line 1: no SwitchName or BlockName"),
        ("SwitchName=a Nodes=n1 what\n", "line 1: cannot read"),
    ],
    ids=["twice", "undefined", "loop", "hostlist", "no-name", "garbage"],
)
def test_a_file_that_cannot_be_read_names_the_fault(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        parse_topology_conf(text, source="topology.conf")


def test_an_unreadable_file_is_a_configuration_fault(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="slurm.topology_conf .*missing.conf"):
        read_topology_conf(tmp_path / "missing.conf")


class _Rest:
    """A rest backend: no topology reader of its own."""


def test_the_rest_backend_reads_a_configured_topology_conf(tmp_path: Path) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text(CONF)
    source = topology_source(SlurmSettings(backend="rest", topology_conf=str(conf)), _Rest())
    assert source.read is not None and source.read() == parse_topology(TREE_2411)
    assert source.origin == f"topology.conf at {conf} (slurm.topology_conf)"


def test_the_rest_backend_falls_back_to_scontrol_where_it_is_installed(tmp_path: Path) -> None:
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\nprintf 'SwitchName=leaf0 Level=0 LinkSpeed=1 Nodes=n[1-2]\\n'\n")
    scontrol.chmod(0o755)
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text("ClusterName=c\n")
    settings = SlurmSettings(backend="rest", scontrol=str(scontrol), slurm_conf=str(slurm_conf))
    source = topology_source(settings, _Rest())
    assert source.origin == "scontrol show topology (slurmrestd serves no switch list)"
    assert source.read is not None and [s.nodes for s in source.read()] == [("n1", "n2")]


def test_scontrol_without_a_slurm_conf_is_no_source(tmp_path: Path) -> None:
    # The deploy image ships scontrol; a rest deployment mounts no slurm.conf (nor munge) for it.
    settings = SlurmSettings(backend="rest", scontrol="/bin/true", slurm_conf=str(tmp_path / "none.conf"))
    source = topology_source(settings, _Rest())
    assert source.read is None and "has no slurm.conf" in source.origin


def test_no_source_is_said_at_start_up_never_silent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from remediation.watchers.slurm.topology import TopologyPublisher

    settings = Settings(slurm={"backend": "rest", "scontrol": str(tmp_path / "no-scontrol")})
    source = topology_source(settings.slurm, _Rest())
    assert source.read is None
    with caplog.at_level(logging.INFO, logger="remediation.watchers.slurm.watcher"):
        publisher = TopologyPublisher(settings, object(), source)  # type: ignore[arg-type]
    assert not publisher.enabled
    [record] = [r for r in caplog.records if "switch domains" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "slurmrestd serves no switch list, slurm.topology_conf is unset" in record.getMessage()
