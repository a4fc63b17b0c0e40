"""The demo's closing table fits the terminal it is printed on (node names and outcomes always whole),
and names what each machine step did: a VM action, or a GPU reset, which is none."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from remediation.demo.report import machine_steps, remediations_table, vm_actions


def remediation(rid: int, node: str, status: str, incident: int | None = None, **over: Any) -> dict[str, Any]:
    return {
        "id": rid, "cluster": "east", "node": node, "status": status, "incident": incident, "fault_class": "gpu-memory",
        "action": "move-host", "machine_steps": ["GPU reset", "stop_start"], "cause": "slurm FAIL: xid 48 double-bit ECC error on GPU 3",
        "steps_done": ["slurm_drain", "kube_cordon", "evict", "vm_restart", "verify"], "recovery_s": 12.3,
    } | over  # fmt: skip


ROWS = [
    remediation(1, "gpu-node-7", "succeeded"),
    remediation(2, "gpu-node-9", "quarantined", recovery_s=None),
    remediation(3, "gpu-node-16", "succeeded", incident=1, fault_class="fabric", action="hold", machine_steps=[]),
    remediation(4, "gpu-node-22", "cancelled", recovery_s=None),
    remediation(5, "gpu-node-33", "succeeded", fault_class="host", action="restart", machine_steps=["restart"]),  # bare metal
    remediation(6, "gpu-node-7", "succeeded", cluster="west"),  # another cluster's node of the same name
]


def render(width: int) -> str:
    console = Console(width=width, file=io.StringIO(), color_system=None, record=True)
    console.print(remediations_table(ROWS, console))
    return console.export_text()


@pytest.mark.parametrize("width", [80, 100, 200], ids=["80-columns", "100-columns", "200-columns"])
def test_node_names_and_outcomes_appear_whole(width: int) -> None:
    text = render(width)
    assert "…" not in text
    for r in ROWS:
        assert r["node"] in text
        assert r["status"] in text
    assert "east" in text and "west" in text  # each row names its cluster
    assert "incident #1" in text
    assert max(len(line) for line in text.splitlines()) <= width


def test_a_wide_terminal_gets_a_column_per_fact() -> None:
    header = next(line for line in render(200).splitlines() if "node" in line)
    for col in ("cluster", "outcome", "class", "action", "machine steps", "cause", "steps done", "time to recover"):
        assert col in header


def test_a_narrow_terminal_gets_the_facts_stacked() -> None:
    text = render(80)
    assert "what happened" in text and "time to recover" not in text
    assert "gpu-memory -> move-host; machine steps:" in text
    assert "recovered in 12.3s" in text and "not recovered" in text


def step(sid: int, name: str, op: dict[str, Any] | None) -> SimpleNamespace:
    return SimpleNamespace(id=sid, step=name, provider_op=op)


RESET_OP = {"backend": "kubernetes", "name": "nr-reset-r3-a1", "node": "gpu-node-6", "timeout_s": 120}
MOVE_OP = {"provider": "gce", "ref": "op-1", "action": "stop_start", "vm": {"name": "gpu-node-6"}}


@pytest.mark.parametrize(
    ("steps", "did", "vm"),
    [
        ([step(4, "vm_restart", MOVE_OP), step(2, "vm_restart", RESET_OP)], ["GPU reset", "stop_start"], ["stop_start"]),
        ([step(1, "slurm_drain", None), step(2, "vm_restart", RESET_OP), step(3, "verify", None)], ["GPU reset"], []),
        ([step(1, "vm_restart", None)], [], []),  # started, nothing recorded yet
    ],
    ids=["reset-then-host-move", "reset-only", "nothing-recorded"],
)
def test_a_gpu_reset_is_named_and_is_no_vm_action(steps: list[SimpleNamespace], did: list[str], vm: list[str]) -> None:
    assert machine_steps(steps) == did  # type: ignore[arg-type]
    assert vm_actions(did) == vm


def test_the_table_names_the_gpu_reset() -> None:
    for width in (80, 200):
        text = render(width)
        assert "GPU reset, stop_start" in text and "?" not in text
