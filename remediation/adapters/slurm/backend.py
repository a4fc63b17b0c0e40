"""Build the real Slurm backend named by ``slurm.backend``: scontrol argv, slurmrestd or pyslurm.

Each backend is imported only when chosen, so a site without pyslurm or slurmrestd never imports
them, and a backend that cannot work here (pyslurm missing) fails at start-up with its own message.

Why: docs/running.md#slurm-releases-and-backends
"""

from __future__ import annotations

from remediation.ports.cluster import SlurmControl
from remediation.settings import Settings


def make_slurm(settings: Settings) -> SlurmControl:
    """The real SlurmControl ``slurm.backend`` names (cli, rest or pyslurm). The simulated and no-op
    backends and dry-run wrapping belong to :mod:`remediation.adapters.factory`."""
    backend = settings.slurm.backend
    if backend == "cli":
        from remediation.adapters.slurm.merged import MergedSlurm

        return MergedSlurm(settings.slurm)  # CliSlurm, with concurrent per-node calls merged
    if backend == "rest":
        from remediation.adapters.slurm.rest import RestSlurm

        return RestSlurm(settings.slurm)
    if backend == "pyslurm":
        from remediation.adapters.slurm.pyslurm_backend import PyslurmSlurm

        return PyslurmSlurm(settings.slurm)
    raise ValueError(f"{backend!r} is not a real Slurm backend (see remediation.adapters.factory)")


def close_slurm(slurm: SlurmControl) -> None:
    """Release what a backend holds between calls: slurmrestd's connection pool (the commands and
    pyslurm hold nothing). For whoever built the backend and is done with it."""
    close = getattr(slurm, "close", None)
    if callable(close):
        close()
