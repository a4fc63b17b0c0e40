"""The topology parser on real ``scontrol show topology`` output, the incident rule, and the rule that makes
K trays' NVLink faults in one NVLink domain the domain's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from remediation.domain.events import EventKind, InvalidEvent, NodeEvent
from remediation.domain.topology import (
    BLOCK,
    LEAF_SWITCH,
    SWITCH,
    DomainFault,
    Rule,
    TopologyError,
    correlate,
    domain_faults,
    label_domains,
    parse_topology,
    qualifies,
    slurm_domains,
)
from remediation.settings import SettingsError, load_settings

# Slurm 22.05.8 (Debian 12), topology/tree, as the test cluster prints it: each line ends in a space.
TREE_2205 = (
    "SwitchName=leaf0 Level=0 LinkSpeed=1 Nodes=gpu-node-[0-1] \n"
    "SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=gpu-node-[2-3] \n"
    "SwitchName=spine Level=1 LinkSpeed=1 Nodes=gpu-node-[0-3] Switches=leaf[0-1] \n"
)
# Slurm 24.11.5 (the cached test root), the same topology.conf: the same fields, no trailing space.
TREE_2411 = (
    "SwitchName=leaf0 Level=0 LinkSpeed=1 Nodes=gpu-node-[0-1]\n"
    "SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=gpu-node-[2-3]\n"
    "SwitchName=spine Level=1 LinkSpeed=1 Nodes=gpu-node-[0-3] Switches=leaf[0-1]\n"
)
# Slurm 26.05.5 (the cached sid root): the same as 24.11, byte for byte.
TREE_2605 = TREE_2411
# topology/block, BlockSizes=4: 4 blocks of 4 (SLURM_CI_BLOCKS=4); 24.11.5 and 26.05.5 print the same.
BLOCKS_2411 = (
    "BlockName=b1 BlockIndex=0 Nodes=gpu-node-[0-3] BlockSize=4\n"
    "BlockName=b2 BlockIndex=1 Nodes=gpu-node-[4-7] BlockSize=4\n"
    "BlockName=b3 BlockIndex=2 Nodes=gpu-node-[8-11] BlockSize=4\n"
    "BlockName=b4 BlockIndex=3 Nodes=gpu-node-[12-15] BlockSize=4\n"
)
# BlockSizes=4,8 over two blocks of 8 (24.11.5): each block prints the base size, and the pair BlockSizes
# joins for planning is one more line.
AGGREGATED_2411 = (
    "BlockName=x1 BlockIndex=0 Nodes=gpu-node-[0-7] BlockSize=4\n"
    "BlockName=x2 BlockIndex=1 Nodes=gpu-node-[8-15] BlockSize=4\n"
    "AggregatedBlock=x[1-2] BlockIndex=2 Nodes=gpu-node-[0-15] BlockSize=8\n"
)


@pytest.mark.parametrize("text", [TREE_2205, TREE_2411, TREE_2605], ids=["22.05", "24.11", "26.05"])
def test_tree_output_gives_each_node_its_leaf_and_the_switch_above(text: str) -> None:
    switches = parse_topology(text)
    assert [(s.kind, s.level) for s in switches] == [(LEAF_SWITCH, 0), (LEAF_SWITCH, 0), (SWITCH, 1)]
    domains = slurm_domains(switches)
    first, spine = switches[0], switches[2]
    assert domains[first.nodes[0]] == {LEAF_SWITCH: first.name, SWITCH: spine.name}
    assert len(domains) == len(spine.nodes) == 2 * len(first.nodes)


def test_block_output_gives_blocks_and_their_smallest_size() -> None:
    switches = parse_topology(BLOCKS_2411)
    assert [(s.kind, s.name, len(s.nodes), s.block_size) for s in switches] == [
        (BLOCK, f"b{i}", 4, 4) for i in range(1, 5)
    ]
    assert slurm_domains(switches)["gpu-node-5"] == {BLOCK: "b2"}


def test_an_aggregated_block_is_no_domain_of_its_own() -> None:
    switches = parse_topology(AGGREGATED_2411)
    assert [(s.name, s.nodes[-1], s.block_size) for s in switches] == [("x1", "gpu-node-7", 4), ("x2", "gpu-node-15", 4)]
    assert slurm_domains(switches)["gpu-node-8"] == {BLOCK: "x2"}


def test_a_switch_has_no_block_size() -> None:
    assert {s.block_size for s in parse_topology(TREE_2411)} == {None}


@pytest.mark.parametrize("text", ["", "\n", "No topology information available\n"], ids=["empty", "blank", "none"])
def test_no_topology_plugin_means_no_domains(text: str) -> None:
    assert parse_topology(text) == []


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("SwitchName=s1 Level=0 LinkSpeed=1 Nodes=node[1-\n", "line 1: Nodes"),
        ("SwitchName=s1 Level=x Nodes=n1\n", "Level='x'"),
        ("SwitchName=s1 Nodes=n1\nsomething odd\n", "line 2: cannot read"),
        ("Foo=bar\n", "no SwitchName or BlockName"),
        ("BlockName=b1 Nodes=n1 BlockSize=four\n", "BlockSize='four'"),
    ],
    ids=["bad-hostlist", "bad-level", "garbage", "unknown-record", "bad-block-size"],
)
def test_malformed_output_is_a_clear_error(text: str, fragment: str) -> None:
    with pytest.raises(TopologyError, match=r".*") as err:
        parse_topology(text)
    assert fragment in str(err.value)


def test_label_domains_keep_only_configured_non_empty_labels() -> None:
    labels = {"topology.kubernetes.io/zone": "us-central1-a", "nvidia.com/gpu.clique": "", "other": "x"}
    assert label_domains(labels, ["topology.kubernetes.io/zone", "nvidia.com/gpu.clique"]) == {
        "topology.kubernetes.io/zone": "us-central1-a"}


def test_domains_ride_only_on_domains_events() -> None:
    now = datetime.now(UTC)
    ok = NodeEvent(source="slurm", node="n1", kind=EventKind.DOMAINS, state="topology",
                   domains={LEAF_SWITCH: "s1"}, observed_at=now)
    assert NodeEvent.parse(ok.to_json()).domains == {LEAF_SWITCH: "s1"}
    with pytest.raises(InvalidEvent, match="domains"):
        NodeEvent.parse({"source": "slurm", "node": "n1", "kind": "inventory", "state": "IDLE",
                         "domains": {"x": "y"}, "observed_at": now.isoformat()})


# ------------------------------------------------------------------------------------------ the rule

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
RULE = Rule(min_nodes=4, min_fraction=0.5, window_s=60)
LEAF0 = {f"n{i}" for i in range(4)}
LEAF1 = {f"n{i}" for i in range(4, 8)}
MEMBERS = {(LEAF_SWITCH, "leaf0"): LEAF0, (LEAF_SWITCH, "leaf1"): LEAF1, (SWITCH, "spine"): LEAF0 | LEAF1}


def at(seconds_ago: float) -> datetime:
    return NOW - timedelta(seconds=seconds_ago)


@pytest.mark.parametrize(
    ("failed", "size", "expected"),
    [(1, 1, False), (2, 4, True), (2, 5, False), (4, 100, True), (3, 100, False)],
    ids=["one-node-never", "half", "under-half", "k-nodes", "under-k"],
)
def test_k_nodes_or_a_fraction_and_never_one(failed: int, size: int, expected: bool) -> None:
    assert qualifies(failed, size, RULE) is expected


def test_a_whole_leaf_is_one_incident_and_the_spine_adds_nothing() -> None:
    found = correlate({n: at(5) for n in LEAF0}, MEMBERS, (), now=NOW, rule=RULE)
    assert [(c.kind, c.name, c.nodes, c.size, c.cause) for c in found] == [
        (LEAF_SWITCH, "leaf0", tuple(sorted(LEAF0)), 4, "leaf switch")]


def test_a_whole_spine_is_one_incident_not_two_leaves() -> None:
    found = correlate({n: at(5) for n in LEAF0 | LEAF1}, MEMBERS, (), now=NOW, rule=RULE)
    assert [(c.name, len(c.nodes)) for c in found] == [("spine", 8)]


def test_one_node_alone_is_no_incident() -> None:
    assert correlate({"n5": at(1)}, MEMBERS, (), now=NOW, rule=RULE) == []


def test_failures_outside_the_window_do_not_count() -> None:
    failed = {"n0": at(5), "n1": at(70), "n2": at(90)}
    assert correlate(failed, MEMBERS, (), now=NOW, rule=RULE) == []
    failed["n1"] = at(59)
    assert [c.nodes for c in correlate(failed, MEMBERS, (), now=NOW, rule=RULE)] == [("n0", "n1")]


def test_nodes_already_in_an_incident_are_not_counted_again() -> None:
    failed = {n: at(5) for n in LEAF0}
    assert correlate(failed, MEMBERS, LEAF0, now=NOW, rule=RULE) == []
    assert [c.nodes for c in correlate(failed, MEMBERS, {"n0", "n1"}, now=NOW, rule=RULE)] == [("n2", "n3")]


# ------------------------------------------------------------------- the Slurm watcher's publisher


class Bus:
    def __init__(self) -> None:
        self.published: list[NodeEvent] = []

    def publish(self, events: list[NodeEvent]) -> int:
        self.published.extend(events)
        return len(events)


def publisher(read):  # type: ignore[no-untyped-def]
    from remediation.adapters.slurm.topology import TopologySource
    from remediation.settings import Settings
    from remediation.watchers.slurm.topology import TopologyPublisher

    bus = Bus()
    source = TopologySource(read, "a test")
    pub = TopologyPublisher(Settings(incidents={"topology_refresh_s": 0.001}), bus, source)  # type: ignore[arg-type]
    return pub, bus


def test_publisher_sends_only_what_changed_and_keeps_the_last_on_bad_output() -> None:
    outputs = [TREE_2205, TREE_2205, "SwitchName=leaf0 Nodes=gpu-node-[0-\n",
               TREE_2205.replace("gpu-node-[2-3]", "gpu-node-2")]
    pub, bus = publisher(lambda: parse_topology(outputs.pop(0)))
    assert pub.step() == 4 and {e.node for e in bus.published} == {f"gpu-node-{i}" for i in range(4)}
    assert all(e.kind is EventKind.DOMAINS and e.source.value == "slurm" for e in bus.published)
    pub.due = 0.0
    assert pub.step() == 0  # the same topology again: nothing new
    pub.due = 0.0
    assert pub.step() == 0 and len(bus.published) == 4  # unreadable: logged, the last domains stand
    pub.due = 0.0
    assert pub.step() == 1  # gpu-node-3 left leaf1
    assert (bus.published[-1].node, bus.published[-1].domains) == ("gpu-node-3", {SWITCH: "spine"})


def test_no_topology_plugin_publishes_nothing() -> None:
    pub, bus = publisher(lambda: [])
    assert pub.step() == 0 and bus.published == []


def test_a_domain_size_is_for_a_kind_the_event_names_and_a_positive_count() -> None:
    from datetime import UTC, datetime

    from pydantic import ValidationError

    from remediation.domain.events import Source

    def event(**extra: object) -> NodeEvent:
        return NodeEvent(source=Source.SLURM, node="gpu-node-0", kind=EventKind.DOMAINS, state="topology",
                         domains={BLOCK: "b1"}, observed_at=datetime(2026, 11, 1, tzinfo=UTC), **extra)

    assert event(domain_sizes={BLOCK: 16}).domain_sizes == {BLOCK: 16}
    assert "domain_sizes" not in event().to_json()  # a worker not yet upgraded reads it
    for bad in ({"leaf-switch": 4}, {BLOCK: 0}, {BLOCK: -3}):
        with pytest.raises(ValidationError, match="a size is 1-100000 nodes"):
            event(domain_sizes=bad)


# ------------------------------------------------------------- K trays of NVLink faults: a domain fault

NVL_NOW = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)
RACKS = {"b1": [f"gpu-{i:03d}" for i in range(1, 19)], "b2": [f"gpu-{i:03d}" for i in range(19, 37)]}


def ago(seconds: float) -> datetime:
    return NVL_NOW - timedelta(seconds=seconds)


def test_one_trays_nvlink_fault_stays_its_own() -> None:
    assert domain_faults({"gpu-001": ago(5)}, RACKS, k=2, window_s=600, now=NVL_NOW) == []


def test_k_trays_of_one_domain_within_the_window_are_the_domains() -> None:
    failed = {"gpu-001": ago(500), "gpu-007": ago(10), "gpu-019": ago(10)}  # gpu-019 is in the other rack
    assert domain_faults(failed, RACKS, k=2, window_s=600, now=NVL_NOW) == [
        DomainFault("b1", ("gpu-001", "gpu-007"), 18)]
    assert domain_faults(failed, RACKS, k=3, window_s=600, now=NVL_NOW) == []


def test_k_trays_spread_over_two_domains_are_none() -> None:
    failed = {"gpu-001": ago(5), "gpu-019": ago(5)}
    assert domain_faults(failed, RACKS, k=2, window_s=600, now=NVL_NOW) == []


@pytest.mark.parametrize(("first_s", "counted"), [(599.999, True), (600, False), (0, True), (-1, False)],
                         ids=["just-inside", "on-the-edge", "now", "in-the-future"])
def test_the_window_is_open_at_its_start_and_closed_at_now(first_s: float, counted: bool) -> None:
    failed = {"gpu-001": ago(first_s), "gpu-002": ago(1)}
    found = domain_faults(failed, RACKS, k=2, window_s=600, now=NVL_NOW)
    assert found == ([DomainFault("b1", ("gpu-001", "gpu-002"), 18)] if counted else [])


def test_every_domain_that_crosses_is_named_and_trays_outside_any_domain_do_not_count() -> None:
    failed = {"gpu-001": ago(1), "gpu-002": ago(1), "gpu-020": ago(1), "gpu-021": ago(2), "lonely": ago(1)}
    found = domain_faults(failed, RACKS, k=2, window_s=600, now=NVL_NOW)
    assert [(d.name, d.trays) for d in found] == [("b1", ("gpu-001", "gpu-002")), ("b2", ("gpu-020", "gpu-021"))]


def test_k_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="two trays"):
        domain_faults({"gpu-001": ago(1)}, RACKS, k=1, window_s=600, now=NVL_NOW)


def test_the_settings_default_to_two_trays_in_ten_minutes_and_refuse_one() -> None:
    incidents = load_settings().incidents
    assert (incidents.nvlink_domain_min_trays, incidents.nvlink_domain_window_s) == (2, 600.0)
    with pytest.raises(SettingsError, match="nvlink_domain_min_trays"):
        load_settings(incidents={"nvlink_domain_min_trays": 1})
