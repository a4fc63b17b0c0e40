"""Ports for the servers tests and benchmarks start.

A server that says which port it bound (ours, uvicorn, sushy-tools) binds port 0, and the test reads the
number from the server's output: :func:`reported_port`. Picking a free port, letting it go and handing
it to a server started later leaves a window in which another process takes it.
"""

from __future__ import annotations

import random
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

#: The line each server we start on port 0 writes once it listens, the port as its group 1.
HEALTH_LINE = re.compile(r"health endpoint on port (\d+)")  # remediation.adapters.health
UVICORN_LINE = re.compile(r"Uvicorn running on https?://\S+:(\d+)")  # `remediation api`
WERKZEUG_LINE = re.compile(r"Running on https?://\S+:(\d+)")  # sushy-tools' Redfish emulator


def reported_port(
    log: Path, line: re.Pattern[str], proc: subprocess.Popen[Any], timeout: float = 60.0
) -> int:
    """The port a process started on port 0 says it bound: group 1 of ``line``'s first match in its
    output ``log``. Fails with the output's tail if the process exits or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while True:
        exited = proc.poll() is not None  # before the read: a line written just before exiting counts
        text = log.read_text(errors="replace") if log.exists() else ""
        if found := line.search(text):
            return int(found.group(1))
        if exited or time.monotonic() > deadline:
            state = f"exited with {proc.returncode}" if exited else f"gave no port within {timeout:.0f}s"
            raise AssertionError(f"{proc.args!r} {state} (no line {line.pattern!r}):\n{text[-3000:]}")
        time.sleep(0.05)  # polling another process's output


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_range(count: int) -> int:
    """A base port with ``count`` free ports after it."""
    for _ in range(200):
        base = random.randint(20000, 39000)
        held: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                held.append(socket.socket())
                held[-1].bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
        return base
    raise RuntimeError(f"no range of {count} free ports")
