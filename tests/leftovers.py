"""Nothing the test session starts outlives it: a pytest plugin (loaded by tests/conftest.py).

The session marks itself with ``NODE_REMEDIATION_TEST_SESSION=<uuid>`` before anything starts, so
every process the tests start inherits it. When the session ends (in the xdist controller, once every
worker is down, or in the only process), any process still running that is this session's fails the
run: it is named with its pid, command line and working directory, then ended (SIGTERM, then SIGKILL:
slurmstepd blocks SIGTERM), so the machine stays clean for the next run. A process is this session's
when it carries the mark, works in the session's temp dir, names that dir in its command line, or
holds a unix socket bound in it. Slurm starts slurmstepd with an empty environment; its working
directory and its socket in the node's spool dir give it away, even inside a chroot.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

#: Outside the REMEDIATION_ namespace on purpose: the tests strip every REMEDIATION_ variable (the
#: service's settings) from the environments of the processes they start, and the mark must survive.
MARKER = "NODE_REMEDIATION_TEST_SESSION"
#: Host daemons a test may start that are shared, by design, by every cluster and session on the host
#: (scripts/slurm-up.sh starts munged when none answers; slurm-down.sh leaves it running): carrying
#: the mark alone does not make them leftovers.
SHARED = frozenset({"munged"})
#: The variable in which pytest names the test running (and its phase) in every process it starts.
CURRENT_TEST = b"PYTEST_CURRENT_TEST="
#: What this session left behind, and what of it not even SIGKILL ended.
FOUND = pytest.StashKey[tuple[list["Leftover"], list["Leftover"]]]()


@dataclass(frozen=True)
class Leftover:
    """A process of this session still running when it ended; ``started`` tells it from a later
    process that reuses its pid."""

    pid: int
    started: int
    cmdline: str
    cwd: str
    why: str
    test: str = ""

    def __str__(self) -> str:
        during = f"; started during {self.test}" if self.test else ""
        return f"pid {self.pid}: {self.cmdline or '?'} (cwd {self.cwd or '?'}; {self.why}{during})"


@dataclass(frozen=True)
class _Session:
    """What tells a session's processes: its mark, its temp dir, the sockets bound under that dir."""

    mark: bytes | None
    tmp: str | None
    sockets: frozenset[str]


def find(session: str | None, tmp: Path | None, spare: Collection[int] = ()) -> list[Leftover]:
    """Every live process but ``spare`` that carries the mark of ``session`` or lives in ``tmp`` (works
    in it, names it, holds a socket in it)."""
    under = str(tmp) if tmp is not None else None
    mark = f"{MARKER}={session}".encode() if session is not None else None
    ours = _Session(mark, under, _sockets_under(under) if under else frozenset())
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in spare:
            leftover = _inspect(entry, ours)
            if leftover is not None:
                found.append(leftover)
    return found


def _inspect(proc: Path, ours: _Session) -> Leftover | None:
    """``proc`` as a Leftover if it is the session's (and not a shared daemon), else None."""
    try:
        stat = (proc / "stat").read_text()
        environ = (proc / "environ").read_bytes().split(b"\0")
        argv = [a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
    except OSError:  # gone meanwhile, or not ours to read
        return None
    state, started = _state(stat)
    if state == "Z":  # exited; its parent has yet to reap it
        return None
    shown, cwd = _cwd(proc)
    reasons = _reasons(proc, ours, marked=ours.mark is not None and ours.mark in environ, cwd=cwd, argv=argv)
    if not reasons or (reasons == ["marked"] and argv and Path(argv[0]).name in SHARED):
        return None
    test = next(
        (e.decode(errors="replace")[len(CURRENT_TEST) :] for e in environ if e.startswith(CURRENT_TEST)), ""
    )
    return Leftover(int(proc.name), started, " ".join(argv), shown, ", ".join(reasons), test)


def _reasons(proc: Path, ours: _Session, *, marked: bool, cwd: str, argv: list[str]) -> list[str]:
    """Each way in which the process is the session's."""
    reasons = ["marked"] if marked else []
    if ours.tmp is None:
        return reasons
    if _is_under(cwd, ours.tmp):
        reasons.append("works in the session's temp dir")
    if any(_names(arg, ours.tmp) for arg in argv):
        reasons.append("names the session's temp dir")
    if ours.sockets and not ours.sockets.isdisjoint(_socket_inodes(proc)):
        reasons.append("holds a socket in the session's temp dir")
    return reasons


def _state(stat: str) -> tuple[str, int]:
    """State letter and start time (clock ticks after boot) from /proc/PID/stat; the command name in
    parentheses may hold spaces, so the fields are counted after its closing parenthesis."""
    fields = stat.rpartition(")")[2].split()
    return fields[0], int(fields[19])


def _cwd(proc: Path) -> tuple[str, str]:
    """The working directory as the host shows it, and as the process sees it (a chroot's root taken
    off, " (deleted)" too) for matching."""
    try:
        shown = os.readlink(proc / "cwd")
        root = os.readlink(proc / "root")
    except OSError:
        return "", ""
    inside = shown.removesuffix(" (deleted)")
    if root != "/" and inside.startswith(root + "/"):
        inside = inside[len(root) :]
    return shown, inside


def _is_under(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or below it (pytest-10 is not below pytest-1)."""
    return path == directory or path.startswith(directory + "/")


def _names(arg: str, directory: str) -> bool:
    """Whether a command-line argument names ``directory`` or a path below it anywhere in it
    (``--dir=DIR/redis``, ``unix:DIR/run/slurmrestd.sock``)."""
    return directory + "/" in arg + "/"


def _sockets_under(directory: str) -> frozenset[str]:
    """Inodes of the unix sockets bound under ``directory``: /proc/net/unix keeps the path a socket was
    bound to even once its directory, or the chroot mount it was made in, is gone."""
    try:
        lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    except OSError:
        return frozenset()
    fields = (line.split(maxsplit=7) for line in lines)
    return frozenset(f[6] for f in fields if len(f) == 8 and _is_under(f[7], directory))


def _socket_inodes(proc: Path) -> Iterator[str]:
    try:
        fds = list((proc / "fd").iterdir())
    except OSError:
        return
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            yield target[len("socket:[") : -1]


def end(leftovers: Collection[Leftover], grace_s: float = 3.0) -> list[Leftover]:
    """SIGTERM each leftover, SIGKILL those still running ``grace_s`` later; returns any that outlived
    even that. A pid that now belongs to a later process (another start time) is left alone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for leftover in leftovers:
            if _alive(leftover):
                try:
                    os.kill(leftover.pid, sig)
                except OSError:
                    pass
        deadline = time.monotonic() + grace_s
        while any(_alive(x) for x in leftovers) and time.monotonic() < deadline:
            time.sleep(0.05)
    return [x for x in leftovers if _alive(x)]


def _alive(leftover: Leftover) -> bool:
    try:
        state, started = _state(Path(f"/proc/{leftover.pid}/stat").read_text())
    except OSError:
        return False
    return state != "Z" and started == leftover.started


def _owns_session(config: pytest.Config) -> bool:
    """The controller, or the only process; not an xdist worker, whose processes the controller sees."""
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _owns_session(config):  # before xdist starts its workers: they inherit the mark too
        os.environ[MARKER] = uuid.uuid4().hex
    config.stash[FOUND] = ([], [])


@pytest.hookimpl(trylast=True)  # after xdist has taken its workers down
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if not _owns_session(config) or MARKER not in os.environ:
        return
    factory = getattr(config, "_tmp_path_factory", None)
    tmp = factory.getbasetemp() if factory is not None else None
    found = find(os.environ[MARKER], tmp, spare={os.getpid()})
    if found:
        config.stash[FOUND] = (found, end(found))
        if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    found, survivors = config.stash.get(FOUND, ([], []))
    if not found:
        return
    terminalreporter.section("processes left behind", red=True)
    terminalreporter.line(
        f"{len(found)} process(es) this session started outlived it; the run fails "
        "until the test that started each ends it:",
        red=True,
    )
    for leftover in found:
        terminalreporter.line(f"  {leftover}")
    ended = "every one of them was ended" if not survivors else f"{len(survivors)} survived SIGKILL"
    terminalreporter.line(ended, red=bool(survivors))
    terminalreporter.stats.setdefault("left behind", []).extend(found)  # on the closing line too
