"""The glossary (docs/architecture.md) is what the code says: every file it points at exists, and the
words it retired are gone from the code's names (names outside the process that it keeps on purpose are
listed there and allowed here), and a word that is right in one part of the code only is found nowhere
else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from remediation.domain.slurm_states import SlurmState

ROOT = Path(__file__).resolve().parents[3]
GLOSSARY = (ROOT / "docs" / "architecture.md").read_text().split("## Glossary", 1)[1].split("\n## ", 1)[0]
CODE = [p for d in ("remediation", "watchers", "workers", "simulator") for p in (ROOT / d).rglob("*.py")]

#: Retired word -> the pattern that finds it in code. Each meant two or more things.
RETIRED = {
    "gate (admission or validation)": r"\b(Gate|HealthGate|GateCheck|GateResult|[A-Za-z]+Gate|gate_[a-z]+|gate|gat(ed|ing))\b",
    "SLURM_BAD / BAD_SLURM (one set, two names)": r"\b(SLURM_BAD|BAD_SLURM|DRAIN_STATES)\b",
    "lever_service beside levers": r"\blever_service\b",
    "cli.ops / cli.gate (the console script and validate lived elsewhere)": r"remediation\.cli\.(ops|gate)\b",
    "VM for the machine port (a machine is not always a cloud's VM)": r"\b(VMProvider|VMSettings|NoopVM|vm_backend)\b",
    "VM for a machine action (a GPU reset is none: the ladder's rungs are action_rungs)": (
        r"\b(vm_rungs|VM_STEPS|vm_action_at|vm_op_ref|without_vm_action|to_vm_action|vm_active|"
        r"last_vm_action_at|new_vm_action|LAST_VM_ACTION|LastVMAction|vm_action|new_vm|ADMISSION_NEW_VM)\b"
    ),
    "DryRun for a twin (the dry-run twins are Noop*)": r"\b[A-Za-z]+DryRun\b|redfish\.dryrun",
    "drain for reading the stream (drain is Slurm's; the ingest consumes)": (
        r"\b(memstream|stream)\.drain\b|stream import (.*, )?drain\b|the ingest task drains|drain the event stream"
    ),
}
#: What keeps an old word on purpose (docs/architecture.md, after the table).
KEPT = re.compile(
    r'nr-gate|node-remediation/gate|/var/lib/node-remediation/gate|gate: dict|gate=checked|"gated"'
    r'|RENAMED = \{"vm_action_at": "machine_action_at", "vm_op_ref": "machine_op_ref"\}'
)
#: A word that is right in one part of the code and means something else everywhere else -> its
#: pattern (any case) and the directories where it is the right word.
SCOPED = {
    "park (a hold holds; the rehearsal's loop parks what admission refused)": (
        r"\bpark(s|ed|ing)?\b",
        ("remediation/rehearsal/",),
    ),
    "simulation (the rehearsal is not one; the simulator is)": (r"\bsimulations?\b", ("simulator/",)),
}


def _files_named() -> list[str]:
    named = set()
    for cell in re.findall(r"`([^`]+)`", GLOSSARY):
        for path in re.split(r"[ ,]+", cell):
            path = re.sub(r"\(.*", "", path)
            if path.endswith(".py") or path.endswith("/"):
                named.add(path)
    return sorted(named)


@pytest.mark.parametrize("path", _files_named())
def test_every_file_the_glossary_names_exists(path: str) -> None:
    candidates = [ROOT / path, ROOT / "remediation" / path]
    assert any(c.exists() for c in candidates), f"the glossary names {path}, which does not exist"


@pytest.mark.parametrize("word", RETIRED, ids=list(RETIRED))
def test_a_retired_word_is_gone_from_the_code(word: str) -> None:
    pattern = re.compile(RETIRED[word])
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in CODE for n, line in enumerate(p.read_text().splitlines(), 1)
             if pattern.search(line) and not KEPT.search(line)]  # fmt: skip
    assert not found, "\n".join(found[:20])


@pytest.mark.parametrize("word", SCOPED, ids=list(SCOPED))
def test_a_scoped_word_stays_where_it_means_one_thing(word: str) -> None:
    pattern, home = re.compile(SCOPED[word][0], re.IGNORECASE), SCOPED[word][1]
    found = [f"{rel}:{n}: {line.strip()}"
             for p in CODE if not (rel := str(p.relative_to(ROOT))).startswith(home)
             for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]  # fmt: skip
    assert not found, "\n".join(found[:20])


def test_the_decisions_name_slurm_states_through_the_vocabulary() -> None:
    """The glossary's "Slurm state": the domain, the services and the processes name a state the
    decisions depend on as a ``SlurmState`` member, never as a quoted copy of its text."""
    names = "|".join(s.value for s in SlurmState)
    quoted = re.compile(rf"""["']({names})["']""")
    trees = [ROOT / "remediation" / "domain", ROOT / "remediation" / "services", ROOT / "watchers", ROOT / "workers"]
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for tree in trees for p in tree.rglob("*.py") if p.name != "slurm_states.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if quoted.search(line)]  # fmt: skip
    assert not found, "\n".join(found[:20])
