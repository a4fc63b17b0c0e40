"""Switch domains from a topology.conf, and the choice of source the Slurm watcher logs at start-up."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from remediation.adapters.slurm.topology import read_topology_conf, topology_file, topology_source
from remediation.domain.events import NodeEvent
from remediation.domain.topology import (
    BLOCK,
    LEAF_SWITCH,
    SWITCH,
    TopologyError,
    parse_topology,
    parse_topology_conf,
    parse_topology_yaml,
    slurm_domains,
)
from remediation.ports.errors import ConfigError
from remediation.settings import Settings, SlurmSettings
from tests.unit.domain.test_topology import AGGREGATED_2411, BLOCKS_2411, TREE_2411, Bus

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
    assert [(s.kind, s.name, len(s.nodes), s.block_size) for s in parse_topology_conf(text)] == [
        (BLOCK, "b1", 18, 18),
        (BLOCK, "b2", 18, 18),
    ]


# What scripts/slurm-up.sh writes for SLURM_CI_BLOCKS=4 SLURM_CI_BLOCK_SIZE=4 and 16 nodes, as
# topology.conf (24.11) and as topology.yaml (26.05); slurmctld prints BLOCKS_2411 for either.
BLOCK_CONF = "".join(f"BlockName=b{b} Nodes=gpu-node-[{4 * b - 4}-{4 * b - 1}]\n" for b in range(1, 5)) + "BlockSizes=4\n"
BLOCK_YAML = "---\n- topology: blocks\n  cluster_default: true\n  block:\n    block_sizes: [4]\n    blocks:\n" + "".join(
    f'      - block: b{b}\n        nodes: "gpu-node-[{4 * b - 4}-{4 * b - 1}]"\n' for b in range(1, 5)
)


@pytest.mark.parametrize(
    ("parse", "text"), [(parse_topology_conf, BLOCK_CONF), (parse_topology_yaml, BLOCK_YAML)], ids=["conf", "yaml"]
)
def test_a_block_file_gives_what_scontrol_prints_for_it(parse, text: str) -> None:  # type: ignore[no-untyped-def]
    assert parse(text) == parse_topology(BLOCKS_2411)
    assert slurm_domains(parse(text))["gpu-node-4"] == {BLOCK: "b2"}


@pytest.mark.parametrize(
    ("conf", "yaml_sizes"),
    [("BlockSizes=4,8\n", "    block_sizes: [4, 8]\n"), ("", "")],
    ids=["given", "default-is-the-smallest-block"],
)
def test_the_smallest_block_size_is_the_one_scontrol_prints(conf: str, yaml_sizes: str) -> None:
    # Without BlockSizes slurmctld plans with the smallest block's node count (26.05.5: blocks of 6
    # and 10 print BlockSize=6).
    blocks = "BlockName=x1 Nodes=gpu-node-[0-5]\nBlockName=x2 Nodes=gpu-node-[6-15]\n"
    yaml_text = (
        f"- topology: t\n  block:\n{yaml_sizes}    blocks:\n"
        "      - {block: x1, nodes: 'gpu-node-[0-5]'}\n      - {block: x2, nodes: 'gpu-node-[6-15]'}\n"
    )
    expected = 4 if conf else 6
    assert {s.block_size for s in parse_topology_conf(blocks + conf)} == {expected}
    assert {s.block_size for s in parse_topology_yaml(yaml_text)} == {expected}


def test_aggregated_blocks_match_the_file_they_come_from() -> None:
    conf = "BlockName=x1 Nodes=gpu-node-[0-7]\nBlockName=x2 Nodes=gpu-node-[8-15]\nBlockSizes=4,8\n"
    assert parse_topology_conf(conf) == parse_topology(AGGREGATED_2411)


TREE_YAML = """\
- topology: tree
  tree:
    switches:
      - switch: spine
        children: leaf[0-1]
      - switch: leaf0
        nodes: gpu-node-[0-1]
      - switch: leaf1
        nodes: gpu-node-[2-3]
"""


def test_a_tree_in_topology_yaml_is_the_same_switches() -> None:
    assert sorted(parse_topology_yaml(TREE_YAML), key=lambda s: s.name) == sorted(
        parse_topology(TREE_2411), key=lambda s: s.name
    )


@pytest.mark.parametrize(
    ("text", "names"),
    [
        # topology.yaml(5)'s example, shortened: the cluster_default tree, not the block topology after it.
        (TREE_YAML.replace("  tree:", "  cluster_default: true\n  tree:") + BLOCK_YAML.replace("---\n", "").replace(
            "cluster_default: true", "cluster_default: false"), ["spine", "leaf0", "leaf1"]),
        # 26.05.5 shows the block topology named second when it alone is cluster_default ...
        (TREE_YAML + BLOCK_YAML.replace("---\n", ""), ["b1", "b2", "b3", "b4"]),
        # ... and the first when none is; a flat one has nothing to show.
        (TREE_YAML + BLOCK_YAML.replace("---\n", "").replace("true", "false"), ["spine", "leaf0", "leaf1"]),
        ("- topology: f\n  flat: true\n" + BLOCK_YAML.replace("---\n", "").replace("true", "false"), []),
        ("", []),
    ],
    ids=["default-tree", "default-block", "first", "flat", "empty"],
)
def test_the_cluster_default_topology_is_the_one_read(text: str, names: list[str]) -> None:
    assert [s.name for s in parse_topology_yaml(text)] == names


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- topology: t\n  block: [\n", "topology.yaml line 3: not YAML"),
        ("topology: t\n", "not a list of topologies"),
        ("- name: t\n  block: {}\n", "not a list of topologies"),
        ("- topology: t\n  cluster_default: true\n", "topology 't' has none of block, tree"),
        ("- topology: t\n  block: {block_sizes: [4]}\n", "block needs a list of blocks"),
        ("- topology: t\n  block: {blocks: [{nodes: n1}]}\n", "block #1 has no name"),
        ("- topology: t\n  block: {blocks: [{block: a, nodes: n1}, {block: a, nodes: n2}]}\n", "block 'a' is defined twice"),
        ("- topology: t\n  block: {block_sizes: [0], blocks: [{block: a, nodes: n1}]}\n", "block_sizes: 0 is not a positive"),
        ("- topology: t\n  block: {blocks: [{block: a, nodes: 'n[1-'}]}\n", "block 'a': nodes"),
        ("- topology: t\n  block: {blocks: [{block: a, nodes: {x: 1}}]}\n", "is not a hostlist"),
        ("- topology: t\n  tree: {switches: [{switch: s, children: x}]}\n", "switch 's' names undefined switch 'x'"),
        ("- topology: t\n  tree: {switches: [{nodes: n1}]}\n", "switch #1 has no name"),
    ],
    ids=["yaml", "not-a-list", "no-topology-key", "no-kind", "no-blocks", "unnamed-block", "block-twice",
         "bad-size", "bad-hostlist", "nodes-not-a-hostlist", "undefined-child", "unnamed-switch"],
)
def test_a_topology_yaml_that_cannot_be_read_names_the_fault(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=re.escape(message)):
        parse_topology_yaml(text)


def test_bad_block_sizes_in_topology_conf_name_the_line() -> None:
    with pytest.raises(TopologyError, match=re.escape("topology.conf line 2: BlockSizes: 'x' is not a positive")):
        parse_topology_conf("BlockName=b1 Nodes=n1\nBlockSizes=4,x\n")


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


@pytest.mark.parametrize(
    ("files", "named", "read"),
    [
        (("topology.yaml",), "topology.yaml", "topology.yaml"),
        (("topology.conf",), "topology.conf", "topology.conf"),
        (("topology.conf", "topology.yaml"), "topology.conf", "topology.yaml"),
        (("topology.conf", "topology.yaml"), ".", "topology.yaml"),
        (("topology.conf",), ".", "topology.conf"),
    ],
    ids=["yaml", "conf", "yaml-beside-conf-wins", "directory-yaml-wins", "directory-conf"],
)
def test_the_file_read_is_the_one_slurm_reads(tmp_path: Path, files: tuple[str, ...], named: str, read: str) -> None:
    texts = {"topology.conf": CONF, "topology.yaml": BLOCK_YAML}
    for name in files:
        (tmp_path / name).write_text(texts[name])
    path = (tmp_path / named).resolve()
    assert topology_file(path) == tmp_path / read
    source = topology_source(SlurmSettings(backend="rest", topology_conf=str(path)), _Rest())
    assert source.read is not None and source.read() == (
        parse_topology(BLOCKS_2411) if read == "topology.yaml" else parse_topology(TREE_2411)
    )
    assert source.origin.startswith(f"{read} at {tmp_path / read} (slurm.topology_conf)")


def test_the_watcher_publishes_a_topology_yaml_block_as_the_node_s_block_domain(tmp_path: Path) -> None:
    from remediation.watchers.slurm.topology import TopologyPublisher

    (tmp_path / "topology.yaml").write_text(BLOCK_YAML)
    settings = Settings(slurm={"backend": "rest", "topology_conf": str(tmp_path)}, incidents={"enabled": True})
    bus = Bus()
    publisher = TopologyPublisher(settings, bus, topology_source(settings.slurm, _Rest()))  # type: ignore[arg-type]
    assert publisher.step() == 16
    published = {e.node: e.domains for e in bus.published}
    assert published["gpu-node-0"] == {BLOCK: "b1"} and published["gpu-node-15"] == {BLOCK: "b4"}
    assert {e.reason for e in bus.published if e.node == "gpu-node-5"} == {"block=b2"}
    # Each block's smallest size rides along: the service says when a block is a partial domain.
    assert {e.node: e.domain_sizes for e in bus.published}["gpu-node-0"] == {BLOCK: 4}
    assert NodeEvent.parse(bus.published[0].to_json()).domain_sizes == {BLOCK: 4}
