"""The validation through Slurm itself: a maintenance reservation only the service's user may use.

:class:`SlurmValidator` reserves the node (or every node of a check across a domain), resumes it, submits
one check job into the reservation, polls it, then drains the nodes again and only then deletes the
reservation. Each step looks before it acts, so a worker killed anywhere resumes without submitting twice. I/O goes through
:mod:`remediation.adapters.slurm.validator_io`.

Why: docs/policy.md#validate-before-return-a-gpu-validation-validationbackend-default-none
"""

from __future__ import annotations

import getpass
import json
import logging
import math
import re
from pathlib import Path
from typing import Any

from remediation.adapters.slurm.args import InvalidSlurmArgument, check_job_id, check_node_name
from remediation.adapters.slurm.parse import NodeRecord
from remediation.adapters.slurm.validator_io import Submission, exit_code, parse_job, validator_io
from remediation.hostlist import HostlistError, expand
from remediation.ports.errors import ConfigError
from remediation.settings import SlurmSettings, ValidationSettings
from remediation.validation.port import Backend, ValidationCheck, ValidationResult, output_limit
from remediation.validation.settings import loose_mode, loose_mode_message

__all__ = ["EXEC_SCRIPT", "SlurmValidator", "exit_code", "parse_job"]

EXEC_SCRIPT = "nr-gate-exec.sh"
_SCRIPT = """#!/bin/sh
# node-remediation validation: runs the configured check, which arrives as this script's arguments
# (an argument list: nothing here is parsed by a shell), and records its exit code last.
"$@"
rc=$?
echo "nr-gate-exit: $rc"
exit $rc
"""
log = logging.getLogger(__name__)
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_EXIT_MARK = re.compile(r"^nr-gate-exit: (\d+)\s*$", re.MULTILINE)
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"})


class SlurmValidator:
    backend: str = Backend.SLURM

    def __init__(self, slurm: SlurmSettings, validation: ValidationSettings, prefix: str = "remediation:") -> None:
        self.io = validator_io(slurm)
        self.nodes = self.io.nodes
        self.slurm = slurm
        self.cfg = validation
        # The reservation's user is the one the check job runs as: through slurmrestd, the token's.
        self.user = validation.slurm_user or self.io.job_user or getpass.getuser()
        self.workdir = Path(validation.slurm_workdir)
        self.prefix = prefix

    def close(self) -> None:
        """Close the connection to slurmrestd, when the checks go through it."""
        self.io.close()

    # --------------------------------------------------------------------------------- the port

    def _held(self, node: NodeRecord) -> bool:
        """Kept out of service where only the reservation may open it: drained (by us or a human), or
        DOWN and ours (Slurm's own reboot leaves the node DOWN until we return it)."""
        slurm_node = node.to_slurm_node()
        return "DRAIN" in node.flags or (node.state == "DOWN" and slurm_node.reason_is_ours(self.prefix))

    def start(self, check: ValidationCheck) -> dict[str, Any]:
        """One reservation over every node of the check, each held node resumed into it (its prior state
        recorded first), and one job over them all."""
        name, nodes = self._name(check.name), tuple(check_node_name(n) for n in check.targets)
        self._prepare()
        if not self.io.reservation_exists(name):
            self.io.create_reservation(name, nodes, self.user)
        state_file = self.workdir / f"{name}.state.json"
        if not state_file.exists():
            state_file.write_text(json.dumps(self._priors(nodes, several=bool(check.nodes))))
        for node in nodes:
            if self._held(self.nodes.status(node)):
                self.nodes.resume(node)
        job = self._ours(name, nodes)
        if job is None:
            job = self.io.submit(Submission(
                name=name, nodes=nodes, minutes=max(1, math.ceil(check.timeout_s / 60)),
                output=self.workdir / f"{name}.out", workdir=self.workdir, script=self.workdir / EXEC_SCRIPT,
                command=tuple(check.command), partition=self.cfg.slurm_partition or None,
            ))
        spans = {"nodes": list(nodes)} if check.nodes else {}
        limit = {"output_bytes": check.output_bytes} if check.output_bytes else {}
        return {"reservation": name, "job_id": job, "output": str(self.workdir / f"{name}.out"),
                "user": self.user, **spans, **limit}

    def _priors(self, nodes: tuple[str, ...], *, several: bool) -> dict[str, Any]:
        """Whether each node was held, and why, before the check: what ``finish`` puts back. A check on
        one node keeps the record it always had (a check started before an upgrade reads it back)."""
        priors = {}
        for node in nodes:
            current = self.nodes.status(node)
            priors[node] = {"drained": self._held(current), "reason": current.reason}
        return {"nodes": priors} if several else priors[nodes[0]]

    def _ours(self, name: str, nodes: tuple[str, ...]) -> str | None:
        """The newest job of ``name`` that is this check's (a worker killed after sbatch, before the step
        recorded the id): run as our user, in our reservation, on every one of the nodes. Any other job
        of the name is someone else's and is never taken for the check (its verdict would return them)."""
        ours = []
        for job in self.io.jobs_named(name):
            if job.user == self.user and job.reservation == name and set(nodes) <= set(_nodes(job.nodes)):
                ours.append(job.job_id)
            else:
                log.warning("job %s named %s is not this check's (user %r, reservation %r, nodes %r): not "
                            "taken for it", job.job_id, name, job.user, job.reservation, job.nodes)
        return max(ours, key=_order) if ours else None

    def poll(self, ref: dict[str, Any]) -> ValidationResult:
        name, job_id, _ = self._read_back(ref)
        job = self.io.job(job_id)
        output = self._output(name, output_limit(ref, self.cfg.output_bytes))
        if job is None:  # slurmctld forgot it (MinJobAge): the script's own last line tells
            mark = _EXIT_MARK.findall(output)
            return ValidationResult(done=True, exit_code=int(mark[-1]) if mark else None, output=output,
                              state="COMPLETED" if mark else "GONE")
        if job.state in ACTIVE:
            waiting = job.reason if job.state == "PENDING" and job.reason not in ("None", "") else ""
            return ValidationResult(done=False, state=job.state, output=output, waiting=waiting)
        code = job.exit_code
        if job.state in ("CANCELLED", "NODE_FAIL", "BOOT_FAIL", "PREEMPTED"):
            code = None  # the check did not run to its end: no verdict on the GPUs
        return ValidationResult(done=True, exit_code=code, output=output, state=job.state,
                          timed_out=job.state in ("TIMEOUT", "DEADLINE"), run_s=job.run_s)

    def finish(self, ref: dict[str, Any]) -> str:
        name, job_id, nodes = self._read_back(ref)
        notes = []
        job = self.io.job(job_id)
        if job is not None and job.state in ACTIVE:
            self.io.cancel(job_id)
            notes.append(f"cancelled check job {job_id}")
        state_file = self.workdir / f"{name}.state.json"
        recorded = json.loads(state_file.read_text()) if state_file.exists() else {}
        for node in nodes:
            prior = recorded["nodes"].get(node) if "nodes" in recorded else recorded
            note = self._put_back(node, prior or {"drained": True, "reason": ""}, name)
            if note:
                notes.append(note if len(nodes) == 1 else f"{node}: {note}")
        if self.io.reservation_exists(name):
            self.io.delete_reservation(name)
        notes.append(f"reservation {name} deleted")
        state_file.unlink(missing_ok=True)
        return "; ".join(notes)

    # -------------------------------------------------------------------------------- internals

    def _put_back(self, node: str, prior: dict[str, Any], name: str) -> str:
        """Drain ``node`` again if it was held before the check, unless a human drained it meanwhile."""
        current = self.nodes.status(node)
        if "DRAIN" in current.flags and current.reason != prior.get("reason"):
            return f"left the drain someone placed meanwhile ({current.reason!r})"
        if prior.get("drained"):
            reason = str(prior.get("reason") or f"{self.prefix} validation {name}")
            self.nodes.drain(node, reason)
            return f"drained again ({reason!r})"
        return ""

    def _name(self, name: object) -> str:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidSlurmArgument(f"invalid check name {name!r:.80}: expected lower-case letters, digits "
                                       "and '-', at most 63")
        return name

    def _read_back(self, ref: dict[str, Any]) -> tuple[str, str, tuple[str, ...]]:
        """The reservation, job id and nodes of a started check, as the step row kept them, each checked
        before it goes into an argv or a path: a row is data, and a planted ``--all`` must not reach scancel."""
        several = ref.get("nodes")
        if several is not None and (not isinstance(several, list) or not several):
            raise InvalidSlurmArgument(f"invalid node list {several!r:.80} of a check across nodes")
        nodes = tuple(check_node_name(n) for n in several) if several else (check_node_name(ref.get("node")),)
        return self._name(ref.get("reservation")), check_job_id(ref.get("job_id")), nodes

    def _prepare(self) -> None:
        try:
            self.workdir.mkdir(mode=0o755, parents=True, exist_ok=True)
            if (mode := loose_mode(str(self.workdir))) is not None:  # loosened since the start-up check
                raise ConfigError(f"validation.slurm_workdir: {loose_mode_message(str(self.workdir), mode)}",
                                  component="validation")
            script = self.workdir / EXEC_SCRIPT
            if not script.exists() or script.read_text() != _SCRIPT:
                script.write_text(_SCRIPT)
                script.chmod(0o755)
        except OSError as exc:
            raise ConfigError(f"validation.slurm_workdir {self.workdir}: {exc.strerror or exc}",
                              component="validation") from None

    def _output(self, name: str, limit: int) -> str:
        path = self.workdir / f"{name}.out"  # where the job was told to write it; the stored path is not trusted
        try:
            with path.open("rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                fh.seek(max(0, size - limit))
                return fh.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""
        except OSError as exc:
            return f"(output {path} not readable here: {exc.strerror or exc})"


def _nodes(hostlist: str) -> list[str]:
    try:
        return expand(hostlist)
    except HostlistError:
        return []


def _order(job_id: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.split(r"[_+]", job_id))
