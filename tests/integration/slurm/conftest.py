"""A real Slurm 22.05 (slurmctld + one slurmd per node) for the whole test session.

Started once per session with the project's own ``scripts/slurm-up.sh`` in a session temp dir, on
free ports, and torn down with ``scripts/slurm-down.sh``. On a machine without Slurm the script
installs the Debian packages (root needed). Tests talk to it only through real commands; nothing in
these tests stands in for Slurm.

Between tests the cluster is put back: jobs cancelled, killed slurmds restarted, every node resumed
and waited for until IDLE without flags.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from remediation.hostlist import expand
from remediation.settings import SlurmSettings
from remediation.slurm_json import parse_nodes_json
from tests.ports import free_port, free_port_range

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = ROOT / "scripts"
NODES = 4

pytestmark = pytest.mark.slurm


@dataclass
class SlurmCluster:
    dir: Path
    conf: Path
    nodes: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603 - test helper, fixed argv
            list(argv), env=self.env, capture_output=True, text=True, check=check, timeout=timeout
        )

    def scontrol(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("scontrol", *args, check=check)

    def nodes_now(self) -> dict[str, tuple[str, frozenset[str], str]]:
        parsed = parse_nodes_json(self.run("sinfo", "--json").stdout)
        return {n.name: (n.state, n.flags, n.reason) for n in parsed.values()}

    def settings(self, **overrides: object) -> SlurmSettings:
        values: dict[str, object] = {"slurm_conf": str(self.conf)}
        values.update(overrides)
        return SlurmSettings(**values)  # type: ignore[arg-type]

    @property
    def rest_socket(self) -> Path:
        return self.dir / "run" / "slurmrestd.sock"

    def slurmd_pid(self, node: str) -> int | None:
        pidfile = self.dir / "run" / f"slurmd-{node}.pid"
        try:
            pid = int(pidfile.read_text().strip())
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError):
            return None

    def start_slurmd(self, node: str) -> None:
        self.run("slurmd", "-N", node, "-f", str(self.conf))

    def wait_all_idle(self, timeout: float = 40) -> None:
        deadline = time.monotonic() + timeout
        while True:
            now = self.nodes_now()
            if all(state == "IDLE" and not flags for state, flags, _ in now.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"cluster did not return to idle: {now}")
            time.sleep(0.2)

    def restore(self) -> None:
        self.run("scancel", "--quiet", "--full", "-w", ",".join(self.nodes), check=False)
        for node in self.nodes:
            if self.slurmd_pid(node) is None:
                self.start_slurmd(node)
        deadline = time.monotonic() + 60
        while True:
            now = self.nodes_now()
            unhealthy = [n for n, (state, flags, _) in now.items() if flags - {"NOT_RESPONDING"} or state != "IDLE"]
            if unhealthy:
                self.scontrol("update", f"nodename={','.join(unhealthy)}", "state=resume", check=False)
            if all(state == "IDLE" and not flags for state, flags, _ in now.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"cluster did not return to idle: {now}")
            time.sleep(0.3)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    directory = tmp_path_factory.mktemp("slurm")
    env = dict(os.environ)
    env.update(
        SLURM_CI_DIR=str(directory),
        SLURM_CI_NODES=str(NODES),
        SLURM_CI_CTLD_PORT=str(free_port()),
        SLURM_CI_PORT_BASE=str(free_port_range(NODES)),
    )
    up = subprocess.run(  # noqa: S603 - our own script, fixed argv
        ["bash", str(SCRIPTS / "slurm-up.sh")], env=env, capture_output=True, text=True, timeout=600
    )
    if up.returncode != 0:
        subprocess.run(["bash", str(SCRIPTS / "slurm-down.sh")], env=env, capture_output=True)  # noqa: S603
        pytest.fail(f"scripts/slurm-up.sh failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
    conf = directory / "slurm.conf"
    env["SLURM_CONF"] = str(conf)
    cluster = SlurmCluster(directory, conf, expand(f"gpu-node-[0-{NODES - 1}]"), env)
    try:
        yield cluster
    finally:
        subprocess.run(  # noqa: S603
            ["bash", str(SCRIPTS / "slurm-down.sh")], env=env, capture_output=True, timeout=120
        )


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session cluster, restored to all-IDLE after the test."""
    yield slurm_cluster
    slurm_cluster.restore()
