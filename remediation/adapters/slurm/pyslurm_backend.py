"""SlurmControl over pyslurm (the Slurm C API), an optional extra: ``pip install node-remediation[pyslurm]``.

**Untested.** At start-up it refuses any pairing where pyslurm's release is not the release ``scontrol
--version`` reports. States come from ``node_state_string_complete``, split as ``scontrol show node``
states are.

Why: docs/slurm-releases.md#everything-else
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Literal

from remediation.adapters.slurm.args import check_node_name, check_reason
from remediation.adapters.slurm.parse import NodeRecord
from remediation.hostlist import expand
from remediation.ports.cluster import SlurmNode
from remediation.ports.errors import NotSupported, PermanentError, UnknownNode, error_for_slurm
from remediation.settings import SlurmSettings

_RELEASE = re.compile(r"^(\d+)\.(\d+)")
_ACTIVE_JOB_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED"})


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


def check_release(pyslurm_version: str, slurm: tuple[int, ...]) -> None:
    """Refuse a pyslurm that is not built for this Slurm release (major.minor must be equal)."""
    found = _RELEASE.match(str(pyslurm_version))
    if found is None:
        raise PyslurmUnavailable(f"cannot tell which Slurm pyslurm {pyslurm_version!r} is built for")
    built_for = (int(found.group(1)), int(found.group(2)))
    if built_for != tuple(slurm[:2]):
        raise PyslurmUnavailable(
            f"slurm.backend=pyslurm: pyslurm {pyslurm_version} is built for Slurm "
            f"{built_for[0]}.{built_for[1]:02d}, but this Slurm is {slurm[0]}.{slurm[1]:02d}. pyslurm only "
            "works with the Slurm release it was built for: this one needs Slurm "
            f"{built_for[0]}.{built_for[1]:02d}, or a pyslurm built for {slurm[0]}.{slurm[1]:02d} (and this "
            "backend is untested: no matching Slurm could be installed); choose slurm.backend=cli or rest."
        )


class PyslurmSlurm:
    """The ``pyslurm`` backend. Untested: no matching Slurm could be installed (see the module docstring)."""

    def __init__(self, settings: SlurmSettings) -> None:
        self.settings = settings
        self.pyslurm = load_pyslurm()
        # The Slurm release, from the same commands the cli backend runs (slurm.scontrol, SLURM_CONF).
        from remediation.adapters.slurm.cli import CliSlurm

        check_release(getattr(self.pyslurm, "__version__", "unknown"), CliSlurm(settings).version)

    def snapshot(self) -> dict[str, NodeRecord]:
        nodes = self._call(lambda: self.pyslurm.Nodes.load())
        values = nodes.values() if hasattr(nodes, "values") else nodes
        return {node.name: _status(node) for node in values}

    def poll(self) -> dict[str, NodeRecord] | None:
        return self.snapshot()

    def list_nodes(self) -> list[SlurmNode]:
        return [s.to_slurm_node() for s in self.snapshot().values()]

    def get_node(self, name: str) -> SlurmNode:
        check_node_name(name)
        return _status(self._call(lambda: self.pyslurm.Node.load(name), name)).to_slurm_node()

    def running_jobs(self, name: str) -> int:
        return len(self.jobs_on(name))

    def jobs_on(self, name: str) -> list[str]:
        check_node_name(name)
        self.get_node(name)
        jobs = self._call(lambda: self.pyslurm.Jobs.load())
        found: set[str] = set()
        for job in jobs.values() if hasattr(jobs, "values") else jobs:
            if str(job.state).upper() in _ACTIVE_JOB_STATES and name in expand(job.allocated_nodes or ""):
                found.add(str(job.id))
        return sorted(found)

    def requeue_jobs(self, job_ids: list[str]) -> None:
        raise NotSupported("job requeue is not implemented for the pyslurm backend; use the cli backend")

    def cancel_jobs(self, job_ids: list[str]) -> None:
        raise NotSupported("job cancellation is not implemented for the pyslurm backend; use the cli backend")

    def signal_jobs(self, job_ids: list[str], signal: str, scope: Literal["batch", "full"]) -> None:
        raise NotSupported(
            "signalling a job is not implemented for the pyslurm backend; a checkpoint request "
            "(workflow.checkpoint_signal) needs the cli backend"
        )

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
            raise error_for_slurm(f"pyslurm: {message}") from None


def _status(node: Any) -> NodeRecord:
    parts = [p for p in str(node.state or "UNKNOWN").upper().split("+") if p]
    return NodeRecord(
        name=node.name,
        state=parts[0] if parts else "UNKNOWN",
        flags=frozenset(parts[1:]),
        reason=node.reason or "",
        reason_user=node.reason_user or None,
        reason_changed_at=int(node.reason_time or 0),
        slurmd_start_time=int(node.slurmd_start_time or 0),
        partitions=tuple(getattr(node, "partitions", None) or ()),
        features=tuple(getattr(node, "available_features", None) or ()),
    )
