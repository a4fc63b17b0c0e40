"""A node's NVLink domain from Slurm's block, the Node's clique label and its GPUs, and how they disagree."""

from __future__ import annotations

from remediation.domain.nvlink import Membership, disagreements, gpu_clique

RACK_A, RACK_B = "c0ffee00-0000-4000-8000-000000000001.0", "c0ffee00-0000-4000-8000-000000000001.1"


def rack(block: str, clique: str, nodes: range) -> dict[str, Membership]:
    return {f"gpu-node-{i}": Membership(block, clique, clique) for i in nodes}


def test_sources_that_agree_say_nothing() -> None:
    members = {**rack("b1", RACK_A, range(4)), **rack("b2", RACK_B, range(4, 8))}
    assert all(disagreements(n, members) == [] for n in members)
    assert disagreements("gpu-node-9", members) == []  # a node no source names
    assert disagreements("gpu-node-0", {"gpu-node-0": Membership("b1")}) == []  # Slurm alone


def test_a_tray_recabled_into_another_rack_is_named_from_both_sides() -> None:
    """gpu-node-3's GPUs registered in rack B's domain; Slurm still has it in block b1."""
    members = {**rack("b1", RACK_A, range(3)), "gpu-node-3": Membership("b1", RACK_B, RACK_B),
               **rack("b2", RACK_B, range(4, 8))}
    assert disagreements("gpu-node-3", members) == [
        "Slurm block b1 holds it and gpu-node-[0-2], whose GPUs are in another NVLink domain; "
        "Slurm actions follow the block",
        f"its NVLink domain {RACK_B} also holds gpu-node-[4-7], which Slurm puts in another block; "
        "Slurm actions follow the block",
    ]
    assert disagreements("gpu-node-0", members) == [
        "Slurm block b1 holds it and gpu-node-3, whose GPUs are in another NVLink domain; "
        "Slurm actions follow the block"]


def test_a_stale_label_disagrees_with_the_gpus_and_the_gpus_win() -> None:
    members = {**rack("b1", RACK_A, range(3)), "gpu-node-3": Membership("b1", RACK_B, RACK_A)}
    assert disagreements("gpu-node-3", members) == [f"its Node's label names clique {RACK_B}, its GPUs clique {RACK_A}"]
    assert Membership("b1", RACK_B, None).clique == RACK_B  # no GPU check yet: the label stands in


def test_one_trays_gpus_naming_two_domains_name_none() -> None:
    assert gpu_clique([RACK_A, None, RACK_A]) == (RACK_A, None)
    assert gpu_clique([None]) == (None, None)
    assert gpu_clique([RACK_A, RACK_B]) == (None, f"its GPUs name 2 NVLink domains ({RACK_A}, {RACK_B})")
