"""The validation on the real slurmctld (22.05 and 24.11): reservation, check job, verdict, cleanup.

The check is a tiny script that waits for a cue file and exits with the code written in it, so each
test decides when the "GPU check" ends and how. Nothing stands in for Slurm: the validator runs the real
``scontrol create reservation``, ``sbatch``, ``scontrol show job`` and ``scontrol delete``.

- a user job submitted while the check runs stays PENDING on that node (after the scheduler has
  looked at it: its pending reason is set), and starts there only once the set-up is gone and the node is
  returned;
- the ``validate`` step driven by the real engine: a pass moves on to ``return`` (which resumes the node)
  and records the check in ``validations``; a fail leaves the node drained with our reason, climbs the
  ladder within the same remediation, and keeps the check's output on the step;
- a worker killed after submitting (the step re-run with the same key) does not submit twice.
"""

from __future__ import annotations

import getpass
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemoryVM, MemoryWorld
from remediation.adapters.slurm.args import InvalidSlurmArgument
from remediation.adapters.slurm.cli import CliSlurm
from remediation.adapters.slurm.validator import SlurmValidator, parse_job
from remediation.clock import SystemClock
from remediation.db.models import Node, Remediation, RemediationStep, Validation
from remediation.domain.step_bodies import Adapters
from remediation.domain.stepdetail import JobNonce
from remediation.services.workflow import Workflow
from remediation.settings import Settings, load_settings
from remediation.validation.port import ValidationCheck
from remediation.validation.rules import check_name
from tests.integration.slurm.conftest import SlurmCluster
from tests.pace import within
from tests.scenario_table import IMPOSTOR, BadInputs

pytestmark = pytest.mark.slurm
# The reservation test runs with each backend where slurmrestd writes (not 22.05's): see conftest.
SLURM_WRITES = True

PREFIX = "remediation:"
CHECK = """#!/bin/sh
echo "dcgm stand-in: checking GPUs on $SLURMD_NODENAME in reservation $SLURM_JOB_RESERVATION"
while [ ! -f "$1" ]; do sleep 0.1; done
code=$(cat "$1")
echo "result: exit $code"
exit "$code"
"""


@pytest.fixture
def check_dir(slurm: SlurmCluster) -> Iterator[Path]:
    """A directory slurmd (chroot included) and the test both see, with the cue-driven check."""
    path = slurm.workdir / f"gate-{time.monotonic_ns()}"
    path.mkdir()
    (path / "check.sh").write_text(CHECK)
    (path / "check.sh").chmod(0o755)
    yield path
    # A check job a failed assertion left behind must not hold the node for the next test; its
    # reservation can be deleted once the job has left it.
    slurm.cancel_jobs()
    wait_for(lambda: not slurm.jobs(), 30, "the check jobs to leave")
    out = slurm.scontrol("show", "reservation", check=False).stdout
    for line in out.splitlines():
        if line.startswith("ReservationName="):
            slurm.scontrol("delete", line.split()[0], check=False)


def give(cue: Path, code: int) -> None:
    """Write the cue whole in one step: the check polls for the file and would read a half-written one
    as empty ("exit: Illegal number", seen on a slow runner)."""
    part = cue.with_name(cue.name + ".part")
    part.write_text(str(code))
    os.replace(part, cue)


def settings_for(cluster: SlurmCluster, workdir: Path, cue: Path, timeout_s: float = 60) -> Settings:
    return load_settings(
        slurm=cluster.slurm_options(),
        workflow={"poll_interval_s": 0.2, "max_wait_s": 1.0, "lease_s": 30},
        validation={"backend": "slurm", "slurm_workdir": str(workdir), "poll_interval_s": 0.2,
                    "checks": {"unknown": ["/bin/sh", str(workdir / "check.sh"), str(cue)]},
                    "timeout_s": {"default": timeout_s}},
    )


def wait_for(ok: Callable[[], object], timeout: float, what: str | Callable[[], str]) -> None:
    deadline = within(timeout)
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(0.1)


def job(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    return parse_job(cluster.scontrol("show", "job", "-o", job_id).stdout)


def reservations(cluster: SlurmCluster) -> str:
    return cluster.scontrol("show", "reservation", check=False).stdout


def rest_requests(cluster: SlurmCluster) -> list[str]:
    """The requests slurmrestd served, as its log names them ("POST /slurm/v0.0.45/reservation")."""
    log = (cluster.dir / "log" / "slurmrestd.log").read_text()
    return re.findall(r"operations_router: \[[^]]*\] ([A-Z]+ \S+)", log)


def test_user_job_waits_until_the_gate_is_gone(
    slurm: SlurmCluster, slurm_backend: str, check_dir: Path, caplog: pytest.LogCaptureFixture,
    request: pytest.FixtureRequest,
) -> None:
    """With the cli backend the validator runs scontrol and sbatch; with the rest backend it goes through
    slurmrestd where the API version creates reservations (26.05), and otherwise (24.11's v0.0.42) says
    why it falls back to the commands."""
    node = slurm.nodes[1]
    cue = check_dir / "cue"
    cfg = settings_for(slurm, check_dir, cue)
    slurm.scontrol("update", f"nodename={node}", "state=drain", f'reason="{PREFIX} xid 79"')
    served_before = len(rest_requests(slurm))
    with caplog.at_level(logging.INFO, logger="remediation.adapters.slurm.validator_io"):
        validator = SlurmValidator(cfg.slurm, cfg.validation)
    request.addfinalizer(validator.close)
    said = [r.getMessage() for r in caplog.records if r.name == "remediation.adapters.slurm.validator_io"]
    through_rest = slurm_backend == "rest" and slurm.release >= (26, 5)
    api = cfg.slurm.rest_api_version
    if through_rest:
        assert validator.io.through == f"slurmrestd {api}"
        assert said == [f"the validator reserves and runs its check through slurmrestd {api}"]
    else:
        assert validator.io.through == "scontrol and sbatch"
        fallback = [f"the validator uses scontrol and sbatch: slurmrestd {api} cannot create a reservation "
                    "(v0.0.43 and later can: Slurm 25.05+)"]
        assert said == (fallback if slurm_backend == "rest" else [])
    # One name per backend: slurmctld remembers the other run's job of the same name (MinJobAge).
    check = ValidationCheck(node, f"nr-gate-r901-a1-{slurm_backend}", tuple(cfg.validation.check_for("unknown")), 60)
    ref = validator.start(check)
    ref = {**ref, "node": node}
    wait_for(lambda: job(slurm, ref["job_id"]).get("JobState") == "RUNNING", 30, "the check job to run")
    info = job(slurm, ref["job_id"])
    assert info["Reservation"] == check.name and info["NodeList"] == node
    assert validator.start(check)["job_id"] == ref["job_id"]  # found again as ours: user, reservation, node
    assert f"ReservationName={check.name}" in reservations(slurm)

    (check_dir / "user.sh").write_text("#!/bin/sh\necho user job on $SLURMD_NODENAME\n")
    user = slurm.run("sbatch", "--parsable", "-w", node, "-o", str(check_dir / "user.out"),
                     "-D", str(check_dir), str(check_dir / "user.sh")).stdout.strip()
    # Barrier: the scheduler has considered the job (its pending reason is no longer "None").
    wait_for(lambda: job(slurm, user).get("Reason") not in (None, "None"), 30, "the scheduler to look at the user job")
    assert job(slurm, user)["JobState"] == "PENDING", job(slurm, user)
    assert validator.poll(ref).done is False

    give(cue, 0)
    wait_for(lambda: validator.poll(ref).done, 30, "the check to end")
    result = validator.poll(ref)
    assert result.passed and result.exit_code == 0 and "result: exit 0" in result.output
    assert f"reservation {check.name}" in result.output
    note = validator.finish(ref)
    assert "drained again" in note and f"reservation {check.name} deleted" in note
    assert check.name not in reservations(slurm)
    state, flags, reason = slurm.nodes_now()[node]
    assert "DRAIN" in flags and reason == f"{PREFIX} xid 79"  # back as it was: the return step decides
    assert job(slurm, user)["JobState"] == "PENDING"
    assert validator.finish(ref).endswith(f"reservation {check.name} deleted")  # a repeat is harmless

    slurm.scontrol("update", f"nodename={node}", "state=resume")  # what the return step does
    wait_for(lambda: job(slurm, user).get("JobState") == "COMPLETED", 30, "the user job to run once returned")
    assert job(slurm, user)["NodeList"] == node
    served = rest_requests(slurm)[served_before:]
    validator_requests = {f"POST /slurm/{api}/reservation", f"POST /slurm/{api}/job/submit",
                     f"DELETE /slurm/{api}/reservation/{check.name}"}
    if through_rest:
        assert validator_requests <= set(served), served
    else:
        assert not validator_requests & set(served), served


def test_a_planted_job_id_reaches_no_slurm_command(slurm: SlurmCluster, check_dir: Path) -> None:
    """A step row whose job id was changed to an option (``--user=NAME``: scancel would read it as every
    job of that user) is refused before scontrol or scancel runs, and the user's job runs on."""
    node = slurm.nodes[0]
    cfg = settings_for(slurm, check_dir, check_dir / "cue")
    (check_dir / "user.sh").write_text("#!/bin/sh\nsleep 120\n")
    user = slurm.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "-D", str(check_dir),
                     str(check_dir / "user.sh")).stdout.strip()
    try:
        wait_for(lambda: job(slurm, user).get("JobState") == "RUNNING", 30, "the user job to run")
        me = getpass.getuser()
        planted = {"reservation": "nr-gate-r903-a1", "job_id": f"--user={me}", "node": node, "output": "",
                   "user": me}
        validator = SlurmValidator(cfg.slurm, cfg.validation)
        for call in (validator.poll, validator.finish):
            with pytest.raises(InvalidSlurmArgument, match="invalid Slurm job id"):
                call(planted)
        assert job(slurm, user)["JobState"] == "RUNNING"
    finally:
        slurm.run("scancel", user, check=False)


def open_at_validate(sessions: sessionmaker[Session], node: str, now: datetime) -> int:
    with sessions() as s, s.begin():
        if s.get(Node, ("default", node)) is None:
            s.add(Node(name=node, status="remediating", first_seen_at=now, updated_at=now))
        rem = Remediation(node=node, cause="xid 79: GPU fell off the bus", source="slurm", status="running",
                          step="validate", ladder=0, opened_at=now, updated_at=now, next_run_at=now,
                          context={"cause_class": "unknown"})
        s.add(rem)
        s.flush()
        return rem.id


def drive(engine: Workflow, rid: int, step: str, until: Callable[[], bool], timeout: float = 40) -> None:
    """Run the engine as the worker would (countdowns slept, sub-second) until ``until()``."""
    deadline = within(timeout)
    current: str | None = step
    while not until():
        assert time.monotonic() < deadline, "the workflow did not get there in time"
        follow = engine.run(rid, current or step)
        if follow is None:
            return
        current = follow.step
        time.sleep(min(follow.countdown or 0, 0.3))


def engine_for(cfg: Settings, sessions: sessionmaker[Session], cluster: SlurmCluster) -> Workflow:
    world = MemoryWorld(nodes=list(cluster.nodes))
    validator = SlurmValidator(cfg.slurm, cfg.validation)
    adapters = Adapters(CliSlurm(cfg.slurm), MemoryKube(world), MemoryVM(world), validator)
    return Workflow(sessions, adapters, cfg, clock=SystemClock())


def status(sessions: sessionmaker[Session], rid: int) -> tuple[str, str, int]:
    with sessions() as s:
        rem = s.get(Remediation, rid)
        assert rem is not None
        return rem.status, rem.step, rem.ladder


def test_validate_step_pass_returns_the_node(slurm: SlurmCluster, check_dir: Path,
                                             sessions: sessionmaker[Session]) -> None:
    node = slurm.nodes[2]
    cue = check_dir / "cue"
    cfg = settings_for(slurm, check_dir, cue)
    slurm.scontrol("update", f"nodename={node}", "state=drain", f'reason="{PREFIX} xid 79"')
    rid = open_at_validate(sessions, node, datetime.now(UTC))
    engine = engine_for(cfg, sessions, slurm)
    follow = engine.run(rid, "validate")  # starts the check
    assert follow is not None and follow.step == "validate"
    with sessions() as s:
        row = s.scalars(select(RemediationStep).where(RemediationStep.remediation_id == rid)).one()
        op, nonce = dict(row.provider_op or {}), JobNonce.load(row.detail).value
    assert nonce and op["reservation"] == check_name(row.idempotency_key, nonce) and op["job_id"]
    # A redelivered first look (the worker died after sbatch, before recording) submits nothing new.
    again = SlurmValidator(cfg.slurm, cfg.validation).start(ValidationCheck(node, op["name"], tuple(op["command"]), 60))
    assert again["job_id"] == op["job_id"]
    give(cue, 0)
    drive(engine, rid, "validate", lambda: status(sessions, rid)[0] == "succeeded")
    assert status(sessions, rid) == ("succeeded", "done", 0)
    state, flags, _ = slurm.nodes_now()[node]
    assert not flags - {"NOT_RESPONDING"}, (state, flags)  # returned to service by the return step
    assert op["reservation"] not in reservations(slurm)
    with sessions() as s:
        v = s.scalars(select(Validation).where(Validation.remediation_id == rid)).one()
    assert (v.outcome, v.exit_code, v.backend) == ("passed", 0, "slurm")
    assert v.command.endswith(f"check.sh {cue}") and "result: exit 0" in v.output_tail
    assert v.duration_s > 0


def test_validate_step_fail_climbs_the_ladder(slurm: SlurmCluster, check_dir: Path,
                                              sessions: sessionmaker[Session]) -> None:
    node = slurm.nodes[3]
    cue = check_dir / "cue"
    give(cue, 3)  # the HBM row is still bad: the check fails at once
    cfg = settings_for(slurm, check_dir, cue)
    slurm.scontrol("update", f"nodename={node}", "state=drain", f'reason="{PREFIX} xid 79"')
    rid = open_at_validate(sessions, node, datetime.now(UTC))
    engine = engine_for(cfg, sessions, slurm)
    drive(engine, rid, "validate", lambda: status(sessions, rid)[1] != "validate")
    assert status(sessions, rid) == ("running", "vm_restart", 1)  # same remediation, next rung
    _, flags, reason = slurm.nodes_now()[node]
    assert "DRAIN" in flags and reason == f"{PREFIX} xid 79"  # not returned
    assert "nr-gate" not in reservations(slurm)
    with sessions() as s:
        row = s.scalars(select(RemediationStep).where(RemediationStep.remediation_id == rid,
                                                      RemediationStep.step == "validate")).one()
        v = s.scalars(select(Validation).where(Validation.remediation_id == rid)).one()
        assert row.status == "failed" and "GPU check failed" in (row.error or "")
        assert "result: exit 3" in row.detail["validation"]["output"]
    assert (v.outcome, v.exit_code) == ("failed", 3)


def test_humans_validate_on_demand_and_release_on_a_pass(slurm: SlurmCluster, check_dir: Path, pg_url: str,
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``remediation validate NODE`` on a drained node, and ``release NODE --validate``: a failing check
    keeps the node quarantined; a passing one releases it. The drain the node had is put back after each
    check (the check never returns a node by itself)."""
    import yaml
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool
    from typer.testing import CliRunner

    from remediation.cli.oncall import app
    from tests.integration.history import RecordingDispatcher

    node = slurm.nodes[0]
    cue = check_dir / "cue"
    cfg = settings_for(slurm, check_dir, cue)
    config = tmp_path / "remediation.yaml"
    config.write_text(yaml.safe_dump({"slurm": cfg.slurm.model_dump(exclude_none=True, mode="json"),
                                      "validation": cfg.validation.model_dump(mode="json")}))
    # `--config` points the process at the file (REMEDIATION_CONFIG), as the console script must; in this
    # in-process run the test owns that variable, so it is gone again for the tests after it.
    monkeypatch.setenv("REMEDIATION_CONFIG", str(config))
    engine = create_engine(pg_url, poolclass=NullPool)
    db = sessionmaker(bind=engine)
    now = datetime.now(UTC)
    reason = f"{PREFIX} quarantined: VM ladder exhausted"
    with db() as s, s.begin():
        s.add(Node(name=node, status="quarantined", status_reason=reason, first_seen_at=now, updated_at=now,
                   quarantined_at=now, quarantine_reason=reason))
    slurm.scontrol("update", f"nodename={node}", "state=drain", f'reason="{reason}"')
    runner = CliRunner()
    dispatched = RecordingDispatcher()

    def cli(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, ["--config", str(config), "--actor", "oncall", *args],
                               env={"REMEDIATION_DATABASE__URL": pg_url, "COLUMNS": "200"},
                               obj=lambda settings: dispatched)
        return result.exit_code, result.output

    give(cue, 0)
    code, out = cli("validate", node)
    assert code == 0 and "GPU check PASSED" in out and "result: exit 0" in out, out
    assert slurm.nodes_now()[node][1:] == (frozenset({"DRAIN"}), reason)  # still out: validate returns nothing

    give(cue, 1)
    code, out = cli("release", node, "-r", "HBM swapped", "--validate")
    assert code == 1 and "GPU check FAILED" in out and "stays quarantined" in out, out
    with db() as s:
        assert s.get(Node, ("default", node)).status == "quarantined"  # type: ignore[union-attr]
    assert slurm.nodes_now()[node][1:] == (frozenset({"DRAIN"}), reason)

    give(cue, 0)
    code, out = cli("release", node, "-r", "HBM swapped", "--validate")
    assert code == 0 and "released" in out, out
    with db() as s:
        assert s.get(Node, ("default", node)).status == "healthy"  # type: ignore[union-attr]
        checks = s.scalars(select(Validation).where(Validation.node == node).order_by(Validation.id)).all()
    assert [(v.outcome, v.actor, v.remediation_id) for v in checks] == [
        ("passed", "oncall", None), ("failed", "oncall", None), ("passed", "oncall", None)]
    assert dispatched.released(db) == [node]  # the release actions (resume, uncordon) went to the workers
    code, out = cli("nodes", "show", node)
    assert code == 0 and "GPU checks" in out and "check.sh" in out, out
    engine.dispose()


def test_jobs_another_user_named_like_the_check_return_nothing(slurm: SlurmCluster, check_dir: Path,
                                                               sessions: sessionmaker[Session],
                                                               bad_inputs: BadInputs) -> None:
    """Any cluster user can name a job. ``nobody`` runs ``true`` under the names the check would have
    had without a nonce (``nr-gate-rN-a1``) and under its very name (the nonce read off the step row), and
    both finish with exit 0. The real check fails (the GPU is still bad): neither of nobody's jobs is
    taken for it (user, reservation and node are not ours), so the node is not returned and the
    remediation climbs the ladder on the real verdict."""
    node, elsewhere = slurm.nodes[3], slurm.nodes[0]
    cue = check_dir / "cue"
    give(cue, 1)
    cfg = settings_for(slurm, check_dir, cue)
    slurm.scontrol("update", f"nodename={node}", "state=drain", f'reason="{PREFIX} xid 79"')
    rid = open_at_validate(sessions, node, datetime.now(UTC))
    key, nonce = f"r{rid}:validate:1", "5eed5eed5e"
    with sessions() as s, s.begin():  # the attempt's row as the engine makes it, its nonce recorded
        s.add(RemediationStep(remediation_id=rid, step="validate", attempt=1, idempotency_key=key,
                              status="started", started_at=datetime.now(UTC), checks=0, retries=0,
                              detail={"nonce": nonce}))
    ran = []
    for name in (check_name(key), check_name(key, nonce)):  # srun: nobody cannot read the session's spool
        ran.append(slurm.run_as("nobody", "srun", f"--job-name={name}", "-w", elsewhere, "-D", "/tmp", "true"))

    def finished() -> list[str]:
        lines = slurm.run("squeue", "-h", "-t", "all", "-o", "%i %j %u %T").stdout.splitlines()
        return [line.split()[0] for line in lines if line.endswith("nobody COMPLETED") and "nr-gate-r" in line]

    wait_for(lambda: len(finished()) == 2, 30, lambda: f"nobody's jobs to finish: {ran}")
    planted = finished()
    assert {job(slurm, j)["UserId"].partition("(")[0] for j in planted} == {"nobody"}
    engine = engine_for(cfg, sessions, slurm)
    drive(engine, rid, "validate", lambda: status(sessions, rid)[1] != "validate")
    assert status(sessions, rid) == ("running", "vm_restart", 1)  # the real verdict: failed
    _, flags, reason = slurm.nodes_now()[node]
    assert "DRAIN" in flags and reason == f"{PREFIX} xid 79"  # never returned
    with sessions() as s:
        row = s.scalars(select(RemediationStep).where(RemediationStep.remediation_id == rid)).one()
        v = s.scalars(select(Validation).where(Validation.remediation_id == rid)).one()
        op = dict(row.provider_op or {})
    assert op["reservation"] == check_name(key, nonce) and op["job_id"] not in planted
    assert (v.outcome, v.exit_code) == ("failed", 1) and "result: exit 1" in v.output_tail
    bad_inputs.tried(IMPOSTOR, f"Slurm {slurm.version}: 2 finished jobs of user nobody named like the next check",
                     "neither adopted; the real check failed and the node stayed drained",
                     lost=len(set(planted) & {op["job_id"]}))  # a planted job taken for the real check


def test_a_check_cancelled_or_held_is_taken_down(slurm: SlurmCluster, check_dir: Path,
                                                 sessions: sessionmaker[Session]) -> None:
    """The check resumed each node into a reservation that ends only when deleted. On-call cancels
    one remediation mid-check; an error nobody mapped holds the other. The sweeper takes both checks
    down: each node drained again with the reason it had, its reservation and check job gone, and the
    step row ended (a held remediation's resume starts a fresh check). A third is cancelled with its
    node given back: once its check is down, the node is back in service."""
    from remediation.services import lever_rules
    from remediation.services.holds import PagedError, hold

    cue = check_dir / "cue"  # never written: both checks run until they are taken down
    cfg = settings_for(slurm, check_dir, cue)
    engine = engine_for(cfg, sessions, slurm)
    nodes, rids = slurm.nodes[1:4], []
    for node in nodes:
        slurm.scontrol("update", f"nodename={node}", "state=drain", f'reason="{PREFIX} xid 79"')
        rids.append(open_at_validate(sessions, node, datetime.now(UTC)))
        engine.run(rids[-1], "validate")  # starts the check
    ops = []
    for rid in rids:
        with sessions() as s:
            ops.append(dict(s.scalars(select(RemediationStep).where(RemediationStep.remediation_id == rid))
                            .one().provider_op or {}))
    for op in ops:
        wait_for(lambda op=op: job(slurm, op["job_id"]).get("JobState") == "RUNNING", 30, "the check to run")
        shown = parse_job(slurm.scontrol("show", "reservation", op["reservation"]).stdout)
        # No end lets users onto the node under check (22.05 shows UNLIMITED as a year).
        assert shown["Duration"] in ("UNLIMITED", "365-00:00:00"), shown
    now = datetime.now(UTC)
    with sessions() as s, s.begin():
        lever_rules.cancel(s, rids[0], "oncall", reason="wrong node", now=now)
        lever_rules.cancel(s, rids[2], "oncall", reason="fixed by hand", now=now, give_back=True)
        rem = s.get(Remediation, rids[1], with_for_update=True)
        assert rem is not None
        hold(s, now, rem, row=None, fault=PagedError("unmapped ValueError", "boom", False), poll_s=1.0)
    engine.sweep()
    for node, op in zip(nodes, ops, strict=True):
        _, flags, reason = slurm.nodes_now()[node]
        if node == nodes[2]:  # given back
            assert not flags & {"DRAIN", "MAINTENANCE", "RESERVED"}, (node, flags, reason)
        else:
            assert "DRAIN" in flags and reason == f"{PREFIX} xid 79", (node, flags, reason)
        assert op["reservation"] not in reservations(slurm)
        assert job(slurm, op["job_id"])["JobState"] in ("CANCELLED", "COMPLETING")
    with sessions() as s:
        rows = s.scalars(select(RemediationStep).where(RemediationStep.remediation_id.in_(rids))).all()
    assert [(r.status, r.error_kind) for r in rows] == [("failed", "CheckTakenDown")] * 3
    assert engine.sweep() == []  # nothing left to take down
