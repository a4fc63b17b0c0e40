"""The Slurm validator's argument checks, with its one command runner faked at our own boundary: what
it reads back from the database (the check's job id, reservation name, node) is checked before any
``scontrol`` or ``scancel`` runs, so a corrupted or planted row cannot widen what a command does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from remediation.adapters.slurm.args import InvalidSlurmArgument
from remediation.adapters.slurm.validator import SlurmValidator
from remediation.ports.errors import ConfigError, PermanentError
from remediation.settings import load_settings
from remediation.validation.port import ValidationCheck

BAD_JOB_IDS = ["123;rm", "--all", "-1", "", "12 34", "12\n", None, 12.5]


def validator(tmp_path: Path, argv: list[list[str]]) -> SlurmValidator:
    cfg = load_settings(slurm={"backend": "cli"}, validation={"backend": "slurm", "slurm_workdir": str(tmp_path)})
    v = SlurmValidator(cfg.slurm, cfg.validation)

    def run(args: list[str]) -> str:
        argv.append(args)
        return "JobId=12 JobState=RUNNING ExitCode=0:0"

    v.io.cli._run = run  # type: ignore[attr-defined]  # the one runner every Slurm command goes through
    return v


def ref(**changes: Any) -> dict[str, Any]:
    return {"reservation": "nr-gate-r7-a1", "job_id": "12", "node": "gpu-node-3", "output": "/x.out",
            "user": "root", **changes}


@pytest.mark.parametrize("job", BAD_JOB_IDS, ids=repr)
@pytest.mark.parametrize("call", ["poll", "finish"])
def test_a_bad_job_id_from_the_database_runs_nothing(tmp_path: Path, call: str, job: object) -> None:
    argv: list[list[str]] = []
    with pytest.raises(InvalidSlurmArgument, match="invalid Slurm job id") as refused:
        getattr(validator(tmp_path, argv), call)(ref(job_id=job))
    assert isinstance(refused.value, PermanentError)
    assert argv == []


@pytest.mark.parametrize("field", [{"reservation": "--all"}, {"reservation": "nr-gate-x y"},
                                   {"node": "ALL"}, {"node": "gpu[1-9]"}], ids=repr)
def test_a_bad_reservation_or_node_from_the_database_runs_nothing(tmp_path: Path, field: dict[str, str]) -> None:
    argv: list[list[str]] = []
    with pytest.raises(PermanentError):
        validator(tmp_path, argv).finish(ref(**field))
    assert argv == []


def test_a_good_id_reaches_scontrol_as_one_argument(tmp_path: Path) -> None:
    argv: list[list[str]] = []
    result = validator(tmp_path, argv).poll(ref())
    assert argv == [["scontrol", "show", "job", "-o", "12"]] and result.state == "RUNNING"


def test_the_output_is_read_from_the_work_directory_only(tmp_path: Path) -> None:
    """The stored output path is not trusted: the check's output is NAME.out in the work directory."""
    secret = tmp_path.parent / f"{tmp_path.name}-secret.out"
    secret.write_text("not the check's output\n")
    (tmp_path / "nr-gate-r7-a1.out").write_text("Memory | Pass\n")
    result = validator(tmp_path, []).poll(ref(output=str(secret)))
    assert result.output == "Memory | Pass\n"


def test_a_work_directory_loosened_after_the_start_runs_nothing(tmp_path: Path) -> None:
    argv: list[list[str]] = []
    v = validator(tmp_path, argv)  # 0700 at start-up
    tmp_path.chmod(0o777)
    check = ValidationCheck("gpu-node-3", "nr-gate-r7-a1", ("dcgmi", "diag", "-r", "2"), 600)
    with pytest.raises(ConfigError, match=r"validation\.slurm_workdir: .*mode 0777"):
        v.start(check)
    assert argv == [] and not (tmp_path / "nr-gate-exec.sh").exists()


class _Rest:
    """slurmrestd's answers, as RestSlurm.answer hands them over: (JSON, tolerated errnos)."""

    version = "v0.0.45"

    def __init__(self, answers: dict[tuple[str, str], tuple[dict[str, Any], frozenset[int]]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, str]] = []

    def answer(self, method: str, path: str, **_: Any) -> tuple[dict[str, Any], frozenset[int]]:
        self.asked.append((method, path))
        return self.answers[(method, path)]


def _number(n: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": n}


def _job(state: str, rc: int, signal: int, start: int = 100, end: int = 160) -> dict[str, Any]:
    number = _number
    return {"jobs": [{"job_state": [state], "state_reason": "None", "start_time": number(start),
                      "end_time": number(end), "exit_code": {"return_code": number(rc),
                                                             "signal": {"id": number(signal), "name": ""}}}]}


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (_job("COMPLETED", 0, 0), ("COMPLETED", 0, 60.0)),
        (_job("FAILED", 3, 0), ("FAILED", 3, 60.0)),
        (_job("CANCELLED", 0, 9), ("CANCELLED", 137, 60.0)),  # killed by SIGKILL: as a shell reports it
        (_job("RUNNING", 0, 0), ("RUNNING", 0, None)),  # end_time is the time limit's end while it runs
    ],
    ids=["passed", "failed", "signal", "running"],
)
def test_slurmrestd_job_documents_read_as_scontrol_s(doc: dict[str, Any], expected: tuple[object, ...]) -> None:
    from remediation.adapters.slurm.validator_io import RestIO

    rest = _Rest({("GET", "/slurm/v0.0.45/job/12"): (doc, frozenset())})
    job = RestIO(rest).job("12")
    assert job is not None and (job.state, job.exit_code, job.run_s) == expected


def test_a_job_slurmctld_forgot_is_gone_and_a_busy_reservation_is_retried() -> None:
    from remediation.adapters.slurm.validator_io import RestIO
    from remediation.ports.errors import TransientError

    rest = _Rest({("GET", "/slurm/v0.0.45/job/12"): ({"jobs": []}, frozenset({2017})),
                  ("DELETE", "/slurm/v0.0.45/reservation/nr-gate-r7-a1"): ({}, frozenset({2055}))})
    assert RestIO(rest).job("12") is None
    with pytest.raises(TransientError, match="still in use"):
        RestIO(rest).delete_reservation("nr-gate-r7-a1")


@pytest.mark.parametrize(("api", "user"), [("v0.0.45", "svc-remediation"), ("v0.0.42", None)])
def test_through_slurmrestd_the_reservation_is_the_token_user_s(tmp_path: Path, api: str, user: str | None) -> None:
    import getpass

    cfg = load_settings(
        slurm={"backend": "rest", "rest_url": "http://127.0.0.1:9", "rest_api_version": api,
               "rest_user": "svc-remediation", "rest_token": "t"},
        validation={"backend": "slurm", "slurm_workdir": str(tmp_path)},
    )
    v = SlurmValidator(cfg.slurm, cfg.validation)
    # v0.0.45 reserves through slurmrestd, where the JWT's user submits the check; v0.0.42 falls back to sbatch.
    assert v.user == (user or getpass.getuser())


@pytest.mark.parametrize("job", ["123+0", "123+12", "77_3", "5"], ids=repr)
def test_a_heterogeneous_or_array_job_id_is_a_job_id(job: str) -> None:
    from remediation.adapters.slurm.args import check_job_id

    assert check_job_id(job) == job


def test_a_heterogeneous_job_is_requeued_once_as_a_whole(tmp_path: Path) -> None:
    """squeue lists each component of a heterogeneous job on the node (``123+0``, ``123+1``): the job
    is requeued (or cancelled) once, by its own id, and never refused as a malformed id."""
    argv: list[list[str]] = []
    v = validator(tmp_path, argv)
    v.io.cli.requeue_jobs(["123+0", "123+1", "124"])  # type: ignore[attr-defined]
    v.io.cli.cancel_jobs(["125+0"])  # type: ignore[attr-defined]
    assert argv == [["scontrol", "requeue", "123"], ["scontrol", "requeue", "124"], ["scancel", "125"]]


DOMAIN = ("gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3")


def domain_check(*nodes: str) -> ValidationCheck:
    return ValidationCheck(nodes[0], "nr-domain-r7-a1", ("srun", "all_reduce_perf"), 900, nodes=nodes)


@pytest.mark.parametrize("bad", ["gpu[1-9]", "ALL", "--all", "gpu-node-1,gpu-node-9"], ids=repr)
def test_a_bad_node_among_a_domain_check_s_runs_nothing(tmp_path: Path, bad: str) -> None:
    argv: list[list[str]] = []
    with pytest.raises(InvalidSlurmArgument, match="invalid Slurm node name"):
        validator(tmp_path, argv).start(domain_check("gpu-node-0", bad, "gpu-node-2"))
    assert argv == []


@pytest.mark.parametrize("nodes", [["gpu-node-0", "--all"], "gpu-node-[0-3]", [], ["gpu-node-0", None]], ids=repr)
def test_a_bad_node_list_from_the_database_runs_nothing(tmp_path: Path, nodes: object) -> None:
    argv: list[list[str]] = []
    with pytest.raises(InvalidSlurmArgument):
        validator(tmp_path, argv).finish(ref(nodes=nodes))
    assert argv == []


def _node_line(name: str) -> str:
    return f"NodeName={name} State=IDLE+DRAIN Reason=remediation:_nvswitch [root@2026-11-23T12:00:00]\n"


def test_a_job_that_covers_part_of_the_domain_is_not_the_check_s(tmp_path: Path) -> None:
    """A job of the name, ours and in our reservation, but on three of the four nodes, is not taken: a
    new job over the whole domain is submitted into the one reservation over the domain."""
    argv: list[list[str]] = []
    v = validator(tmp_path, argv)
    user = v.user

    def run(args: list[str]) -> str:
        argv.append(args)
        if args[1:3] == ["show", "node"]:
            return _node_line(args[-1])
        if args[0] == "squeue":
            return f"41|{user}|nr-domain-r7-a1|gpu-node-[0-2]\n"
        return "42;ci\n" if args[0] == "sbatch" else ""

    v.io.cli._run = run  # type: ignore[attr-defined]
    started = v.start(domain_check(*DOMAIN))
    assert started["job_id"] == "42" and started["nodes"] == list(DOMAIN)
    [reserve] = [a for a in argv if a[1:3] == ["create", "reservation"]]
    assert "Nodes=gpu-node-[0-3]" in reserve
    [sbatch] = [a for a in argv if a[0] == "sbatch"]
    assert "--nodelist=gpu-node-[0-3]" in sbatch and "--nodes=4" in sbatch
    assert [a[-1] for a in argv if a[-1] == "state=resume"] == ["state=resume"] * 4


class _Posting(_Rest):
    """slurmrestd taking the reservation and the job: what was posted, answered with a job id."""

    def __init__(self) -> None:
        super().__init__({})
        self.posted: dict[str, Any] = {}

    def answer(self, method: str, path: str, **kw: Any) -> tuple[dict[str, Any], frozenset[int]]:
        self.posted[path] = kw.get("json")
        return {"job_id": 42}, frozenset()


def test_through_slurmrestd_one_reservation_and_one_job_span_the_domain(tmp_path: Path) -> None:
    from remediation.adapters.slurm.validator_io import RestIO, Submission

    rest = _Posting()
    io = RestIO(rest, "svc")
    io.create_reservation("nr-domain-r7-a1", DOMAIN, "svc")
    (tmp_path / "x.sh").write_text("#!/bin/sh\n")
    job_id = io.submit(Submission("nr-domain-r7-a1", DOMAIN, 15, tmp_path / "o", tmp_path, tmp_path / "x.sh",
                                  ("srun", "all_reduce_perf"), None))
    reservation, job = rest.posted["/slurm/v0.0.45/reservation"], rest.posted["/slurm/v0.0.45/job/submit"]["job"]
    assert job_id == "42" and reservation["node_list"] == list(DOMAIN)
    assert (job["required_nodes"], job["minimum_nodes"], job["maximum_nodes"]) == (list(DOMAIN), 4, 4)
    assert job["reservation"] == "nr-domain-r7-a1" and job["argv"][1:] == ["srun", "all_reduce_perf"]
