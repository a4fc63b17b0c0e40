"""A throwaway real Slurm for the benchmarks: scripts/slurm-up.sh in a temp dir, on free ports."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_port_range(count: int) -> int:
    """A base port with ``count`` free ports after it (a slurmd per node)."""
    for _ in range(200):
        base = random.randint(20000, 39000)
        sockets = []
        try:
            for port in range(base, base + count):
                sockets.append(socket.socket())
                sockets[-1].bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
        return base
    raise RuntimeError("no free port range for slurmd")


@contextmanager
def slurm_cluster(nodes: int) -> Iterator[dict[str, str]]:
    """Yield the environment (with SLURM_CONF) of a fresh cluster of ``nodes`` slurmd nodes."""
    with tempfile.TemporaryDirectory(prefix="slurm-bench-") as directory:
        env = dict(os.environ)
        env.update(
            SLURM_CI_DIR=directory,
            SLURM_CI_NODES=str(nodes),
            SLURM_CI_CTLD_PORT=str(_free_port()),
            SLURM_CI_PORT_BASE=str(_free_port_range(nodes)),
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
