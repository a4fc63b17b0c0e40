"""The validate step's decisions, with a scripted validator at our own port: names, the check by cause,
pass / fail / timeout / no result / cannot run, idempotent start, dry-run, and the settings' checks."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.adapters.noop import NoopValidator
from remediation.domain.context import RemediationContext
from remediation.domain.outcomes import Adapters, Done, Escalate, Hold, StepInput, StepSettings, Wait
from remediation.domain.statemachine import Site, Step, check_transition, next_on_success
from remediation.domain.step_records import GpuCheckDetail
from remediation.ports.errors import ConfigError
from remediation.settings import SettingsError, load_settings
from remediation.validation.port import ValidationCheck, ValidationResult
from remediation.validation.rules import check_name, last_line, manual_check_name, tail, validate
from tests.scenario_table import NODE_NAME, BadInputs
from tests.scripted_validator import ScriptedValidator

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
STAMP = "20261123120000"


def cfg(**validation: Any) -> StepSettings:
    return StepSettings.of(load_settings(validation={"backend": "slurm", "poll_interval_s": 2, **validation}))


def inp(op: dict[str, Any] | None = None, cls: str | None = "gpu-memory", started: datetime = T0) -> StepInput:
    ctx = RemediationContext(cause_class=cls)
    return StepInput(remediation_id=7, node="gpu-node-3", cause="xid 48", ladder=0, context=ctx,
                     key="r7:validate:2", attempt=2, started_at=started, checks=0 if op is None else 1,
                     provider_op=op, detail={})


def adapters(validator: Any) -> Adapters:
    world = MemoryWorld(nodes=["gpu-node-3"])
    return Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world), validator)


def started_op(settings: StepSettings, validator: ScriptedValidator, cls: str | None = "gpu-memory") -> dict[str, Any]:
    out = validate(inp(cls=cls), adapters(validator), settings, now=T0)
    assert isinstance(out, Wait) and out.provider_op is not None
    return out.provider_op


def test_names_are_derived_from_the_key_and_valid_everywhere() -> None:
    assert check_name("r7:validate:2") == "nr-gate-r7-a2"
    assert check_name("r12:validate:10") == "nr-gate-r12-a10"
    # A key that is not a name already keeps its readable part and gains a hash of the whole key.
    upper = check_name("R12:validate:10")
    assert upper.startswith("nr-gate-r12-a10-") and upper != check_name("r12:validate:10")


LONG = "gpu-" + "a" * 60  # two node names that share their first 63 characters


def manual(node: str) -> str:
    return manual_check_name(node, STAMP)


@pytest.mark.parametrize(("name_of", "inputs"), [
    (manual, (LONG + "-node-1", LONG + "-node-2")),
    (manual, ("gpu.node-1", "gpu_node-1")),
    (check_name, ("r" + "1" * 70 + ":validate:1", "r" + "1" * 70 + ":validate:2")),
], ids=["long-node-names", "punctuation", "long-key"])
def test_names_are_unique_whatever_the_input(name_of: Any, inputs: tuple[str, str], bad_inputs: BadInputs) -> None:
    first, second = (name_of(text) for text in inputs)
    assert first != second
    for name in (first, second):
        assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", name), name
    if name_of is manual:  # a human's check on a node: its names come from the node's name
        tails = " and ".join(repr(text[-16:]) for text in inputs)
        bad_inputs.tried(NODE_NAME, f"check names for two nodes of {len(inputs[0])} characters ending {tails}",
                         f"{first} and {second}: distinct, valid everywhere", lost=None)


def test_a_cut_name_keeps_a_readable_prefix_and_names_that_fit_stay_as_they_were() -> None:
    # A check started before an upgrade is found again by the name it was given then.
    assert manual_check_name("gpu-node-3", STAMP) == f"nr-gate-gpu-node-3-{STAMP}"
    cut = manual_check_name(LONG + "-node-1", STAMP)
    assert cut.startswith("nr-gate-gpu-aaaa") and len(cut) == 63
    assert cut == manual_check_name(LONG + "-node-1", STAMP)  # the same input, the same name


def test_first_look_starts_the_check_the_cause_picks_and_records_it_before_waiting() -> None:
    settings, validator = cfg(), ScriptedValidator([])
    op = started_op(settings, validator)
    (_, check), = validator.calls
    assert check == ValidationCheck("gpu-node-3", "nr-gate-r7-a2", ("dcgmi", "diag", "-r", "3"), 1800.0, "gpu-memory")
    assert op["job_id"] == "42" and op["command"] == ["dcgmi", "diag", "-r", "3"] and op["timeout_s"] == 1800.0
    assert op["started_at"] == T0.isoformat()


@pytest.mark.parametrize(("cls", "argv"), [
    ("nvlink", ["all_reduce_perf", "-b", "8", "-e", "1G", "-f", "2", "-g", "8"]),
    ("gpu-transient", ["dcgmi", "diag", "-r", "2"]),
    (None, ["dcgmi", "diag", "-r", "2"]),  # unclassified: unknown
], ids=["nvlink-nccl", "gpu-dcgm-2", "unknown"])
def test_the_check_depends_on_the_cause_class(cls: str | None, argv: list[str]) -> None:
    validator = ScriptedValidator([])
    assert started_op(cfg(), validator, cls)["command"] == argv


def finish(settings: StepSettings, result: ValidationResult, at: datetime) -> tuple[Any, ScriptedValidator]:
    validator = ScriptedValidator([result])
    op = started_op(settings, ScriptedValidator([]))
    return validate(inp(op), adapters(validator), settings, now=at), validator


def test_pass_is_done_with_the_record_and_the_gate_taken_down() -> None:
    out, validator = finish(cfg(), ValidationResult(True, 0, "Memory | Pass\n"), T0 + timedelta(seconds=90))
    assert isinstance(out, Done) and "passed" in out.outcome
    rec = GpuCheckDetail.load(out.detail.dump()).validation
    assert rec is not None
    assert (rec.outcome, rec.exit_code, rec.duration_s, rec.cause_class) == ("passed", 0, 90.0, "gpu-memory")
    assert validator.calls[-1] == ("finish", "nr-gate-r7-a2")


def test_fail_escalates_with_the_output_and_keeps_only_its_end() -> None:
    noisy = "x" * 10_000 + "\nMemory | Fail: row remap failure GPU 3\n"
    out, _ = finish(cfg(output_bytes=512), ValidationResult(True, 226, noisy), T0 + timedelta(seconds=60))
    assert isinstance(out, Escalate) and "exit 226" in out.reason and "row remap failure" in out.reason
    assert len(out.detail.dump()["validation"]["output"].encode()) == 512


@pytest.mark.parametrize(("result", "kind"), [
    (ValidationResult(True, None, "", state="DeadlineExceeded", timed_out=True), "ValidationTimeout"),
    (ValidationResult(True, None, "", state="CANCELLED"), "ValidationNoResult"),
    (ValidationResult(True, 127, "sh: dcgmi: not found"), "ValidationCannotRun"),
], ids=["backend-deadline", "cancelled", "not-installed"])
def test_no_verdict_holds_the_node_for_a_human(result: ValidationResult, kind: str) -> None:
    out, validator = finish(cfg(), result, T0 + timedelta(seconds=5))
    assert isinstance(out, Hold) and out.kind == kind
    assert validator.calls[-1][0] == "finish"


def test_running_waits_then_our_own_deadline_holds_and_stops_it() -> None:
    settings = cfg(timeout_s={"default": 60})
    op = started_op(settings, ScriptedValidator([]), cls="nvlink")
    running = ValidationResult(False, state="PENDING", waiting="Reservation")
    out = validate(inp(op), adapters(ScriptedValidator([running])), settings, now=T0 + timedelta(seconds=60))
    assert isinstance(out, Wait) and "pending: Reservation" in out.reason and out.countdown == 2
    validator = ScriptedValidator([ValidationResult(False, state="RUNNING")])
    out = validate(inp(op), adapters(validator), settings, now=T0 + timedelta(seconds=91))
    assert isinstance(out, Hold) and out.kind == "ValidationTimeout" and validator.calls[-1][0] == "finish"


def test_dry_run_records_what_it_would_run_and_judges_nothing() -> None:
    settings, validator = cfg(), NoopValidator()
    out = validate(inp(), adapters(validator), settings, now=T0)
    assert isinstance(out, Wait) and out.provider_op is not None
    out = validate(inp(out.provider_op), adapters(validator), settings, now=T0 + timedelta(seconds=1))
    assert isinstance(out, Done) and out.outcome.startswith("would run the GPU check dcgmi diag -r 3")
    assert [a["would"] for a in validator.recorder.actions] == ["validate"]


def test_a_humans_drain_placed_meanwhile_is_not_resumed_for_the_check() -> None:
    validator = ScriptedValidator([])
    validator.backend = "slurm"
    ad = adapters(validator)
    ad.slurm.drain("gpu-node-3", "maintenance: HBM reseat")
    out = validate(inp(), ad, cfg(), now=T0)
    assert isinstance(out, Done) and "a human drained" in out.outcome and validator.calls == []


def test_without_a_gate_the_step_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError):
        validate(inp(), adapters(None), cfg(), now=T0)


def test_validate_sits_between_verify_and_return_and_is_skipped_without_a_gate() -> None:
    assert next_on_success(Step.VERIFY, Site(kubernetes=True, machine=True, validation=True)) is Step.VALIDATE
    assert next_on_success(Step.VERIFY, Site(kubernetes=True, machine=True, validation=False)) is Step.RETURN
    assert next_on_success(Step.VALIDATE, Site(kubernetes=True, machine=True, validation=True)) is Step.RETURN
    for nxt in (Step.RETURN, Step.VM_RESTART, Step.QUARANTINE):
        check_transition(Step.VALIDATE, nxt)


def test_output_helpers() -> None:
    assert tail("héllo", 3) == "llo" and tail("abc", 10) == "abc"
    assert last_line("a\nMemory | Pass\n\nnr-gate-exit: 0\n") == "Memory | Pass"


@pytest.mark.parametrize("bad", [
    {"checks": {"gpu": ["dcgmi"], "unknown": ["dcgmi"]}},
    {"checks": {"nvlink": ["all_reduce_perf"]}},
    {"checks": {"unknown": []}},
    {"timeout_s": {"gpu-memory": 10}},
    {"backend": "ssh"},
], ids=["unknown-class", "no-unknown", "empty-argv", "no-default-timeout", "bad-backend"])
def test_bad_validation_settings_fail_loudly(bad: dict[str, Any]) -> None:
    with pytest.raises(SettingsError, match="validation"):
        load_settings(validation=bad)


def test_default_is_no_gate() -> None:
    assert load_settings().validation.backend == "none"


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o1777], ids=oct)
def test_a_work_directory_others_may_write_stops_the_start(tmp_path: Path, mode: int) -> None:
    """The directory holds the script every check runs on the nodes: whoever may write there runs code
    there as the service's Slurm user."""
    workdir = tmp_path / "gate"
    workdir.mkdir()
    workdir.chmod(mode)
    with pytest.raises(SettingsError, match=rf"validation\.slurm_workdir: .*mode {mode & 0o7777:04o}"):
        load_settings(validation={"backend": "slurm", "slurm_workdir": str(workdir)})


def test_a_work_directory_only_its_owner_writes_is_fine(tmp_path: Path) -> None:
    workdir = tmp_path / "gate"
    workdir.mkdir()
    workdir.chmod(0o755)
    assert load_settings(validation={"backend": "slurm", "slurm_workdir": str(workdir)}).validation.backend == "slurm"
    # Not there yet (the validator creates it, 0755) or not used: nothing to refuse.
    assert load_settings(validation={"backend": "slurm", "slurm_workdir": str(tmp_path / "later")})
    workdir.chmod(0o777)
    assert load_settings(validation={"backend": "kubernetes", "slurm_workdir": str(workdir)})
