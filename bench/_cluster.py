"""A throwaway real Slurm for the benchmarks: scripts/slurm-up.sh in a temp dir, on leased ports.

``release`` "22.05" is the host's Slurm; "24.11" and "26.05" run the roots scripts/slurm-root.sh builds (and caches)
with chroot, its commands reached through the wrappers the yielded environment puts first on PATH.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.ports import lease

ROOT = Path(__file__).resolve().parents[1]


RELEASES = ("22.05", "24.11", "26.05")


def slurm_root(release: str) -> str | None:
    """None for the host's Slurm; else the cached root of ``release`` (built now if missing)."""
    if release == "22.05":
        return None
    if release not in RELEASES:
        raise ValueError(f"no Slurm {release} to run (know {', '.join(RELEASES)})")
    built = subprocess.run(  # noqa: S603 - our own script, fixed argv
        ["bash", str(ROOT / "scripts" / "slurm-root.sh"), release], capture_output=True, text=True
    )
    if built.returncode != 0:
        raise RuntimeError(f"scripts/slurm-root.sh failed:\n{built.stdout}\n{built.stderr}")
    return built.stdout.strip().splitlines()[-1]


@contextmanager
def slurm_cluster(nodes: int, release: str = "22.05") -> Iterator[dict[str, str]]:
    """Yield the environment (with SLURM_CONF, and PATH reaching the release's commands) of a fresh
    cluster of ``nodes`` slurmd nodes."""
    root = slurm_root(release)
    with tempfile.TemporaryDirectory(prefix="slurm-bench-") as directory, lease(1 + nodes) as ports:
        env = dict(os.environ)
        if root is not None:
            env["SLURM_CI_ROOT"] = root
        env.update(
            SLURM_CI_DIR=directory,
            SLURM_CI_NODES=str(nodes),
            SLURM_CI_CTLD_PORT=str(ports.port),  # then one port per slurmd, held until slurm-down.sh
            SLURM_CI_PORT_BASE=str(ports.port + 1),
            SLURM_CI_REST="0",
        )
        env["SLURM_CONF"] = str(Path(directory) / "slurm.conf")
        try:
            up = subprocess.run(  # noqa: S603 - our own script, fixed argv
                ["bash", str(ROOT / "scripts" / "slurm-up.sh")], env=env, capture_output=True, text=True
            )
            if up.returncode != 0:
                raise RuntimeError(f"scripts/slurm-up.sh failed:\n{up.stdout}\n{up.stderr}")
            if root is not None:
                env["PATH"] = f"{Path(directory) / 'bin'}{os.pathsep}{env.get('PATH', '')}"
            yield env
        finally:
            subprocess.run(  # noqa: S603
                ["bash", str(ROOT / "scripts" / "slurm-down.sh")], env=env, capture_output=True
            )
