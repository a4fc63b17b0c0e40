"""SlurmControl over the Slurm commands: ``sinfo --json`` to read, ``scontrol update`` to write.

Every command is an argument list run without a shell, so nothing in a node name or reason is ever
interpreted by one. Names and reasons are still checked first (:mod:`slurm_args`), because Slurm
itself interprets some of them: ``nodename=`` takes a hostlist (``ALL`` is every node), and scontrol
strips one leading and one trailing double quote from ``reason=``. We therefore always wrap the reason
in quotes, so that exactly what we pass is what Slurm stores.

Slurm's messages are mapped to typed errors, keeping its text:

- "Invalid node name specified" / "Node X not found" -> :class:`UnknownNode`;
- "Unable to contact slurm controller", socket timeouts, a command timeout -> :class:`TransientError`;
- everything else -> :class:`PermanentError`.

``sinfo --json`` in 22.05 exits 0 when slurmctld is unreachable and prints an ``errors`` entry
"Unspecified error" with no nodes; that is a transient error here, never "the cluster has no nodes".
It also ignores ``-n``, so one node is read with ``scontrol show node -o NAME``.
"""

from __future__ import annotations

import os
import subprocess
import threading
from typing import Literal

from remediation.errors import PermanentError, TransientError, UnknownNode
from remediation.interfaces import SlurmNode
from remediation.settings import SlurmSettings
from remediation.slurm_json import (
    NodesParser,
    NodeStatus,
    SlurmFormatError,
    SlurmReportedError,
    parse_scontrol_nodes,
)
from workers.adapters.slurm_args import check_node_name, check_reason

_TRANSIENT = (
    "unable to contact slurm controller",
    "connection refused",
    "socket timed out",
    "zero bytes were transmitted",
    "communication connection failure",
    "resource temporarily unavailable",
    "slurm backup controller in standby mode",
    "unspecified error",  # what sinfo --json reports for an unreachable controller
)
_UNKNOWN = ("invalid node name", "not found")
_ALREADY_RESUMED = "invalid node state specified"

#: Job states that still hold a node's resources: running, completing, configuring, suspended, stopped.
JOB_STATES = "R,CG,CF,S,ST"


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

    # ----------------------------------------------------------------------------------- reads

    def snapshot(self) -> dict[str, NodeStatus]:
        """Every node, as the watcher wants it (memoised parse, see :class:`NodesParser`)."""
        out = self._run([self.settings.sinfo, "--json"])
        try:
            with self._parser_lock:
                return self._parser.parse(out)
        except SlurmReportedError as exc:
            raise _classify(str(exc), "sinfo --json") from None
        except SlurmFormatError as exc:
            raise SlurmCommandError(f"sinfo --json printed something unexpected: {exc}") from None

    def poll(self) -> dict[str, NodeStatus] | None:
        """Watcher hook; sinfo cannot tell "unchanged", so every poll is a full read."""
        return self.snapshot()

    def list_nodes(self) -> list[SlurmNode]:
        return [status.to_slurm_node() for status in self.snapshot().values()]

    def status(self, name: str) -> NodeStatus:
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

    def running_jobs(self, name: str) -> int:
        check_node_name(name)
        out = self._run([self.settings.squeue, "-h", "-w", name, "-t", JOB_STATES, "-o", "%i"])
        return len({line.strip() for line in out.splitlines() if line.strip()})

    # ---------------------------------------------------------------------------------- writes

    def drain(self, name: str, reason: str) -> None:
        check_node_name(name)
        check_reason(reason)
        current = self.status(name)
        if "DRAIN" in current.flags and current.reason == reason:
            return  # already done; re-draining would restamp the reason time and look like news
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
            if _ALREADY_RESUMED not in exc.message.lower():
                raise
            # Slurm refuses to resume a node that is already in service; that is our goal reached.
            # Any other refusal (a node still DOWN, say) is passed on.
            current = self.status(name)
            if current.states & {"DRAIN", "DOWN", "FAIL"}:
                raise SlurmCommandError(
                    f"Slurm refused to resume {name} ({'+'.join(sorted(current.states))}): {exc.message}"
                ) from None

    # ------------------------------------------------------------------------------- internals

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
            raise PermanentError(f"cannot run {argv[0]}: {exc}") from None
        # Reasons are whatever humans typed; one undecodable byte must not blind the watcher.
        stdout = proc.stdout.decode("utf-8", "replace")
        if proc.returncode != 0:
            message = (proc.stderr.decode("utf-8", "replace").strip() or stdout.strip())[:2000]
            raise _classify(message or f"exit status {proc.returncode}", what)
        return stdout


def _classify(message: str, what: str) -> PermanentError | TransientError:
    lowered = message.lower()
    if any(marker in lowered for marker in _TRANSIENT):
        return TransientError(f"{what}: {message}")
    if any(marker in lowered for marker in _UNKNOWN):
        return UnknownNode(f"{what}: {message}")
    return SlurmCommandError(f"{what}: {message}")
