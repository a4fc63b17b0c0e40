"""SlurmControl over pyslurm (the Slurm C API), an optional extra: ``pip install node-remediation[pyslurm]``.

pyslurm is built against one Slurm release (pyslurm 25.11.x needs Slurm 25.11's libslurm), and PyPI
has no release for older Slurm such as Debian's 22.05. The import is therefore lazy and checked when
the backend is constructed: a site that selects ``pyslurm`` without a matching pyslurm gets a clear
start-up error instead of a crash on the first remediation.

State strings come from Slurm's own ``node_state_string_complete`` (``IDLE+DRAIN``), the same form as
``scontrol show node``, so they are split the same way.
"""

from __future__ import annotations

import importlib
from typing import Any, Literal

from remediation.errors import PermanentError, TransientError, UnknownNode
from remediation.hostlist import expand
from remediation.interfaces import SlurmNode
from remediation.settings import SlurmSettings
from remediation.slurm_json import NodeStatus
from workers.adapters.slurm_args import check_node_name, check_reason

_ACTIVE_JOB_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED"})
_TRANSIENT = ("unable to contact slurm controller", "socket timed out", "connection refused")


class PyslurmUnavailable(PermanentError):
    """pyslurm cannot be imported here, or does not match the installed Slurm."""


def load_pyslurm() -> Any:
    try:
        return importlib.import_module("pyslurm")
    except Exception as exc:  # ImportError, or an OSError from a libslurm of another version
        raise PyslurmUnavailable(
            "slurm.backend=pyslurm, but pyslurm is not installed / does not match this Slurm "
            f"({type(exc).__name__}: {exc}). Install the pyslurm release built for your Slurm "
            "version, or choose slurm.backend=cli."
        ) from exc


class PyslurmSlurm:
    """The ``pyslurm`` backend."""

    def __init__(self, settings: SlurmSettings) -> None:
        self.settings = settings
        self.pyslurm = load_pyslurm()

    def snapshot(self) -> dict[str, NodeStatus]:
        nodes = self._call(lambda: self.pyslurm.Nodes.load())
        values = nodes.values() if hasattr(nodes, "values") else nodes
        return {node.name: _status(node) for node in values}

    def poll(self) -> dict[str, NodeStatus] | None:
        return self.snapshot()

    def list_nodes(self) -> list[SlurmNode]:
        return [s.to_slurm_node() for s in self.snapshot().values()]

    def get_node(self, name: str) -> SlurmNode:
        check_node_name(name)
        return _status(self._call(lambda: self.pyslurm.Node.load(name), name)).to_slurm_node()

    def running_jobs(self, name: str) -> int:
        check_node_name(name)
        self.get_node(name)
        jobs = self._call(lambda: self.pyslurm.Jobs.load())
        count = 0
        for job in jobs.values() if hasattr(jobs, "values") else jobs:
            if str(job.state).upper() in _ACTIVE_JOB_STATES and name in expand(job.allocated_nodes or ""):
                count += 1
        return count

    def drain(self, name: str, reason: str) -> None:
        self._modify(name, state="DRAIN", reason=check_reason(reason))

    def set_state(self, name: str, state: Literal["DOWN", "FAIL"], reason: str) -> None:
        if state not in ("DOWN", "FAIL"):
            raise PermanentError(f"set_state supports DOWN and FAIL, not {state!r}")
        self._modify(name, state=state, reason=check_reason(reason))

    def resume(self, name: str) -> None:
        check_node_name(name)
        current = self.get_node(name)
        if not current.states & {"DRAIN", "DOWN", "FAIL"}:
            return  # already in service; Slurm would refuse with "Invalid node state specified"
        self._modify(name, state="RESUME")

    def _modify(self, name: str, **changes: str) -> None:
        check_node_name(name)
        node = self._call(lambda: self.pyslurm.Node.load(name), name)
        self._call(lambda: node.modify(self.pyslurm.Node(**changes)), name)

    def _call(self, fn: Any, name: str | None = None) -> Any:
        try:
            return fn()
        except self.pyslurm.RPCError as exc:
            message = str(exc)
            lowered = message.lower()
            if name is not None and ("does not exist" in lowered or "invalid node name" in lowered):
                raise UnknownNode(f"pyslurm: {message}") from None
            if any(marker in lowered for marker in _TRANSIENT):
                raise TransientError(f"pyslurm: {message}") from None
            raise PermanentError(f"pyslurm: {message}") from None


def _status(node: Any) -> NodeStatus:
    parts = [p for p in str(node.state or "UNKNOWN").upper().split("+") if p]
    return NodeStatus(
        name=node.name,
        state=parts[0] if parts else "UNKNOWN",
        flags=frozenset(parts[1:]),
        reason=node.reason or "",
        reason_user=node.reason_user or None,
        reason_changed_at=int(node.reason_time or 0),
        slurmd_start_time=int(node.slurmd_start_time or 0),
    )
