"""Real Slurm clusters (slurmctld + one slurmd per node) for the whole test session: 22.05, 24.11, 26.05.

Each is started once per session with the project's own ``scripts/slurm-up.sh`` in a session temp dir,
on ports leased for the session (tests/ports.py), and torn down with ``scripts/slurm-down.sh``. 22.05
is the host's (Debian 12; the script installs the packages when missing, root needed); 24.11 and 26.05
run from the Debian trixie and sid roots that ``scripts/slurm-root.sh`` builds once and caches, with
chroot: its own directory, ports and munged, and its commands reached through the wrappers in
``DIR/bin`` (``SlurmCluster.slurm_options`` hands their paths to the backends). Tests talk to Slurm only
through real commands; nothing here stands in for it.

Every test in this directory that uses the cluster runs once per version (``pytest_generate_tests``
below), and a module using ``slurm_backend`` once per version and backend (cli, rest); ``SLURM_TEST_VERSIONS=22.05`` narrows a local run, and a module's ``SLURM_RELEASES`` the releases it runs on. Tests elsewhere that borrow the fixture get
22.05 only. The run ends with one line naming the exact versions the tests ran against.

Between tests the cluster is put back: every job cancelled (pending ones too), killed slurmds restarted,
every node resumed and waited for until IDLE without flags and no job is left. ``scripts/slurm-down.sh``
ends whatever a cluster still runs when it stops.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from remediation.adapters.slurm.parse import parse_nodes_json
from remediation.hostlist import expand
from remediation.settings import SlurmSettings
from tests import slurm_versions
from tests.integration.workerproc import wait_for
from tests.pace import within
from tests.ports import lease

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = ROOT / "scripts"
NODES = 4
#: Leaf switches in the topology.conf of ``slurm_topo_cluster`` (gpu-node-[0-1] and gpu-node-[2-3]).
LEAVES = 2
#: ``slurm_block_cluster``: a controller alone (no slurmd; CLOUD nodes) with topology/block, BLOCKS blocks
#: b1..b4 of BLOCK_SIZE nodes each, BlockSizes=BLOCK_SIZE. The releases that have topology/block (24.05+),
#: and the file each is given: 26.05 a topology.yaml (read first since 25.05), 24.11 a topology.conf.
BLOCKS = 4
BLOCK_SIZE = 4
BLOCK_RELEASES = {"24.11": "conf", "26.05": "yaml"}
#: The Slurm releases under test; the first is the one tests outside this directory borrow.
ALL_VERSIONS = ("22.05", "24.11", "26.05")
VERSIONS = tuple(
    v for v in (os.environ.get("SLURM_TEST_VERSIONS") or ",".join(ALL_VERSIONS)).split(",") if v.strip()
)

pytestmark = pytest.mark.slurm


@dataclass
class SlurmCluster:
    dir: Path
    conf: Path
    nodes: list[str]
    env: dict[str, str] = field(default_factory=dict)
    version: str = ""  # as the commands report it, e.g. "24.11.5"
    bin: Path | None = None  # the chroot wrappers of a 24.11/26.05 cluster; None = the host's commands
    backend: str = "cli"  # what slurm_options() selects; set per test by the slurm_backend fixture
    root: Path | None = None  # the chroot of a 24.11/26.05 cluster; None = the host's Slurm

    @property
    def release(self) -> tuple[int, int]:
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)

    @property
    def keeps_reason_on_resume(self) -> bool:
        """22.05 and 26.05 clear a node's reason when it is resumed; 24.11 keeps the last one (seen on
        22.05.8, 24.11.5 and 26.05.5)."""
        return self.release == (24, 11)

    @property
    def resume_refusal(self) -> tuple[str, int]:
        """slurmctld's refusal to resume a node in service, and its errno: 26.05 renamed it."""
        if self.release >= (26, 5):
            return "Invalid node state transition", 2180
        return "Invalid node state specified", 2028

    @property
    def unknown_path(self) -> str:
        """The start of slurmrestd's 404 for a path it does not serve (26.05 mended the grammar)."""
        return "Unable to find requested URL" if self.release >= (26, 5) else "Unable find requested URL"

    def rest_settings(self, api: str, **overrides: object) -> SlurmSettings:
        """Settings of the rest backend on this cluster's slurmrestd (unix socket, rest_auth/local)."""
        return self.settings(**{**self.rest_options(api), **overrides})

    def rest_options(self, api: str) -> dict[str, object]:
        """The rest backend's settings: 26.05's slurmrestd runs as nobody and acts for root with the JWT
        ``scripts/slurm-up.sh`` issued (X-SLURM-USER-*); 22.05's and 24.11's trust the socket's peer."""
        values: dict[str, object] = {"backend": "rest", "rest_url": f"unix:{self.rest_socket}", "rest_api_version": api}
        if self.rest_token_file.exists():
            values.update(rest_user="root", rest_token=self.rest_token_file.read_text().strip())
        return values

    @property
    def rest_token_file(self) -> Path:
        return self.dir / "run" / "slurmrestd.token"

    @property
    def rest_headers(self) -> dict[str, str]:
        """The headers a raw client sends to act as root on this slurmrestd (none where the peer is trusted)."""
        if not self.rest_token_file.exists():
            return {}
        return {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": self.rest_token_file.read_text().strip()}

    @property
    def workdir(self) -> Path:
        """A directory that exists for slurmd too (inside the chroot), for sbatch -D."""
        path = self.dir / "work"
        path.mkdir(exist_ok=True)
        return path

    def slurm_options(self, **overrides: object) -> dict[str, object]:
        """The ``slurm`` settings section reaching this cluster through the test's backend."""
        return self.options_for(self.backend, **overrides)

    def options_for(self, backend: str, /, **overrides: object) -> dict[str, object]:
        """The ``slurm`` settings section reaching this cluster through ``backend`` (cli, rest): its
        slurm.conf, and for a chroot cluster the wrappers of its commands."""
        values: dict[str, object] = {"slurm_conf": str(self.conf)}
        if backend == "rest":  # the newest API version this slurmrestd serves
            apis = REST_APIS[f"{self.release[0]}.{self.release[1]:02d}"]
            values.update(self.rest_options(apis[-1]))
        if self.bin is not None:
            values.update({cmd: str(self.bin / cmd) for cmd in ("scontrol", "sinfo", "squeue", "scancel", "sbatch")})
        values.update(overrides)
        return values

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603 - test helper, fixed argv
            list(argv), env=self.env, capture_output=True, text=True, check=check, timeout=timeout
        )

    def run_as(self, user: str, command: str, *args: str) -> subprocess.CompletedProcess[str]:
        """A Slurm command run as ``user`` (another cluster user, not root), in the cluster's root. The
        session's directory is root's alone, so the user reads a copy of slurm.conf from a directory
        anyone may read (the root's /tmp) and is told of it with SLURM_CONF."""
        inner = Path("/tmp") / f"nr-slurm-conf-{self.dir.name}"  # noqa: S108 - a copy for another user
        outer = (self.root or Path("/")) / inner.relative_to("/")
        outer.mkdir(mode=0o755, exist_ok=True)
        (outer / "slurm.conf").write_text(self.conf.read_text())
        (outer / "slurm.conf").chmod(0o644)
        argv = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={inner / 'slurm.conf'}"]
        if self.root is None:
            return self.run(*argv, command, *args)
        return self.run("chroot", str(self.root), *argv, f"/usr/bin/{command}", *args)

    def scontrol(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("scontrol", *args, check=check)

    def nodes_now(self) -> dict[str, tuple[str, frozenset[str], str]]:
        # 23.02+ sinfo --json aggregates nodes by state; scontrol's JSON lists them one by one.
        argv = ("sinfo", "--json") if self.release < (23, 2) else ("scontrol", "show", "node", "--json")
        parsed = parse_nodes_json(self.run(*argv).stdout)
        return {n.name: (n.state, n.flags, n.reason) for n in parsed.values()}

    def settings(self, **overrides: object) -> SlurmSettings:
        return SlurmSettings(**self.slurm_options(**overrides))  # type: ignore[arg-type]

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

    def wait_idle(self, *nodes: str, timeout: float = 40) -> None:
        """Wait until ``nodes`` (every node if none named) are IDLE without flags."""
        deadline = within(timeout)
        while True:
            now = self.nodes_now()
            if all(state == "IDLE" and not flags for n, (state, flags, _) in now.items() if not nodes or n in nodes):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"cluster did not return to idle: {now}")
            time.sleep(0.2)

    def jobs(self) -> list[str]:
        """The ids of the jobs not yet over: pending, running or completing."""
        return self.run("squeue", "-h", "-o", "%A").stdout.split()

    def put_back(self, nodes: list[str], what: str) -> None:
        """After a test that ran jobs in reservations over ``nodes``: no job, no reservation, the nodes
        resumed."""
        self.cancel_jobs()
        wait_for(lambda: not self.jobs(), 30, f"{what} to leave")
        for line in self.scontrol("show", "reservation", check=False).stdout.splitlines():
            if line.startswith("ReservationName="):
                self.scontrol("delete", line.split()[0], check=False)
        self.scontrol("update", f"nodename={','.join(nodes)}", "state=resume", check=False)

    def cancel_jobs(self) -> None:
        """Cancel every job, pending ones too: a job a test requeued (or that waits for a node held
        out) would start during a later test, or run on past the cluster. A plain scancel: slurmctld
        ends the job itself and tells a node whose slurmd is down once it is back; ``--full`` only
        sends a signal, which that node never gets, and the job runs on."""
        jobs = self.jobs()
        if jobs:
            self.run("scancel", "--quiet", *jobs, check=False)

    def restore(self) -> None:
        self.cancel_jobs()
        for node in self.nodes:
            if self.slurmd_pid(node) is None:
                self.start_slurmd(node)
        deadline = within(60)
        while True:
            now = self.nodes_now()
            unhealthy = [n for n, (state, flags, _) in now.items() if flags - {"NOT_RESPONDING"} or state != "IDLE"]
            if unhealthy:
                self.scontrol("update", f"nodename={','.join(unhealthy)}", "state=resume", check=False)
            jobs = self.jobs()
            if all(state == "IDLE" and not flags for state, flags, _ in now.values()) and not jobs:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"cluster did not return to idle: {now}; jobs {jobs}")
            time.sleep(0.3)


#: The slurmrestd API versions each release serves (22.05: its own plugin; 24.11 and 26.05: openapi/slurmctld).
REST_APIS = {
    "22.05": ("v0.0.38",),
    "24.11": ("v0.0.40", "v0.0.41", "v0.0.42"),
    "26.05": ("v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"),
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test here that uses a Slurm cluster runs once per version under test, and a test taking
    ``rest_api`` once per API version that version's slurmrestd serves."""
    if "slurm_backend" in metafunc.fixturenames:
        # A module that writes (SLURM_WRITES = True) cannot use 22.05's read-only slurmrestd.
        writes = getattr(metafunc.module, "SLURM_WRITES", False)
        combos = [(v, b) for v in VERSIONS for b in ("cli", "rest") if not (writes and b == "rest" and v == "22.05")]
        metafunc.parametrize(
            ("slurm_cluster", "slurm_backend"), combos, indirect=True, scope="session",
            ids=[f"slurm{v}-{b}" for v, b in combos],
        )
    elif "rest_api" in metafunc.fixturenames:
        pairs = [(v, api) for v in VERSIONS for api in REST_APIS[v]]
        metafunc.parametrize(
            ("slurm_cluster", "rest_api"), pairs, indirect=["slurm_cluster"], scope="session",
            ids=[f"slurm{v}-{api}" for v, api in pairs],
        )
    elif "slurm_topo_cluster" in metafunc.fixturenames:
        metafunc.parametrize(
            "slurm_topo_cluster", VERSIONS, indirect=True, scope="session", ids=[f"slurm{v}" for v in VERSIONS]
        )
    elif "slurm_block_cluster" in metafunc.fixturenames:
        versions = [v for v in VERSIONS if v in BLOCK_RELEASES]
        metafunc.parametrize(
            "slurm_block_cluster", versions, indirect=True, scope="session", ids=[f"slurm{v}" for v in versions]
        )
    elif "slurm_cluster" in metafunc.fixturenames:
        # A module may name the releases it needs (SLURM_RELEASES = ("22.05",)): the others are not started for it.
        versions = [v for v in VERSIONS if v in getattr(metafunc.module, "SLURM_RELEASES", VERSIONS)]
        metafunc.parametrize(
            "slurm_cluster", versions, indirect=True, scope="session", ids=[f"slurm{v}" for v in versions]
        )


def _root(release: str) -> Path | None:
    """None for the host's Slurm; else the cached root of that release (built now if missing)."""
    if release == "22.05":
        return None
    if release not in ALL_VERSIONS:
        raise pytest.UsageError(f"SLURM_TEST_VERSIONS: no Slurm {release} to test against (know {ALL_VERSIONS})")
    built = subprocess.run(  # noqa: S603 - our own script, fixed argv
        ["bash", str(SCRIPTS / "slurm-root.sh"), release], capture_output=True, text=True, timeout=900
    )
    if built.returncode != 0:
        pytest.fail(f"scripts/slurm-root.sh failed ({built.returncode}):\n{built.stdout}\n{built.stderr}")
    return Path(built.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def slurm_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from start_cluster(getattr(request, "param", ALL_VERSIONS[0]), tmp_path_factory, leaves=0)


@pytest.fixture(scope="session")
def slurm_topo_cluster(request: pytest.FixtureRequest,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A second cluster of the same release with ``TopologyPlugin=topology/tree``: LEAVES leaf switches
    under one spine (``scripts/slurm-up.sh`` SLURM_CI_LEAVES). Its own cluster, so that the switch
    domains (and the incident rule they feed) never reach the tests of the plain one."""
    yield from start_cluster(getattr(request, "param", ALL_VERSIONS[0]), tmp_path_factory, leaves=LEAVES)


@pytest.fixture
def slurm_topo(slurm_topo_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The topology cluster, restored to all-IDLE after the test."""
    yield slurm_topo_cluster
    slurm_topo_cluster.restore()


@pytest.fixture(scope="session")
def slurm_block_cluster(request: pytest.FixtureRequest,
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A controller of a release with topology/block (BLOCK_RELEASES), its BLOCKS * BLOCK_SIZE nodes in
    blocks b1..b4 (``scripts/slurm-up.sh`` SLURM_CI_BLOCKS), from the file that release is given. No
    slurmd runs (SLURM_CI_SLURMD=0) and no slurmrestd: a topology needs the controller alone."""
    release = getattr(request, "param", "26.05")
    options = {
        "SLURM_CI_BLOCKS": str(BLOCKS), "SLURM_CI_BLOCK_SIZE": str(BLOCK_SIZE),
        "SLURM_CI_TOPOLOGY_FILE": BLOCK_RELEASES[release], "SLURM_CI_SLURMD": "0", "SLURM_CI_REST": "0",
    }
    yield from start_cluster(release, tmp_path_factory, leaves=0, nodes=BLOCKS * BLOCK_SIZE, options=options)


@pytest.fixture(scope="session")
def b1(slurm_block_cluster: SlurmCluster) -> Iterator[list[str]]:
    """Block b1's nodes, each with its own slurmd, powered up (idle) once for every test that runs jobs
    there; the slurmds end with the cluster. Once per cluster: a tray powered down again would come
    back only after SuspendTimeout."""
    cluster = slurm_block_cluster
    nodes = expand(f"gpu-node-[0-{BLOCK_SIZE - 1}]")
    assert "BlockName=b1 " in cluster.scontrol("show", "topology").stdout
    for node in nodes:
        cluster.start_slurmd(node)

    def states() -> dict[str, str]:
        out = cluster.run("sinfo", "-N", "-h", "-o", "%N %T").stdout
        return dict(line.split()[:2] for line in out.splitlines())

    try:
        wait_for(lambda: all(states().get(n) == "idle" for n in nodes), 30, f"{nodes} to power up")
        yield nodes
    finally:
        for node in nodes:
            if (pid := cluster.slurmd_pid(node)) is not None:
                os.kill(pid, signal.SIGTERM)


def start_cluster(
    release: str,
    tmp_path_factory: pytest.TempPathFactory,
    leaves: int,
    *,
    nodes: int = NODES,
    options: dict[str, str] | None = None,
) -> Iterator[SlurmCluster]:
    """Start a cluster of ``release`` (``leaves`` leaf switches, 0: no topology; ``nodes`` nodes; more
    ``scripts/slurm-up.sh`` ``options``), yield it, and stop it with ``scripts/slurm-down.sh``, which
    ends whatever it still runs."""
    root = _root(release)
    label = "-blocks" if options and options.get("SLURM_CI_BLOCKS") else f"-leaves{leaves}" if leaves else ""
    directory = tmp_path_factory.mktemp(f"slurm{release}{label}")
    # slurmctld's port, then one per slurmd; held until slurm-down.sh: a rebooted slurmd binds its port again.
    with lease(1 + nodes) as ports:
        yield from _run_cluster(release, root, directory, ports.port, {
            "SLURM_CI_NODES": str(nodes), "SLURM_CI_LEAVES": str(leaves), **(options or {}),
        })


def _run_cluster(
    release: str, root: Path | None, directory: Path, ctld_port: int, options: dict[str, str]
) -> Iterator[SlurmCluster]:
    """scripts/slurm-up.sh with slurmctld on ``ctld_port``, the slurmds on the ports after it, and the
    script's other ``options``."""
    env = dict(os.environ)
    env.update(
        SLURM_CI_DIR=str(directory),
        SLURM_CI_CTLD_PORT=str(ctld_port),
        SLURM_CI_PORT_BASE=str(ctld_port + 1),
        **options,
    )
    if root is not None:
        env["SLURM_CI_ROOT"] = str(root)
    up = subprocess.run(  # noqa: S603 - our own script, fixed argv
        ["bash", str(SCRIPTS / "slurm-up.sh")], env=env, capture_output=True, text=True, timeout=600
    )
    if up.returncode != 0:
        subprocess.run(["bash", str(SCRIPTS / "slurm-down.sh")], env=env, capture_output=True)  # noqa: S603
        pytest.fail(f"scripts/slurm-up.sh failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
    conf = directory / "slurm.conf"
    env["SLURM_CONF"] = str(conf)
    bin_dir = directory / "bin" if root is not None else None
    if bin_dir is not None:
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    nodes = expand(f"gpu-node-[0-{int(options['SLURM_CI_NODES']) - 1}]")
    cluster = SlurmCluster(directory, conf, nodes, env, bin=bin_dir, root=root)
    try:
        reported = cluster.run("scontrol", "--version").stdout
        found = re.search(r"(\d+\.\d+\.\d+)", reported)
        assert found is not None and found.group(1).startswith(release + "."), (release, reported)
        cluster.version = found.group(1)
        slurm_versions.record(release, cluster.version)  # for the run's closing line
        yield cluster
    finally:
        subprocess.run(  # noqa: S603
            ["bash", str(SCRIPTS / "slurm-down.sh")], env=env, capture_output=True, timeout=120
        )


@pytest.fixture
def slurm_backend(request: pytest.FixtureRequest, slurm_cluster: SlurmCluster) -> Iterator[str]:
    """The Slurm backend (cli or rest) the test's settings select through ``slurm_options``."""
    slurm_cluster.backend = request.param
    try:
        yield request.param
    finally:
        slurm_cluster.backend = "cli"


@pytest.fixture
def slurm(request: pytest.FixtureRequest, slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session cluster, restored to all-IDLE after the test."""
    if "slurm_backend" not in request.fixturenames:
        # slurm_backend's value is cached per session parameter, so its reset comes only when the next
        # parameter does: a test that asks for no backend gets the cli one, not the last test's.
        slurm_cluster.backend = "cli"
    yield slurm_cluster
    slurm_cluster.restore()
