"""Failure domains and the rule that turns simultaneous failures in one domain into one incident.

Domains (``kind -> name`` per node) come from Slurm's topology (``scontrol show topology``,
topology.conf or topology.yaml) and from Node labels (``incidents.label_keys``). :func:`correlate`
returns the domains whose unclaimed failures within the window reach ``min_nodes`` or ``min_fraction``
(and at least two), each node claimed by one incident at most; :func:`domain_faults` the NVLink
domains where K trays' NVLink faults within a window are the domain's. Pure: the ingest and the
rehearsal share it.

Why: docs/policy.md#failure-domains-where-they-come-from-and-which-wins
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import yaml

from remediation.hostlist import HostlistError, expand

LEAF_SWITCH = "leaf-switch"
SWITCH = "switch"
BLOCK = "block"

# What on-call should suspect first when a domain of this kind fails at once.
_CAUSES = {
    LEAF_SWITCH: "leaf switch",
    SWITCH: "switch (spine or aggregation)",
    BLOCK: "network block",
    "topology.kubernetes.io/zone": "zone",
    "failure-domain.beta.kubernetes.io/zone": "zone",
    "cloud.google.com/gce-topology-block": "reserved block's network",
    "cloud.google.com/gce-topology-subblock": "sub-block (rack; the NVLink domain on A4X)",
    "nvidia.com/gpu.clique": "NVLink domain",
}


class TopologyError(ValueError):
    """A topology (``scontrol show topology``, topology.conf or topology.yaml) that cannot be read; the
    message names the line or entry."""


@dataclass(frozen=True)
class Switch:
    """One switch or block of Slurm's topology, as ``scontrol show topology`` prints it."""

    kind: str  # leaf-switch, switch or block
    name: str
    nodes: tuple[str, ...]
    level: int = 0
    # A block's: the smallest block size Slurm plans with (the first of BlockSizes, else the node count
    # of the smallest block); None for a switch, or where Slurm does not say.
    block_size: int | None = None


_PAIR = re.compile(r"(\w+)=(\S*)")


def parse_topology(text: str) -> list[Switch]:
    """Parse ``scontrol show topology`` (every Slurm release since 22.05; tree and block plugins). An
    ``AggregatedBlock`` line (blocks that BlockSizes joins for planning) is no domain of its own."""
    out: list[Switch] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#") or "No topology information" in line:
            continue
        fields = dict(_PAIR.findall(line))
        leftover = _PAIR.sub("", line).strip()
        if leftover or not fields:
            raise TopologyError(f"scontrol show topology line {number}: cannot read {line[:200]!r}")
        try:
            nodes = tuple(expand(fields["Nodes"])) if fields.get("Nodes") else ()
        except HostlistError as exc:
            raise TopologyError(f"scontrol show topology line {number}: Nodes: {exc}") from None
        if "SwitchName" in fields:
            level = fields.get("Level", "0")
            if not level.isdigit():
                raise TopologyError(f"scontrol show topology line {number}: Level={level!r} is not a number")
            kind = LEAF_SWITCH if int(level) == 0 else SWITCH
            out.append(Switch(kind, fields["SwitchName"], nodes, int(level)))
        elif "BlockName" in fields:
            size = fields.get("BlockSize")
            if size is not None and not size.isdigit():
                raise TopologyError(f"scontrol show topology line {number}: BlockSize={size!r} is not a number")
            out.append(Switch(BLOCK, fields["BlockName"], nodes, block_size=int(size) if size else None))
        elif "AggregatedBlock" not in fields:
            raise TopologyError(f"scontrol show topology line {number}: no SwitchName or BlockName in {line[:200]!r}")
    return out


def parse_topology_conf(text: str, source: str = "topology.conf") -> list[Switch]:
    """Parse a topology/tree ``topology.conf`` (or a topology/block one) into the records ``scontrol show
    topology`` would print for it: a switch that names ``Nodes`` is a leaf (level 0); one that names
    ``Switches`` is one level above the highest of them and holds all their nodes. Keys are read as
    Slurm reads them (any case), ``#`` starts a comment and a trailing ``\\`` continues a line. A switch
    named twice, a ``Switches`` naming no defined switch, or a loop of switches is refused."""
    children: dict[str, tuple[str, ...]] = {}
    nodes: dict[str, tuple[str, ...]] = {}
    blocks: list[tuple[str, tuple[str, ...]]] = []
    sizes: tuple[int, ...] = ()
    for number, line in _logical_lines(text):
        fields = {k.lower(): v for k, v in _PAIR.findall(line)}
        if _PAIR.sub("", line).strip() or not fields:
            raise TopologyError(f"{source} line {number}: cannot read {line[:200]!r}")
        try:
            members = tuple(expand(fields["nodes"])) if fields.get("nodes") else ()
            if "blockname" in fields:
                blocks.append((fields["blockname"], members))
                continue
            if "switchname" not in fields:
                if "blocksizes" in fields:
                    sizes = _block_sizes(fields["blocksizes"].split(","), f"{source} line {number}: BlockSizes")
                    continue
                raise TopologyError(f"{source} line {number}: no SwitchName or BlockName in {line[:200]!r}")
            name = fields["switchname"]
            if name in nodes:
                raise TopologyError(f"{source} line {number}: switch {name!r} is defined twice")
            nodes[name] = members
            children[name] = tuple(expand(fields["switches"])) if fields.get("switches") else ()
        except HostlistError as exc:
            raise TopologyError(f"{source} line {number}: {exc}") from None
    return _tree(nodes, children, source) + _blocks(blocks, sizes)


def parse_topology_yaml(text: str, source: str = "topology.yaml") -> list[Switch]:
    """Parse a ``topology.yaml`` (Slurm 25.05 and later) into the records ``scontrol show topology``
    prints for it: those of the cluster's default topology (the first with ``cluster_default: true``,
    else the first), a ``block`` one's blocks or a ``tree`` one's switches; a flat, ring or torus3d
    topology has none. A file that is no list of topologies, or a unit with no name, is refused."""
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise TopologyError(f"{source}{where}: not YAML: {getattr(exc, 'problem', None) or exc}") from None
    if loaded is None:
        return []
    if not isinstance(loaded, list) or not all(isinstance(t, dict) and "topology" in t for t in loaded):
        raise TopologyError(f"{source}: not a list of topologies (each a mapping that starts with 'topology:')")
    if not loaded:
        return []
    chosen = next((t for t in loaded if t.get("cluster_default") is True), loaded[0])
    where = f"{source}: topology {chosen['topology']!r}"
    if "block" in chosen:
        return _yaml_blocks(chosen["block"], where)
    if "tree" in chosen:
        return _yaml_tree(chosen["tree"], where)
    if any(kind in chosen for kind in ("flat", "ring", "torus3d")):
        return []
    raise TopologyError(f"{where} has none of block, tree, flat, ring or torus3d")


def _yaml_blocks(block: object, where: str) -> list[Switch]:
    if not isinstance(block, dict) or not isinstance(block.get("blocks"), list):
        raise TopologyError(f"{where}: block needs a list of blocks")
    raw_sizes = block.get("block_sizes", [])
    sizes = _block_sizes(raw_sizes if isinstance(raw_sizes, list) else [raw_sizes], f"{where}: block_sizes")
    named: dict[str, tuple[str, ...]] = {}
    for index, entry in enumerate(block["blocks"], 1):
        name = entry.get("block") if isinstance(entry, dict) else None
        if not name:
            raise TopologyError(f"{where}: block #{index} has no name (block:)")
        if str(name) in named:
            raise TopologyError(f"{where}: block {str(name)!r} is defined twice")
        named[str(name)] = _yaml_hostlist(entry.get("nodes"), f"{where}: block {str(name)!r}: nodes")
    return _blocks(list(named.items()), sizes)


def _yaml_tree(tree: object, where: str) -> list[Switch]:
    if not isinstance(tree, dict) or not isinstance(tree.get("switches"), list):
        raise TopologyError(f"{where}: tree needs a list of switches")
    nodes: dict[str, tuple[str, ...]] = {}
    children: dict[str, tuple[str, ...]] = {}
    for index, entry in enumerate(tree["switches"], 1):
        name = entry.get("switch") if isinstance(entry, dict) else None
        if not name:
            raise TopologyError(f"{where}: switch #{index} has no name (switch:)")
        name = str(name)
        if name in nodes:
            raise TopologyError(f"{where}: switch {name!r} is defined twice")
        nodes[name] = _yaml_hostlist(entry.get("nodes"), f"{where}: switch {name!r}: nodes")
        children[name] = _yaml_hostlist(entry.get("children"), f"{where}: switch {name!r}: children")
    return _tree(nodes, children, where)


def _yaml_hostlist(value: object, where: str) -> tuple[str, ...]:
    """A hostlist string (``gpu-[001-018]``) or a list of them; nothing when absent."""
    if value is None:
        return ()
    parts = value if isinstance(value, list) else [value]
    if not parts or not all(isinstance(part, str) for part in parts):
        raise TopologyError(f"{where}: {value!r} is not a hostlist")
    try:
        return tuple(name for part in parts for name in expand(str(part)))
    except HostlistError as exc:
        raise TopologyError(f"{where}: {exc}") from None


def _block_sizes(values: list[object], where: str) -> tuple[int, ...]:
    sizes = []
    for value in values:
        text = str(value).strip()
        if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
            raise TopologyError(f"{where}: {value!r} is not a positive number of nodes")
        sizes.append(int(text))
    return tuple(sizes)


def _blocks(named: list[tuple[str, tuple[str, ...]]], sizes: tuple[int, ...]) -> list[Switch]:
    """Block records, each with the smallest block size: BlockSizes' smallest, else (as Slurm plans it)
    the node count of the smallest block."""
    smallest = min(sizes) if sizes else min((len(nodes) for _, nodes in named), default=0)
    return [Switch(BLOCK, name, nodes, block_size=smallest or None) for name, nodes in named]


def _tree(nodes: dict[str, tuple[str, ...]], children: dict[str, tuple[str, ...]], source: str) -> list[Switch]:
    """Switch records from each switch's own nodes and child switches: a leaf is level 0, a switch above
    is one level above its highest child and holds all the nodes under it."""
    levels: dict[str, int] = {}

    def level(name: str, path: tuple[str, ...]) -> int:
        if name in path:
            raise TopologyError(f"{source}: switches loop through {' -> '.join((*path, name))}")
        if name not in nodes:
            raise TopologyError(f"{source}: switch {path[-1]!r} names undefined switch {name!r}")
        if name not in levels:
            below = [level(child, (*path, name)) for child in children[name]]
            levels[name] = 1 + max(below) if below else 0
        return levels[name]

    def under(name: str) -> set[str]:
        return set(nodes[name]).union(*(under(child) for child in children[name]))

    switches = []
    for name in nodes:
        depth = level(name, ())
        members = tuple(sorted(under(name))) if children[name] else nodes[name]
        switches.append(Switch(LEAF_SWITCH if depth == 0 else SWITCH, name, members, depth))
    return switches


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """A ``topology.conf``'s lines without comments, continued lines joined, blank ones dropped; each
    with the number of the line it starts on."""
    lines: list[tuple[int, str]] = []
    pending, first = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            first = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = (pending + line).strip(), ""
        if line:
            lines.append((first, line))
    return lines


def slurm_domains(switches: Collection[Switch]) -> dict[str, dict[str, str]]:
    """node -> {kind: name}. A node under two switches of one kind (a leaf and a spine are two kinds)
    keeps the one of lower level, the one closer to it."""
    out: dict[str, dict[str, str]] = {}
    for sw in sorted(switches, key=lambda s: -s.level):
        for node in sw.nodes:
            out.setdefault(node, {})[sw.kind] = sw.name
    return out


def slurm_domain_sizes(switches: Collection[Switch]) -> dict[str, dict[str, int]]:
    """node -> {kind: smallest block size} for the blocks Slurm gave a size (nodes in none: absent)."""
    out: dict[str, dict[str, int]] = {}
    for sw in switches:
        if sw.block_size:
            for node in sw.nodes:
                out.setdefault(node, {})[sw.kind] = sw.block_size
    return out


def label_domains(labels: Mapping[str, str], keys: Collection[str]) -> dict[str, str]:
    """The configured label keys a Node carries, with a non-empty value: kind -> name."""
    return {k: str(labels[k]) for k in keys if labels.get(k)}


def domain_key(kind: str, name: str) -> str:
    return f"{kind}={name}"


def likely_cause(kind: str) -> str:
    return _CAUSES.get(kind, f"shared {kind}")


@dataclass(frozen=True)
class Rule:
    min_nodes: int
    min_fraction: float
    window_s: float
    min_nodes_by_kind: Mapping[str, int] = field(default_factory=dict)  # K per domain kind (a zone's is larger)

    def k(self, kind: str) -> int:
        return self.min_nodes_by_kind.get(kind, self.min_nodes)


@dataclass(frozen=True)
class Correlated:
    """A domain whose failures are one incident, and the nodes it claims."""

    kind: str
    name: str
    nodes: tuple[str, ...]
    size: int

    @property
    def key(self) -> str:
        return domain_key(self.kind, self.name)

    @property
    def cause(self) -> str:
        return likely_cause(self.kind)


def qualifies(failed: int, size: int, rule: Rule, *, kind: str = "") -> bool:
    """K nodes (K of this kind of domain), or a fraction F of the domain, and never fewer than two."""
    if failed < 2 or size <= 0:
        return False
    return failed >= rule.k(kind) or failed / size >= rule.min_fraction


def correlate(
    failed_at: Mapping[str, datetime],
    members: Mapping[tuple[str, str], Collection[str]],
    claimed: Collection[str],
    *,
    now: datetime,
    rule: Rule,
) -> list[Correlated]:
    """The domains (``(kind, name) -> member nodes``) that fail as one, given when each failing node
    failed; nodes in ``claimed`` (already in an incident) are not counted again."""
    start = now - timedelta(seconds=rule.window_s)
    recent = {n for n, at in failed_at.items() if start < at <= now}
    taken = set(claimed)
    ranked = sorted(
        ((kind, name, frozenset(nodes)) for (kind, name), nodes in members.items() if nodes),
        key=lambda d: (-len(recent & d[2]) / len(d[2]), -len(d[2]), d[0], d[1]),
    )
    out: list[Correlated] = []
    for kind, name, nodes in ranked:
        failing = sorted((recent & nodes) - taken)
        if qualifies(len(failing), len(nodes), rule, kind=kind):
            out.append(Correlated(kind, name, tuple(failing), len(nodes)))
            taken.update(failing)
    return out


@dataclass(frozen=True)
class DomainFault:
    """An NVLink domain whose trays' NVLink faults, together, are the domain's fault."""

    name: str
    trays: tuple[str, ...]  # the trays whose NVLink faults count, sorted
    size: int  # the domain's trays


def domain_faults(
    failed_at: Mapping[str, datetime],
    domains: Mapping[str, Collection[str]],
    *,
    k: int,
    window_s: float,
    now: datetime,
) -> list[DomainFault]:
    """The NVLink domains (name -> trays) in which at least ``k`` trays had an NVLink fault (``failed_at``:
    tray -> when) within ``window_s`` before ``now``; each tray's fault alone stays its own. Sorted by name.

    Why: docs/policy.md#domain-faults-what-one-tray-cannot-be-blamed-for"""
    if k < 2:
        raise ValueError(f"k={k}: one tray's NVLink fault is its own, a domain fault needs two trays at least")
    start = now - timedelta(seconds=window_s)
    recent = {n for n, at in failed_at.items() if start < at <= now}
    out = []
    for name, trays in sorted(domains.items()):
        failing = sorted(recent.intersection(trays))
        if len(failing) >= k:
            out.append(DomainFault(name, tuple(failing), len(set(trays))))
    return out
