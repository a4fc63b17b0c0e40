"""Free local ports for the servers tests and benchmarks start (slurmctld, one slurmd per node)."""

from __future__ import annotations

import random
import socket


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
