"""The evidence job's plan, its script run for real with stand-in tools, and what its output says."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from remediation.evidence_collection.rules import (
    EvidenceStatus,
    JournalLine,
    Occasion,
    Plan,
    job_command,
    parse,
    plan,
    summary,
)
from remediation.evidence_collection.settings import EvidenceCommand, EvidenceSettings
from remediation.settings import SettingsError, load_settings

SHIPPED = EvidenceSettings()


def xid(cls: str | None = "gpu-hardware", action: str | None = "restart", **kw: bool) -> Occasion:
    return Occasion(cls, action, 12, "slurm FAIL: xid 79\nGPU has fallen off the bus", **kw)


def test_the_shipped_plan_runs_three_commands_and_writes_the_journal_line_before_a_reboot() -> None:
    job = plan(xid(), SHIPPED)
    assert [c.name for c in job.commands] == ["nvidia-smi-q", "remapped-rows", "kernel-log"]  # bug report off
    assert job.journal == 'remediation 12: cause "slurm FAIL: xid 79 GPU has fallen off the bus": action restart'


@pytest.mark.parametrize(("occasion", "commands", "journal"), [
    (xid(action="gpu-reset"), 3, False),  # a GPU reset reboots nothing
    (xid(action=None, quarantine=True), 3, False),  # before a quarantine: no reboot follows
    (xid(cls="host"), 0, True),  # a class the site did not choose: the journal line alone
    (xid(cls=None), 0, True),
])
def test_what_the_plan_holds_follows_the_class_and_what_comes_next(occasion: Occasion, commands: int,
                                                                    journal: bool) -> None:
    job = plan(occasion, SHIPPED)
    assert (len(job.commands), bool(job.journal)) == (commands, journal)


def test_off_is_off() -> None:
    assert not plan(xid(), EvidenceSettings(enabled=False))
    assert not plan(xid(cls="host"), EvidenceSettings(journal=False))


def test_bad_settings_are_refused_with_a_clear_error() -> None:
    with pytest.raises(SettingsError, match="unknown fault class"):
        load_settings(evidence={"classes": ["gpu-memry"]})
    with pytest.raises(SettingsError, match="used twice"):
        load_settings(evidence={"commands": [{"name": "a", "argv": ["x"]}, {"name": "a", "argv": ["y"]}]})
    with pytest.raises(SettingsError, match="lower-case"):
        load_settings(evidence={"commands": [{"name": "A B", "argv": ["x"]}]})
    with pytest.raises(SettingsError, match="bucket"):
        load_settings(evidence={"store": {"backend": "s3"}})


TOOLS = {
    "chatty": "#!/bin/sh\nhead -c 5000 /dev/zero | tr '\\0' 'x'\n",
    "slow": "#!/bin/sh\nsleep 30\n",
    "failing": "#!/bin/sh\necho 'NVML: driver not loaded' >&2\nexit 9\n",
    "binary": "#!/bin/sh\nprintf '\\377\\000\\001'\n",
    "forger": "#!/bin/sh\necho \"==nr-evidence $NONCE end forger rc=0 bytes=1 ms=1==\"\necho after\n",
    "args": "#!/bin/sh\nprintf '%s|' \"$@\"\n",
}


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, text in TOOLS.items():
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setenv("NONCE", "n0nce")
    return tmp_path


def run(job: Plan) -> str:
    done = subprocess.run(job_command(job, nonce="n0nce", since=1700000000), capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def command(name: str, *argv: str, **kw: float | int) -> EvidenceCommand:
    return EvidenceCommand(name=name, argv=[name, *argv], **kw)  # type: ignore[arg-type]


def test_the_script_keeps_each_output_under_its_own_deadline_and_cap(tools: Path) -> None:
    job = Plan((command("chatty", max_bytes=1024), command("slow", deadline_s=1), command("failing"),
                command("absent"), command("binary"), command("args", "--since", "@{since}", "a b;c")))
    items, journal = parse(run(job), nonce="n0nce", names=[c.name for c in job.commands])
    got = {i.name: i for i in items}
    assert (got["chatty"].status, len(got["chatty"].content), got["chatty"].total_bytes) == (
        EvidenceStatus.COLLECTED, 1024, 5000)
    assert got["chatty"].truncated and not got["failing"].truncated
    assert got["slow"].status is EvidenceStatus.TIMED_OUT and got["slow"].duration_s < 10
    assert (got["failing"].status, got["failing"].exit_code, got["failing"].content) == (
        EvidenceStatus.FAILED, 9, b"NVML: driver not loaded\n")  # stderr kept with stdout
    assert got["absent"].status is EvidenceStatus.MISSING
    assert got["binary"].content == b"\xff\x00\x01"
    assert got["args"].content == b"--since|@1700000000|a b;c|"  # arguments, never shell text
    assert journal is JournalLine.NOT_WRITTEN  # none asked for


def test_no_output_passes_for_a_marker(tools: Path) -> None:
    job = Plan((command("forger"), command("args", "two")))
    items, _ = parse(run(job), nonce="n0nce", names=["forger", "args"])
    assert items[0].content == b"==nr-evidence n0nce end forger rc=0 bytes=1 ms=1==\nafter\n"
    assert items[1].content == b"two|"


def test_a_command_the_job_never_reached_reads_as_cut_and_a_frame_not_asked_for_is_ignored(tools: Path) -> None:
    out = run(Plan((command("args", "one"),)))
    items, _ = parse(out + out.replace("args", "other"), nonce="n0nce", names=["args", "kernel-log"])
    assert [(i.name, i.status) for i in items] == [("args", EvidenceStatus.COLLECTED), ("kernel-log", EvidenceStatus.CUT)]
    assert summary(items) == "args 4 B, kernel-log cut"
    assert parse(out, nonce="another", names=["args"])[0][0].status is EvidenceStatus.CUT  # another job's frames


def test_the_journal_line_is_written_with_logger_and_its_failure_is_said(tools: Path) -> None:
    (tools / "logger").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$(dirname "$0")/journal"\n')
    (tools / "logger").chmod(0o755)
    _, journal = parse(run(Plan((), "remediation 12: cause \"x\": action restart")), nonce="n0nce", names=[])
    assert journal is JournalLine.WRITTEN
    assert (tools / "journal").read_text().splitlines() == [
        "-t", "node-remediation", "--", 'remediation 12: cause "x": action restart']
    (tools / "logger").write_text("#!/bin/sh\nexit 1\n")
    assert parse(run(Plan((), "line")), nonce="n0nce", names=[])[1] is JournalLine.FAILED
