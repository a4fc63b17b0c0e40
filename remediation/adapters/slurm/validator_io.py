"""How the Slurm validator reaches slurmctld: its reservation, its check job and the nodes.

:class:`CommandIO` runs ``scontrol``, ``sbatch``, ``squeue`` and ``scancel`` (every release);
:class:`RestIO` uses slurmrestd (v0.0.43+). :func:`validator_io` picks one and says why.

Why: docs/slurm-releases.md#the-validation-validationbackend-slurm
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from remediation.adapters.slurm.args import check_job_id
from remediation.adapters.slurm.cli import CliSlurm, SlurmCommandError
from remediation.adapters.slurm.parse import NodeRecord
from remediation.hostlist import compress
from remediation.ports.errors import PermanentError, TransientError
from remediation.settings import SlurmSettings

log = logging.getLogger(__name__)

_GONE = ("invalid job id", "job id not found", "no jobs")
_BUSY = ("busy", "in use")  # scontrol: "Requested reservation is in use"
_NO_RESERVATION = ("not found", "invalid reservation", "reservation_not_found")
#: Slurm's errno for a job slurmctld does not know (any more), and for a reservation it does not know.
_INVALID_JOB_ID = 2017
_INVALID_RESERVATION = 2053
#: Slurm's errno for "Requested reservation is in use": the cancelled check job is still completing.
_RESERVATION_BUSY = 2055
#: The first API version that creates reservations (Slurm 25.05).
FIRST_RESERVING = (0, 0, 43)
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Job:
    """The check job as slurmctld reports it; ``exit_code`` as a shell reports it (128+N for signal N)."""

    state: str
    exit_code: int | None
    reason: str = ""
    run_s: float | None = None


@dataclass(frozen=True)
class NamedJob:
    """A job slurmctld lists under a name: whose it is, where it may run, and its id."""

    job_id: str
    user: str  # the user it runs as
    reservation: str  # the reservation it asked for ("" or Slurm's "(null)": none)
    nodes: str  # the nodes it asked for (a hostlist; a pending job has none allocated yet)


@dataclass(frozen=True)
class Submission:
    name: str
    nodes: tuple[str, ...]  # every node of the one job (checked names): one node, or an NVLink domain
    minutes: int
    output: Path
    workdir: Path
    script: Path  # the wrapper script, run with the check as its arguments
    command: tuple[str, ...]
    partition: str | None


class Nodes(Protocol):
    def status(self, name: str) -> NodeRecord: ...
    def resume(self, name: str) -> None: ...
    def drain(self, name: str, reason: str) -> None: ...


class ValidatorIO(Protocol):
    @property
    def through(self) -> str: ...  # for the log

    @property
    def nodes(self) -> Nodes: ...  # the node's status, resume and drain, through the same path

    @property
    def job_user(self) -> str | None: ...  # who the check job runs as, when not this process's user

    def reservation_exists(self, name: str) -> bool: ...
    def create_reservation(self, name: str, nodes: Sequence[str], user: str) -> None: ...
    def delete_reservation(self, name: str) -> None: ...
    def jobs_named(self, name: str) -> list[NamedJob]: ...
    def submit(self, job: Submission) -> str: ...
    def job(self, job_id: str) -> Job | None: ...
    def cancel(self, job_id: str) -> None: ...
    def close(self) -> None: ...  # releases what it holds between checks (slurmrestd's connections)


def validator_io(settings: SlurmSettings) -> ValidatorIO:
    """slurmrestd where the backend is rest and its API version creates reservations; else the commands."""
    if settings.backend == "rest":
        from remediation.adapters.slurm.rest import RestSlurm

        rest = RestSlurm(settings)
        if rest.version_tuple >= FIRST_RESERVING:
            log.info("the validator reserves and runs its check through slurmrestd %s", rest.version)
            return RestIO(rest, settings.rest_user)
        rest.close()
        log.info(
            "the validator uses scontrol and sbatch: slurmrestd %s cannot create a reservation "
            "(v0.0.43 and later can: Slurm 25.05+)",
            settings.rest_api_version,
        )
    return CommandIO(settings)


class CommandIO:
    through = "scontrol and sbatch"
    job_user = None  # sbatch submits as this process's user

    def __init__(self, settings: SlurmSettings) -> None:
        self.nodes = self.cli = CliSlurm(settings)
        self.settings = settings

    def close(self) -> None:
        pass  # each command is its own process: nothing is held between them

    def reservation_exists(self, name: str) -> bool:
        try:
            out = self._run([self.settings.scontrol, "show", "reservation", name])
        except PermanentError as exc:  # SlurmCommandError, or UnknownNode for "not found"
            if any(m in exc.message.lower() for m in _NO_RESERVATION):
                return False
            raise
        return f"ReservationName={name} " in out or out.startswith(f"ReservationName={name}")

    def create_reservation(self, name: str, nodes: Sequence[str], user: str) -> None:
        self._run(
            [
                self.settings.scontrol,
                "create",
                "reservation",
                f"ReservationName={name}",
                f"Nodes={compress(nodes)}",
                f"Users={user}",
                "StartTime=now",
                "Duration=UNLIMITED",  # until the validator deletes it: no end lets users onto the node
                "Flags=maint,ignore_jobs",
            ]
        )

    def delete_reservation(self, name: str) -> None:
        try:
            self._run([self.settings.scontrol, "delete", f"ReservationName={name}"])
        except PermanentError as exc:  # SlurmCommandError, or UnknownNode for "not found"
            if any(m in exc.message.lower() for m in _BUSY):  # the cancelled job is still completing
                raise TransientError(f"reservation {name} is still in use: {exc.message}") from None
            if not any(m in exc.message.lower() for m in _NO_RESERVATION):
                raise

    def jobs_named(self, name: str) -> list[NamedJob]:
        """``squeue --name NAME -t all``: every job of that name slurmctld still knows, anyone's."""
        out = self._run([self.settings.squeue, "-h", f"--name={name}", "-t", "all", "-o", "%i|%u|%v|%n"])
        jobs = []
        for line in out.splitlines():
            fields = line.strip().split("|")
            if len(fields) == 4:
                jobs.append(NamedJob(check_job_id(fields[0]), fields[1], fields[2], fields[3]))
        return jobs

    def submit(self, job: Submission) -> str:
        argv = [
            self.settings.sbatch,
            "--parsable",
            f"--job-name={job.name}",
            f"--reservation={job.name}",
            f"--nodelist={compress(job.nodes)}",
            f"--nodes={len(job.nodes)}",
            "--exclusive",
            f"--time={job.minutes}",
            f"--output={job.output}",
            f"--chdir={job.workdir}",
        ]
        if job.partition:
            argv.append(f"--partition={job.partition}")
        out = self._run([*argv, str(job.script), *job.command])
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmCommandError(f"sbatch printed no job id: {out.strip()[:200]!r}")
        return check_job_id(job_id)

    def job(self, job_id: str) -> Job | None:
        try:
            info = parse_job(self._run([self.settings.scontrol, "show", "job", "-o", job_id]))
        except PermanentError as exc:  # SlurmCommandError, or UnknownNode for "not found"
            if any(m in exc.message.lower() for m in _GONE):
                return None
            raise
        if not info:
            return None
        return Job(
            info.get("JobState", ""),
            exit_code(info.get("ExitCode", "")),
            info.get("Reason", ""),
            _run_s(info.get("RunTime", "")),
        )

    def cancel(self, job_id: str) -> None:
        self._run([self.settings.scancel, job_id])

    def _run(self, argv: list[str]) -> str:
        return self.cli._run(argv)  # noqa: SLF001 - the one runner: argv, no shell, Slurm's errors typed


class RestIO:
    def __init__(self, rest: Any, job_user: str | None = None) -> None:  # a RestSlurm, imported lazily
        self.nodes = self.rest = rest
        self.job_user = (
            job_user  # the JWT's user (slurm.rest_user) submits the job, so the reservation is theirs
        )
        self.through = f"slurmrestd {rest.version}"
        self.base = f"/slurm/{rest.version}"

    def close(self) -> None:
        self.rest.close()

    def reservation_exists(self, name: str) -> bool:
        body, _ = self.rest.answer("GET", f"{self.base}/reservations")
        return any(r.get("name") == name for r in body.get("reservations") or [])

    def create_reservation(self, name: str, nodes: Sequence[str], user: str) -> None:
        self.rest.answer(
            "POST",
            f"{self.base}/reservation",
            json={
                "name": name,
                "node_list": list(nodes),
                "users": [user],
                "flags": ["MAINT", "IGNORE_JOBS"],
                "start_time": _number(int(time.time())),
                "duration": {"set": True, "infinite": True, "number": 0},  # until the validator deletes it
            },
        )

    def delete_reservation(self, name: str) -> None:
        _, errnos = self.rest.answer(
            "DELETE", f"{self.base}/reservation/{name}", tolerate={_INVALID_RESERVATION, _RESERVATION_BUSY}
        )
        if _RESERVATION_BUSY in errnos:
            raise TransientError(f"reservation {name} is still in use (Slurm errno {_RESERVATION_BUSY})")

    def jobs_named(self, name: str) -> list[NamedJob]:
        """``GET /jobs``, those of that name: anyone's."""
        body, _ = self.rest.answer("GET", f"{self.base}/jobs")
        return [
            NamedJob(
                check_job_id(str(j.get("job_id"))),
                str(j.get("user_name") or ""),
                str(j.get("reservation") or j.get("resv_name") or ""),
                str(j.get("required_nodes") or ""),
            )
            for j in body.get("jobs") or []
            if j.get("name") == name
        ]

    def submit(self, job: Submission) -> str:
        desc: dict[str, Any] = {
            "name": job.name,
            "reservation": job.name,
            "required_nodes": list(job.nodes),
            "minimum_nodes": len(job.nodes),
            "maximum_nodes": len(job.nodes),
            "shared": ["none"],
            "time_limit": _number(job.minutes),
            "standard_output": str(job.output),
            "current_working_directory": str(job.workdir),
            "environment": [f"PATH={_PATH}"],
            "argv": [str(job.script), *job.command],
        }
        if job.partition:
            desc["partition"] = job.partition
        script = job.script.read_text()
        body, _ = self.rest.answer("POST", f"{self.base}/job/submit", json={"script": script, "job": desc})
        job_id = body.get("job_id")
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            raise PermanentError(
                f"slurmrestd accepted the check job but named no job id: {body.get('job_id')!r:.80}"
            )
        return check_job_id(str(job_id))

    def job(self, job_id: str) -> Job | None:
        body, errnos = self.rest.answer("GET", f"{self.base}/job/{job_id}", tolerate={_INVALID_JOB_ID})
        jobs = body.get("jobs") or []
        if errnos or not jobs:  # slurmctld forgot it (MinJobAge)
            return None
        info = jobs[0]
        states = info.get("job_state") or []
        state = states[0] if isinstance(states, list) and states else str(states or "")
        code = info.get("exit_code") or {}
        rc, signal = _value(code.get("return_code")), _value((code.get("signal") or {}).get("id"))
        start, end = _value(info.get("start_time")), _value(info.get("end_time"))
        # While the job runs, end_time is when its time limit would end it: a run time only once it ended.
        ended = state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED")
        run_s = float(end - start) if ended and start and end and end >= start else None
        return Job(
            state, 128 + signal if signal and not rc else rc, str(info.get("state_reason") or ""), run_s
        )

    def cancel(self, job_id: str) -> None:
        self.rest.answer("DELETE", f"{self.base}/job/{job_id}")


def parse_job(text: str) -> dict[str, str]:
    """``scontrol show job -o ID``: one line of Key=Value pairs (values without spaces, except the
    last fields, which we do not read)."""
    out: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in out:
            out[key] = value
    return out


def exit_code(field: str) -> int | None:
    """``ExitCode=1:0`` -> 1; killed by signal N (``0:9``) -> 128+N, as a shell reports it."""
    code, _, signal = field.partition(":")
    try:
        rc, sig = int(code), int(signal or 0)
    except ValueError:
        return None
    return 128 + sig if sig and not rc else rc


def _run_s(text: str) -> float | None:
    """RunTime=HH:MM:SS or D-HH:MM:SS, in seconds."""
    days, _, clock = text.rpartition("-")
    parts = clock.split(":")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    h, m, s = (int(p) for p in parts)
    return (int(days) if days.isdigit() else 0) * 86400 + h * 3600 + m * 60 + s


def _number(value: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": value}


def _value(field: object) -> int:
    """A v0.0.40+ number (``{"set": true, "number": N}``) or a bare one; 0 when unset."""
    if isinstance(field, dict):
        return int(field.get("number") or 0) if field.get("set", True) else 0
    return field if isinstance(field, int) and not isinstance(field, bool) else 0
