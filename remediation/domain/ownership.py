"""Giving back what is ours, and only that.

We resume a Slurm node only while its reason still carries our prefix, and uncordon and untaint only
what we marked as ours: a human's drain or cordon, placed before us or meanwhile, is left alone. One
place for every undo: a remediation that stops (cancelled, or the fault cleared), a human's release and
``return``'s resume.

Why: docs/architecture.md#ownership
"""

from __future__ import annotations

from enum import StrEnum

from remediation.domain.outcomes import Adapters
from remediation.domain.slurm_states import SlurmState
from remediation.ports.cluster import SlurmControl
from remediation.ports.errors import NotFound, UnknownNode


class Resumed(StrEnum):
    """What :func:`resume` found and did."""

    RESUMED = "resumed"  # our drain, given back
    NOT_OURS = "not_ours"  # someone else's drain (or DOWN, FAIL): left for its owner
    IN_SERVICE = "in_service"  # nothing held it


def resume(slurm: SlurmControl, name: str, prefix: str) -> tuple[Resumed, str]:
    """Resume the node only while its reason is ours; what it did, and that in words."""
    node = slurm.get_node(name)
    if not node.reason_is_ours(prefix):
        if node.flags & {SlurmState.DRAIN, SlurmState.FAIL} or node.state == SlurmState.DOWN:
            return Resumed.NOT_OURS, f"Slurm reason is not ours ({node.reason!r}); left for its owner"
        return Resumed.IN_SERVICE, "already in service"
    slurm.resume(name)
    return Resumed.RESUMED, "resumed in Slurm"


def resume_if_ours(slurm: SlurmControl, name: str, prefix: str) -> str:
    return resume(slurm, name, prefix)[1]


def give_back(ad: Adapters, node: str, prefix: str) -> str:
    """Undo what is ours on a node we stop remediating: resume our drain (only while the reason is
    still ours), remove our cordon and our taint. A human's drain or cordon is left alone."""
    return release_node(ad, node, prefix)


def release_node(ad: Adapters, node: str, prefix: str) -> str:
    """Carry out a human release: remove our taint and our cordon, resume the node in Slurm if the
    drain is ours (a human's own drain placed meanwhile is left alone)."""
    notes = []
    try:
        if ad.kube is None:
            notes.append("no Kubernetes")
        else:
            k8s_name = ad.kube.node_for(node)
            ad.kube.set_quarantine_taint(k8s_name, False)
            notes.append("uncordoned" if ad.kube.uncordon(k8s_name) else "cordon not ours, left as is")
    except (UnknownNode, NotFound) as exc:
        notes.append(f"no Kubernetes Node ({exc.message})")
    notes.append(resume_if_ours(ad.slurm, node, prefix))
    return "; ".join(notes)
