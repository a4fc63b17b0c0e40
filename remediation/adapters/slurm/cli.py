"""SlurmControl over the Slurm commands: ``sinfo --json`` or ``scontrol show node --json`` to read (by the
version ``scontrol --version`` reports), ``scontrol update`` to write, ``scontrol show node -o NAME`` for
one node.

Every command is an argument list run without a shell; names and reasons are checked first
(:mod:`slurm_args`) and the reason is always quoted. Slurm's messages map to typed errors through the one
Slurm table in :mod:`remediation.ports.errors`.

Why: docs/slurm-releases.md#the-cli-backend
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Iterable
from typing import Literal

from remediation.adapters.slurm.args import (
    check_job_id,
    check_node_name,
    check_reason,
    check_signal,
    whole_job,
)
from remediation.adapters.slurm.delta import DeltaReader
from remediation.adapters.slurm.parse import (
    NodeRecord,
    NodesParser,
    SlurmFormatError,
    SlurmReportedError,
    parse_scontrol_nodes,
)
from remediation.adapters.slurm.probe import NodeTableProbe
from remediation.domain.topology import Switch, parse_topology
from remediation.hostlist import expand
from remediation.ports.cluster import SlurmNode
from remediation.ports.errors import (
    ConfigError,
    PermanentError,
    RemediationError,
    TransientError,
    UnknownNode,
    error_for_slurm,
)
from remediation.settings import SlurmSettings

#: slurmctld's refusal to resume a node already in service: 22.05 and 24.11 say "Invalid node state
#: specified" (errno 2028), 26.05 "Invalid node state transition" (errno 2180).
_ALREADY_RESUMED = ("invalid node state specified", "invalid node state transition")
#: What scontrol requeue / scancel say about a job that has already ended.
_JOB_GONE = (
    "already completing or completed",
    "job has already finished",
    "invalid job id",
    "job is no longer",
)

#: Job states that still hold a node's resources: running, completing, configuring, suspended, stopped.
JOB_STATES = "R,CG,CF,S,ST"
#: The first release whose ``sinfo --json`` no longer lists node objects (read ``scontrol show node --json``).
SCONTROL_JSON_FROM = (23, 2)
_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def parse_version(text: str) -> tuple[int, int, int]:
    """``slurm 22.05.8`` / ``slurm-wlm 24.11.5`` -> (22, 5, 8)."""
    match = _VERSION.search(text)
    if match is None:
        raise SlurmCommandError(f"cannot tell the Slurm version from {text.strip()[:100]!r}")
    major, minor, micro = (int(p) for p in match.groups())
    return major, minor, micro


class SlurmCommandError(PermanentError):
    """A Slurm command failed for a reason retrying will not fix; carries the command's stderr."""


class CliSlurm:
    """The ``cli`` backend (default)."""

    def __init__(self, settings: SlurmSettings) -> None:
        self.settings = settings
        self.timeout = settings.command_timeout_s
        self.env = dict(os.environ)
        if settings.slurm_conf:
            self.env["SLURM_CONF"] = settings.slurm_conf
        self._parser = NodesParser()
        self._parser_lock = threading.Lock()
        self._version: tuple[int, int, int] | None = None

    @property
    def version(self) -> tuple[int, int, int]:
        """The Slurm release of the configured commands, asked once (``scontrol --version``)."""
        if self._version is None:
            self._version = parse_version(self._run([self.settings.scontrol, "--version"]))
        return self._version

    # ----------------------------------------------------------------------------------- reads

    def snapshot(self) -> dict[str, NodeRecord]:
        """Every node, as the watcher wants it (memoised parse, see :class:`NodesParser`)."""
        if self.version[:2] >= SCONTROL_JSON_FROM:
            argv = [self.settings.scontrol, "show", "node", "--json"]
        else:
            argv = [self.settings.sinfo, "--json"]
        what = " ".join(argv[1:])
        out = self._run(argv)
        try:
            with self._parser_lock:
                return self._parser.parse(out)
        except SlurmReportedError as exc:
            raise _classify(str(exc), what) from None
        except SlurmFormatError as exc:
            raise SlurmCommandError(f"{what} printed something unexpected: {exc}") from None

    def delta_source(self, bad: Iterable[str]) -> DeltaReader | None:
        """The watcher's reader for ``slurm.read_strategy = delta`` (see remediation.adapters.slurm.delta)."""
        if self.settings.read_strategy != "delta":
            return None
        probe = None
        if self.settings.change_probe:
            probe = NodeTableProbe.open(self.settings.slurm_conf, self.settings.libslurm, self.version)
        return DeltaReader(
            self._run,
            self.settings.sinfo,
            self.settings.scontrol,
            bad=bad,
            probe=probe.changed if probe is not None else None,
        )

    def poll(self) -> dict[str, NodeRecord] | None:
        """Watcher hook; sinfo cannot tell "unchanged", so every poll is a full read."""
        return self.snapshot()

    def list_nodes(self) -> list[SlurmNode]:
        return [status.to_slurm_node() for status in self.snapshot().values()]

    def topology(self) -> list[Switch]:
        """The switches (topology/tree) or blocks (topology/block) ``scontrol show topology`` prints;
        none when no topology plugin is configured (it then says so on stderr, with exit status 0 on
        22.05). Malformed output raises :class:`~remediation.domain.topology.TopologyError`."""
        try:
            out = self._run([self.settings.scontrol, "show", "topology"])
        except RemediationError as exc:
            if "No topology information" in exc.message:
                return []
            raise
        return parse_topology(out)

    def status(self, name: str) -> NodeRecord:
        check_node_name(name)
        out = self._run([self.settings.scontrol, "show", "node", "-o", name])
        try:
            nodes = parse_scontrol_nodes(out)
        except SlurmFormatError as exc:
            raise SlurmCommandError(f"scontrol show node printed something unexpected: {exc}") from None
        if name not in nodes:
            raise UnknownNode(f"Slurm does not know node {name!r}")
        return nodes[name]

    def get_node(self, name: str) -> SlurmNode:
        return self.status(name).to_slurm_node()

    # Several nodes in one command (remediation.adapters.slurm.merged): each name is checked on its own
    # and the list is joined with commas, a list Slurm reads as those nodes and no others.

    def statuses(self, names: list[str]) -> dict[str, NodeRecord]:
        """``scontrol show node -o A,B,...``: the nodes Slurm knows of ``names`` (an unknown one is absent
        when the others are known; Slurm refuses a list of only unknown names)."""
        out = self._run([self.settings.scontrol, "show", "node", "-o", _node_list(names)])
        try:
            nodes = parse_scontrol_nodes(out)
        except SlurmFormatError as exc:
            raise SlurmCommandError(f"scontrol show node printed something unexpected: {exc}") from None
        return {name: nodes[name] for name in names if name in nodes}

    def jobs_by_node(self, names: list[str]) -> dict[str, list[str]]:
        """``squeue -w A,B,...``: each node's jobs that hold it, a job on several of them under each."""
        out = self._run(
            [self.settings.squeue, "-h", "-w", _node_list(names), "-t", JOB_STATES, "-o", "%i %N"]
        )
        jobs: dict[str, set[str]] = {name: set() for name in names}
        for line in out.splitlines():
            job, _, nodes = line.strip().partition(" ")
            for node in expand(nodes.strip()) if job else []:
                if node in jobs:
                    jobs[node].add(job)
        return {name: sorted(held) for name, held in jobs.items()}

    def update_many(self, names: list[str], state: str, reason: str) -> None:
        """``scontrol update nodename=A,B,... state=STATE reason=REASON``: one command for them all."""
        check_reason(reason)
        self._update(_node_list(names), state, reason)

    def running_jobs(self, name: str) -> int:
        return len(self.jobs_on(name))

    def jobs_on(self, name: str) -> list[str]:
        check_node_name(name)
        out = self._run([self.settings.squeue, "-h", "-w", name, "-t", JOB_STATES, "-o", "%i"])
        return sorted({line.strip() for line in out.splitlines() if line.strip()})

    def requeue_jobs(self, job_ids: list[str]) -> None:
        # One call each: one job that already ended must not hide the others.
        for job in dict.fromkeys(whole_job(j) for j in job_ids):
            self._job_command([self.settings.scontrol, "requeue", job])

    def cancel_jobs(self, job_ids: list[str]) -> None:
        for job in dict.fromkeys(whole_job(j) for j in job_ids):
            self._job_command([self.settings.scancel, job])

    def signal_jobs(self, job_ids: list[str], signal: str, scope: Literal["batch", "full"]) -> None:
        """``scancel --signal=SIGNAL --batch|--full JOB``, one call per job (one that already ended
        must not keep the others from their request). The signal name was checked at start-up."""
        flag = {"batch": "--batch", "full": "--full"}[scope]
        for job in job_ids:
            self._job_command([self.settings.scancel, f"--signal={check_signal(signal)}", flag, check_job_id(job)])

    # ---------------------------------------------------------------------------------- writes

    def drain(self, name: str, reason: str) -> None:
        check_node_name(name)
        check_reason(reason)
        current = self.status(name)
        if "DRAIN" in current.flags and current.reason == reason:
            return  # already done; re-draining would restamp the reason time and look like news
        self._set_drain(name, reason)

    def _set_drain(self, name: str, reason: str) -> None:
        self._update(name, "drain", reason)

    def set_state(self, name: str, state: Literal["DOWN", "FAIL"], reason: str) -> None:
        check_node_name(name)
        check_reason(reason)
        if state not in ("DOWN", "FAIL"):
            raise PermanentError(f"set_state supports DOWN and FAIL, not {state!r}")
        current = self.status(name)
        if state in current.states and current.reason == reason:
            return
        self._update(name, state.lower(), reason)

    def resume(self, name: str) -> None:
        check_node_name(name)
        try:
            self._update(name, "resume", None)
        except SlurmCommandError as exc:
            if not any(marker in exc.message.lower() for marker in _ALREADY_RESUMED):
                raise
            # Slurm refuses to resume a node that is already in service; that is our goal reached.
            # Any other refusal (a node still DOWN, say) is passed on.
            current = self.status(name)
            if current.states & {"DRAIN", "DOWN", "FAIL"}:
                raise SlurmCommandError(
                    f"Slurm refused to resume {name} ({'+'.join(sorted(current.states))}): {exc.message}"
                ) from None

    def reboot(self, name: str, reason: str) -> None:
        """``scontrol reboot ASAP nextstate=DOWN reason=REASON NAME``: the cluster's RebootProgram reboots
        the node once no job holds it (ASAP drains it first), and slurmctld keeps it DOWN with the reason
        when it is back. Every call asks again: :mod:`remediation.adapters.slurm.reboot` asks once.
        Unlike ``update``, ``reboot`` keeps quotes in its reason (22.05 and 24.11): none are added."""
        check_node_name(name)
        check_reason(reason)
        self._run([self.settings.scontrol, "reboot", "ASAP", "nextstate=DOWN", f"reason={reason}", name])

    # ------------------------------------------------------------------------------- internals

    def _job_command(self, argv: list[str]) -> None:
        try:
            self._run(argv)
        except SlurmCommandError as exc:
            # The job left between our squeue and this call: what we wanted has happened.
            if not any(m in exc.message.lower() for m in _JOB_GONE):
                raise

    def _update(self, name: str, state: str, reason: str | None) -> None:
        argv = [self.settings.scontrol, "update", f"nodename={name}", f"state={state}"]
        if reason is not None:
            argv.append(f'reason="{reason}"')  # scontrol strips exactly these two quotes
        self._run(argv)

    def _run(self, argv: list[str]) -> str:
        what = " ".join(argv[:2])
        try:
            # An argument list and no shell: nothing in argv is interpreted by anyone but Slurm.
            proc = subprocess.run(  # noqa: S603
                argv,
                capture_output=True,
                env=self.env,
                timeout=self.timeout,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise TransientError(f"{what} timed out after {self.timeout:g}s") from None
        except OSError as exc:  # missing binary, permission denied
            raise ConfigError(f"cannot run {argv[0]}: {exc}", component="slurm") from None
        # Reasons are whatever humans typed; one undecodable byte must not blind the watcher.
        stdout = proc.stdout.decode("utf-8", "replace")
        if proc.returncode != 0:
            message = (proc.stderr.decode("utf-8", "replace").strip() or stdout.strip())[:2000]
            raise _classify(message or f"exit status {proc.returncode}", what)
        return stdout


def _node_list(names: list[str]) -> str:
    for name in names:
        check_node_name(name)
    if not names:
        raise ValueError("no node names")
    return ",".join(names)


def _classify(message: str, what: str) -> RemediationError:
    return error_for_slurm(f"{what}: {message}", node_error=SlurmCommandError)
