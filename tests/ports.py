"""Ports for the servers tests and benchmarks start; none is picked, let go, and handed on.

- A server that says which port it bound (ours, uvicorn, sushy-tools) binds port 0: :func:`reported_port`.
- One that cannot (slurmctld, slurmd, redis, postgres) gets a :class:`PortLease` from :func:`lease`.
- An address where nothing answers is :func:`dead_address`: bound, never listening.

Why, and how leases keep xdist workers and side-by-side runs apart: CONTRIBUTING.md, "Ports".
"""

from __future__ import annotations

import fcntl
import os
import random
import re
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.pace import within

#: The line each server we start on port 0 writes once it listens, the port as its group 1.
HEALTH_LINE = re.compile(r"health endpoint on port (\d+)")  # remediation.adapters.health
UVICORN_LINE = re.compile(r"Uvicorn running on https?://\S+:(\d+)")  # `remediation api`
WERKZEUG_LINE = re.compile(r"Running on https?://\S+:(\d+)")  # sushy-tools' Redfish emulator

#: Leased ports start above the ones this machine's own servers use (Postgres 5432, Redis 6379,
#: Slurm's 6817-6818) and end below the kernel's ephemeral range, from which every port-0 bind and
#: every outgoing connection takes its port: nothing but a lease ever holds one of them.
POOL_START = 10_000
#: The pool's blocks: block 0 for a run without xdist (and the benchmarks), one per xdist worker after
#: it, so that workers seldom even try the same port; the locks are what rules a clash out.
BLOCKS = 16
LOCKS = Path(tempfile.gettempdir()) / "remediation-test-ports"
LINUX_EPHEMERAL = (32768, 60999)  # the kernel's default, where /proc does not say


def reported_port(
    log: Path, line: re.Pattern[str], proc: subprocess.Popen[Any], timeout: float = 60.0
) -> int:
    """The port a process started on port 0 says it bound: group 1 of ``line``'s first match in its
    output ``log``. Fails with the output's tail if the process exits or ``timeout`` passes first."""
    deadline = within(timeout)
    while True:
        exited = proc.poll() is not None  # before the read: a line written just before exiting counts
        text = log.read_text(errors="replace") if log.exists() else ""
        if found := line.search(text):
            return int(found.group(1))
        if exited or time.monotonic() > deadline:
            state = f"exited with {proc.returncode}" if exited else f"gave no port within {timeout:.0f}s"
            raise AssertionError(f"{proc.args!r} {state} (no line {line.pattern!r}):\n{text[-3000:]}")
        time.sleep(0.05)  # polling another process's output


@contextmanager
def dead_address() -> Iterator[str]:
    """``127.0.0.1:PORT`` where a connection is refused: a socket bound but never listening holds the
    port for as long as the ``with`` lasts, so no other process can start answering there."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


class PortLease:
    """Consecutive ports no other lease gets, in this process or any other, until :meth:`close`. Close
    it once the server on them has stopped for good: a server restarted on its port keeps it."""

    def __init__(self, first: int, locks: list[int]) -> None:
        self.ports = range(first, first + len(locks))
        self._locks = locks

    @property
    def port(self) -> int:
        return self.ports[0]

    def close(self) -> None:
        for fd in self._locks:
            os.close(fd)  # closing the descriptor ends its flock
        self._locks = []

    def __enter__(self) -> PortLease:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def lease(count: int = 1) -> PortLease:
    """``count`` consecutive ports of this worker's block, each free now and locked until the lease's
    :meth:`~PortLease.close`. Tried from a random place in the block, so that runs side by side spread."""
    block = worker_block()
    starts = range(block.start, block.stop - count + 1)
    if not starts:
        raise ValueError(f"{count} ports do not fit in a block of {len(block)}")
    if not LOCKS.is_dir():
        LOCKS.mkdir(exist_ok=True)
        with suppress(PermissionError):  # another user made it first
            LOCKS.chmod(0o1777)  # every user's runs lock here, as in /tmp itself
    shift = random.randrange(len(starts))
    for first in [*starts[shift:], *starts[:shift]]:
        locks = _lock_all(range(first, first + count))
        if locks is not None:
            return PortLease(first, locks)
    raise RuntimeError(f"no {count} consecutive free ports in {block.start}-{block.stop - 1}")


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for port-0 binds and outgoing connections (first, last)."""
    try:
        first, last = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL
    return first, last


def worker_block() -> range:
    """This process's block of the pool: its xdist worker's (``gw0`` is block 1), else block 0."""
    size = (ephemeral_range()[0] - POOL_START) // BLOCKS
    if size < 16:
        raise RuntimeError(
            f"the ephemeral range starts at {ephemeral_range()[0]}: no room below it for leases"
        )
    worker = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    index = int(worker.group(1)) % (BLOCKS - 1) + 1 if worker else 0
    start = POOL_START + index * size
    return range(start, start + size)


def _lock_all(ports: range) -> list[int] | None:
    """One held lock per port, or None (and nothing held) if another lease or a server has one."""
    locks: list[int] = []
    for port in ports:
        fd = _lock(port)
        if fd is None or not _bindable(port):
            for held in locks + ([fd] if fd is not None else []):
                os.close(held)
            return None
        locks.append(fd)
    return locks


def _lock(port: int) -> int | None:
    """An exclusive flock on the port's file in the shared temp directory, or None if held elsewhere.
    flock, not lockf: a lock per open file, so two leases of one process exclude each other too."""
    fd = os.open(LOCKS / f"{port}.lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _bindable(port: int) -> bool:
    """Nothing holds the port now: no server outside the leases, no leftover of a killed run."""
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True
