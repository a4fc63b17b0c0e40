"""Pick the Slurm backend named by ``slurm.backend``, the way a mail backend is picked from config.

Each backend is imported only when chosen, so a site without pyslurm or slurmrestd never imports
them, and a backend that cannot work here (pyslurm missing) fails at start-up with its own message.
"""

from __future__ import annotations

from typing import Any

from remediation.interfaces import SlurmControl
from remediation.settings import Settings


def make_slurm(settings: Settings, *, world: Any = None, recorder: Any = None) -> SlurmControl:
    """The SlurmControl ``slurm.backend`` names. Dry-run wrapping (NoopSlurm reading through the real
    backend) is left to the caller that assembles all adapters, so it happens exactly once."""
    backend = settings.slurm.backend
    if backend == "cli":
        from workers.adapters.slurm_cli import CliSlurm

        return CliSlurm(settings.slurm)
    if backend == "rest":
        from workers.adapters.slurm_rest import RestSlurm

        return RestSlurm(settings.slurm)
    if backend == "pyslurm":
        from workers.adapters.slurm_pyslurm import PyslurmSlurm

        return PyslurmSlurm(settings.slurm)
    if backend == "noop":
        from remediation.adapters.noop import NoopSlurm

        return NoopSlurm(recorder=recorder)
    if backend == "memory":
        from remediation.adapters.memory import MemorySlurm

        return MemorySlurm(world if world is not None else _shared_world(settings))
    raise ValueError(f"unknown slurm.backend {backend!r}")  # unreachable: settings validate it


def _shared_world(settings: Settings) -> Any:
    """The process's simulated world (or the journal file named by sim.journal), shared with the
    workers and watchers of this deployment."""
    from workers.adapters.factory import make_world

    return make_world(settings)
