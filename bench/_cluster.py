"""A throwaway real Slurm for the benchmarks: scripts/slurm-up.sh in a temp dir, on free ports."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.ports import free_port, free_port_range

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def slurm_cluster(nodes: int) -> Iterator[dict[str, str]]:
    """Yield the environment (with SLURM_CONF) of a fresh cluster of ``nodes`` slurmd nodes."""
    with tempfile.TemporaryDirectory(prefix="slurm-bench-") as directory:
        env = dict(os.environ)
        env.update(
            SLURM_CI_DIR=directory,
            SLURM_CI_NODES=str(nodes),
            SLURM_CI_CTLD_PORT=str(free_port()),
            SLURM_CI_PORT_BASE=str(free_port_range(nodes)),
            SLURM_CI_REST="0",
        )
        env["SLURM_CONF"] = str(Path(directory) / "slurm.conf")
        try:
            up = subprocess.run(  # noqa: S603 - our own script, fixed argv
                ["bash", str(ROOT / "scripts" / "slurm-up.sh")], env=env, capture_output=True, text=True
            )
            if up.returncode != 0:
                raise RuntimeError(f"scripts/slurm-up.sh failed:\n{up.stdout}\n{up.stderr}")
            yield env
        finally:
            subprocess.run(  # noqa: S603
                ["bash", str(ROOT / "scripts" / "slurm-down.sh")], env=env, capture_output=True
            )
