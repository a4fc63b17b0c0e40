"""A node's NVLink domain as each source names it, and where the sources disagree.

Three sources name a tray's domain: Slurm's block (what Slurm actions follow), the Node's
``nvidia.com/gpu.clique`` label and the GPUs' own clique from a GPU check's ``nvidia-smi -q``
(:func:`remediation.domain.hardware.parse_gpus`). A tray re-cabled into another rack makes them
disagree: :func:`disagreements` says how. :class:`BlockHealth` says when a block's healthy nodes are
fewer than its smallest block. Pure.

Why: docs/policy.md#the-nvlink-domain-where-it-comes-from
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from remediation.hostlist import compress

#: The Node label GPU Feature Discovery sets to the NVLink clique.
CLIQUE_LABEL = "nvidia.com/gpu.clique"


@dataclass(frozen=True)
class Membership:
    """Where the sources put one node: Slurm's block, the Node's label, the GPUs' own clique."""

    block: str | None = None
    label: str | None = None
    gpus: str | None = None

    @property
    def clique(self) -> str | None:
        """The clique the hardware is in: what its GPUs said, else what its Node's label says."""
        return self.gpus or self.label


def gpu_clique(cliques: Iterable[str | None]) -> tuple[str | None, str | None]:
    """The one clique a check's GPUs named, and None; or None and why not (GPUs of one tray that
    name different cliques are a fabric fault, not a domain)."""
    named = sorted({c for c in cliques if c})
    if len(named) > 1:
        return None, f"its GPUs name {len(named)} NVLink domains ({', '.join(named)})"
    return (named[0] if named else None), None


def disagreements(node: str, members: Mapping[str, Membership]) -> list[str]:
    """How the sources disagree about ``node``'s domain, in words on-call can check; ``members`` holds
    ``node`` and the nodes to compare it with (its block's and its clique's)."""
    me = members.get(node, Membership())
    out = []
    if me.label and me.gpus and me.label != me.gpus:
        out.append(f"its Node's label names clique {me.label}, its GPUs clique {me.gpus}")
    if me.block and me.clique:
        other = sorted(n for n, m in members.items() if n != node and m.block == me.block
                       and m.clique and m.clique != me.clique)
        if other:
            out.append(f"Slurm block {me.block} holds it and {compress(other)}, whose GPUs are in another "
                       f"NVLink domain; Slurm actions follow the block")
        elsewhere = sorted(n for n, m in members.items() if n != node and m.clique == me.clique
                           and m.block and m.block != me.block)
        if elsewhere:
            out.append(f"its NVLink domain {me.clique} also holds {compress(elsewhere)}, which Slurm puts in "
                       f"another block; Slurm actions follow the block")
    return out


@dataclass(frozen=True)
class BlockHealth:
    """One topology/block block: its nodes, how many are healthy, and its smallest block size."""

    cluster: str
    name: str
    size: int  # the smallest block Slurm plans with (BlockSizes)
    nodes: int
    healthy: int

    @property
    def partial(self) -> bool:
        """Fewer healthy nodes than the smallest block: no job of the block's size fits here now."""
        return self.healthy < self.size

    def text(self) -> str:
        said = f"{self.healthy} of block {self.name}'s {self.nodes} nodes healthy"
        if self.partial:
            return f"{said}, fewer than its smallest block ({self.size}): a partial domain; the rest still serve " \
                "smaller jobs"
        return f"{said}; its smallest block is {self.size}"
