"""Each step's record dumps to the keys its row always had and loads back any row, old or odd."""

from __future__ import annotations

import ast
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from remediation.domain.statemachine import Step
from remediation.domain.states import ValidationOutcome
from remediation.domain.step_records import (
    RECORDS,
    DrainDetail,
    EvictDetail,
    GpuCheckDetail,
    Identity,
    JobRecord,
    MachineDetail,
    QuarantineDetail,
    StepDetail,
    VerifyDetail,
    dumped,
    load_detail,
)
from remediation.ports.cluster import HardwareIdentity, VMAction

T = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
DOMAIN = Path(__file__).resolve().parents[3] / "remediation" / "domain"
JOB = JobRecord(started_at=T, finished_at=T + timedelta(seconds=90), outcome=ValidationOutcome.PASSED, backend="slurm",
                name="nr-gate-r7-a2", node="gpu-node-1", cause_class="gpu-memory", command=("dcgmi", "diag", "-r", "2"),
                exit_code=0, state="COMPLETED", duration_s=90.0, output="Memory | Pass\n")
HW = HardwareIdentity("gce", instance_id="123", host="host-9", sku="a3-highgpu-8g")

FULL = [
    DrainDetail(jobs=("12345", "12346"), acted=("12345",), timeout_paged=True),
    EvictDetail(jobs=(), remaining=3, blocked=("default/trainer-0",)),
    MachineDetail(jobs=("7",), slurmd_read=True, slurmd_start_before=T, identity=Identity(HW),
                  after_action=VMAction.STOP_START),
    MachineDetail(slurmd_read=True, identity=Identity(error="instance gone"), gpu_reset=JOB, undone="reservation deleted"),
    VerifyDetail(boot_id="b00t"),
    GpuCheckDetail(validation=JOB, undone="reservation deleted; drain put back"),
    QuarantineDetail(Identity(HW)),
    StepDetail(),
]


@pytest.mark.parametrize("record", FULL, ids=lambda r: type(r).__name__)
def test_every_record_round_trips_through_json(record: StepDetail) -> None:
    stored = json.loads(json.dumps(record.dump()))
    assert type(record).load(stored) == record


@pytest.mark.parametrize("record", FULL, ids=lambda r: type(r).__name__)
def test_an_empty_record_writes_nothing_over_the_row(record: StepDetail) -> None:
    empty = type(record)()
    assert empty.dump() == {} and type(record).load({}) == empty and type(record).load(None) == empty


def test_every_step_has_its_record() -> None:
    assert set(RECORDS) == set(Step) - {Step.DONE}
    assert load_detail("vm_restart", {"slurmd_start_before": ""}) == MachineDetail(slurmd_read=True)
    assert load_detail("a-step-of-a-later-release", {"jobs": ["1"]}) == StepDetail()
    assert dumped(None) == {}


OLD_ROWS = {
    "slurm_drain": {"nonce": "0123456789", "jobs": ["501", "502"], "job_count": 2, "jobs_acted": ["501"],
                    "jobs_timeout_paged": True, "streak": 0, "failing_since": None, "held_s": 12.5, "held_since": None},
    "k8s_evict": {"remaining": 2, "blocked": ["default/pod-0"], "retry_after": 5.0},
    "vm_restart": {"slurmd_start_before": "", "hardware": {"provider": "gce", "instance_id": "1", "host": None,
                   "bmc_uuid": None, "bmc_serial": None, "sku": "a3"}, "after_action": "restart",
                   "jobs": [], "job_count": 0},
    "verify": {"boot_id": "b00t", "streak": 1, "retry_at": T.isoformat()},
    "validate": {"nonce": "abcdef0123", "validation": JOB.dump(), "undone": "reservation deleted"},
    "quarantine": {"hardware_error": "instance gone"},
}


@pytest.mark.parametrize("step", list(OLD_ROWS), ids=list(OLD_ROWS))
def test_an_old_row_reads_and_writes_back_the_same_keys_and_shapes(step: str) -> None:
    """What the engine merges back is what the row already held: readers of the column see no change,
    and the engine's own keys (nonce, streak, held time) are left to the row."""
    old = OLD_ROWS[step]
    record = load_detail(step, old)
    assert record != type(record)()  # something was read
    assert {**old, **record.dump()} == old


def test_a_row_written_by_hand_reads_as_not_recorded_where_it_is_malformed() -> None:
    junk = {"jobs": "501", "jobs_acted": 7, "jobs_timeout_paged": "yes", "remaining": "two", "blocked": None,
            "slurmd_start_before": 5, "hardware": "gce", "hardware_error": ["x"], "after_action": "explode",
            "gpu_reset": {"exit_code": 0}, "undone": 3, "boot_id": 5, "validation": []}
    assert DrainDetail.load(junk) == DrainDetail()
    assert EvictDetail.load(junk) == EvictDetail()
    assert MachineDetail.load(junk) == MachineDetail()
    assert VerifyDetail.load(junk) == VerifyDetail()
    assert GpuCheckDetail.load(junk) == GpuCheckDetail()
    assert QuarantineDetail.load(junk) == QuarantineDetail()


def test_a_job_record_keeps_what_it_can_read() -> None:
    stored = {**JOB.dump(), "exit_code": "zero", "command": "dcgmi", "duration_s": None, "outcome": "passed"}
    assert JobRecord.load(stored) == JobRecord(T, T + timedelta(seconds=90), ValidationOutcome.PASSED, "slurm",
                                               "nr-gate-r7-a2", "gpu-node-1", "gpu-memory", (), None, "COMPLETED",
                                               0.0, "Memory | Pass\n")
    assert JobRecord.load({**JOB.dump(), "outcome": "exploded"}) is None
    assert JobRecord.load({**JOB.dump(), "started_at": "soon"}) is None


def test_slurmd_read_with_no_known_start_is_not_never_read() -> None:
    """"" is slurmd's start read and unknown: the machine step must not read it again after the
    action (it would then read a start the action caused)."""
    assert MachineDetail(slurmd_read=True).dump() == {"slurmd_start_before": ""}
    assert MachineDetail.load({"slurmd_start_before": ""}).slurmd_read
    assert not MachineDetail.load({"slurmd_start_before": None}).slurmd_read


def _detail_literals(source: str) -> list[int]:
    """Lines where ``detail=`` is given a dict (literal, comprehension or ``dict(...)``) outside an
    audit ``Note``, whose detail is the audit row's."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or (isinstance(node.func, ast.Name) and node.func.id == "Note"):
            continue
        for kw in node.keywords:
            value = kw.value
            is_dict = isinstance(value, ast.Dict | ast.DictComp) or (
                isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict")
            if kw.arg == "detail" and is_dict:
                found.append(node.lineno)
    return found


def test_no_step_body_builds_a_detail_dict() -> None:
    hits = {path.name: lines for path in sorted(DOMAIN.glob("*.py")) if (lines := _detail_literals(path.read_text()))}
    assert hits == {}


def test_the_check_finds_the_old_spelling() -> None:
    old = ('Done("x", detail={"boot_id": "b"})\nwait(w, "y", detail=dict(a=1))\n'
           'Wait("z", 1, detail={k: 1 for k in "ab"})\nNote(a, b, detail={})\nDone("ok", detail=VerifyDetail("b"))\n')
    assert _detail_literals(old) == [1, 2, 3]
