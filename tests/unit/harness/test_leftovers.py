"""The session's check for processes it leaves behind (tests/leftovers.py), on planted processes.

Each planted process is detached (its parent has exited, as slurmstepd's has), and each is ended by
pid after the test whatever it asserted, so none outlives this session either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.leftovers import MARKER, Leftover, end, find
from tests.pace import within

ROOT = Path(__file__).resolve().parents[3]
#: Binds a unix socket at $SOCKET and waits; its command line names no path.
SOCKET_HOLDER = (
    "import os, socket, time; s = socket.socket(socket.AF_UNIX); s.bind(os.environ['SOCKET']); time.sleep(60)"
)

Plant = Callable[..., int]


@pytest.fixture
def plant() -> Iterator[Plant]:
    """``plant(script, env=..., cwd=...)`` runs ``script`` in the background of a shell that exits at
    once, and returns its pid: a process whose parent is gone."""
    pids: list[int] = []

    def start(script: str, env: dict[str, str] | None = None, cwd: Path | str = "/") -> int:
        out = subprocess.run(  # noqa: S603 - fixed argv
            ["/bin/sh", "-c", f"{script} </dev/null >/dev/null 2>&1 & echo $!"],
            env={"PATH": os.environ["PATH"], **(env or {})},
            cwd=cwd,
            start_new_session=True,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
        pids.append(int(out.stdout))
        return pids[-1]

    yield start
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def pids(found: list[Leftover]) -> list[int]:
    return [x.pid for x in found]


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_a_detached_process_carrying_the_mark_is_found_and_ended(plant: Plant) -> None:
    session = uuid.uuid4().hex
    pid = plant("exec sleep 60", env={MARKER: session})
    (leftover,) = find(session, None)
    assert (leftover.pid, leftover.cmdline, leftover.why) == (pid, "sleep 60", "marked")
    assert f"pid {pid}: sleep 60 (cwd /; marked)" == str(leftover)
    assert end([leftover], grace_s=2) == []
    assert not running(pid)


def test_another_sessions_processes_and_the_hosts_are_not_this_ones(plant: Plant, tmp_path: Path) -> None:
    session = uuid.uuid4().hex
    plant("exec sleep 60", env={MARKER: uuid.uuid4().hex})  # a session running beside this one
    plant("exec sleep 60")  # the machine's own
    assert find(session, tmp_path) == []


def test_a_process_without_the_mark_is_found_by_where_it_works(plant: Plant, tmp_path: Path) -> None:
    """slurmstepd: Slurm starts it with an empty environment, in slurmd's log dir."""
    log = tmp_path / "log"
    log.mkdir()
    pid = plant("exec sleep 60", cwd=log)
    (leftover,) = find(uuid.uuid4().hex, tmp_path)
    assert (leftover.pid, leftover.cwd, leftover.why) == (pid, str(log), "works in the session's temp dir")


def test_a_process_naming_the_temp_dir_is_found_and_a_neighbouring_dir_does_not_count(
    plant: Plant, tmp_path: Path
) -> None:
    pid = plant(f"exec sh -c 'sleep 60' holder --dir={tmp_path}/redis")
    plant(f"exec sh -c 'sleep 60' holder --dir={tmp_path}0/redis")  # pytest-10 is not pytest-1
    (leftover,) = find(uuid.uuid4().hex, tmp_path)
    assert (leftover.pid, leftover.why) == (pid, "names the session's temp dir")


def test_a_socket_bound_in_the_temp_dir_gives_a_process_away_after_the_dir_is_gone(
    plant: Plant, tmp_path: Path
) -> None:
    """slurmstepd inside a chroot whose bind mount and directory are gone: only its socket names them."""
    spool = tmp_path / "spool"
    spool.mkdir()
    socket_path = spool / "gpu-node-3_3.4294967291"
    pid = plant(f'exec {sys.executable} -c "{SOCKET_HOLDER}"', env={"SOCKET": str(socket_path)})
    deadline = within(10)
    while not socket_path.exists():
        assert time.monotonic() < deadline, "the socket was never bound"
        time.sleep(0.05)
    socket_path.unlink()
    spool.rmdir()
    (leftover,) = find(uuid.uuid4().hex, tmp_path)
    assert (leftover.pid, leftover.why) == (pid, "holds a socket in the session's temp dir")


def test_a_process_that_blocks_sigterm_is_killed(plant: Plant) -> None:
    session = uuid.uuid4().hex
    pid = plant("trap '' TERM; exec sleep 60", env={MARKER: session})  # as slurmstepd does
    found = find(session, None)
    assert pids(found) == [pid]
    assert end(found, grace_s=0.3) == []
    assert not running(pid)


def test_munged_with_the_mark_alone_is_shared_but_not_in_the_temp_dir(plant: Plant, tmp_path: Path) -> None:
    session = uuid.uuid4().hex
    plant(
        "exec bash -c 'exec -a munged sleep 60'", env={MARKER: session}
    )  # the host's, started by slurm-up.sh
    mine = plant("exec bash -c 'exec -a munged sleep 60'", env={MARKER: session}, cwd=tmp_path)
    assert pids(find(session, tmp_path)) == [mine]


INNER = """
import os, subprocess

def test_plants_a_detached_process():
    out = subprocess.run(["/bin/sh", "-c", "sleep 60 </dev/null >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True, start_new_session=True)
    with open(os.environ["PLANTED"], "w") as fh:
        fh.write(out.stdout)

def test_ends_what_it_starts():
    subprocess.run(["sleep", "0.1"], check=True)
"""


@pytest.mark.parametrize("workers", [[], ["-p", "xdist.plugin", "-n", "1"]], ids=["one-process", "xdist"])
def test_a_session_that_leaves_a_process_behind_fails_and_names_it(
    tmp_path: Path, workers: list[str]
) -> None:
    """The whole plugin, in a pytest session of its own (in one process, or in an xdist worker, which
    the controller checks after it): the run fails, names the process and ends it."""
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    planted = tmp_path / "planted.pid"
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    # The plugin alone: the installed ones (hypothesis, schemathesis...) cost seconds to load.
    env |= {"PYTHONPATH": str(ROOT), "PLANTED": str(planted), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    options = ["-p", "tests.leftovers", "-p", "no:cacheprovider", "-q", f"--basetemp={tmp_path / 'inner'}"]
    run = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-m", "pytest", *options, *workers, "test_inner.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    pid = int(planted.read_text())
    try:
        assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
        assert "processes left behind" in run.stdout
        assert f"pid {pid}: sleep 60 (cwd {tmp_path}; marked; " in run.stdout, run.stdout
        assert "started during test_inner.py::test_plants_a_detached_process (call)" in run.stdout
        assert "2 passed, 1 left behind" in run.stdout
        assert not running(pid)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
