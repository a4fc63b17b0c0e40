"""Ports for the servers tests start (tests/ports.py, CONTRIBUTING.md "Ports"): leases never overlap,
within a process or across processes, and sit below the kernel's ephemeral range; a dead address
refuses connections and cannot be taken."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import ports
from tests.ports import dead_address, ephemeral_range, lease, worker_block

# ------------------------------------------------------------------------------------------ leases


@pytest.fixture
def tiny_block(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[range]:
    """A block of four ports for the test alone: leased for real (so no other test's server takes them
    meanwhile), then handed out again by leases that lock in a directory of their own."""
    with lease(4) as held:
        monkeypatch.setattr(ports, "worker_block", lambda: held.ports)
        monkeypatch.setattr(ports, "LOCKS", tmp_path)
        yield held.ports


def test_leases_never_share_a_port_until_one_is_closed(tiny_block: range) -> None:
    held = [lease() for _ in tiny_block]
    assert sorted(h.port for h in held) == list(tiny_block)
    with pytest.raises(RuntimeError, match="no 1 consecutive free ports"):
        lease()
    held[2].close()
    again = lease()
    assert again.port == held[2].port
    for h in [*held, again]:
        h.close()
    with lease(4) as whole:  # consecutive, as slurmctld and its slurmds need them
        assert whole.ports == tiny_block


def test_a_port_a_server_holds_is_never_leased(tiny_block: range) -> None:
    with socket.socket() as squatter:  # a server outside the leases: the machine's own, a leftover
        squatter.bind(("127.0.0.1", tiny_block[1]))
        squatter.listen()
        with lease(2) as got:
            assert got.ports == tiny_block[2:4]


def test_another_process_cannot_take_a_leased_port(tiny_block: range) -> None:
    """What keeps two xdist workers, or two runs side by side, apart: the flock, across processes."""
    take = (
        "import fcntl, os, sys; fcntl.flock(os.open(sys.argv[1], os.O_RDONLY), fcntl.LOCK_EX | fcntl.LOCK_NB)"
    )
    with lease() as held:
        lock = ports.LOCKS / f"{held.port}.lock"
        refused = subprocess.run([sys.executable, "-c", take, str(lock)], capture_output=True, check=False)
        assert refused.returncode != 0 and b"BlockingIOError" in refused.stderr
    assert subprocess.run([sys.executable, "-c", take, str(lock)], check=False).returncode == 0


@pytest.mark.parametrize("worker", ["", "gw0", "gw1", "gw3"], ids=["no-xdist", "gw0", "gw1", "gw3"])
def test_each_worker_draws_below_the_ephemeral_range_from_a_block_of_its_own(
    monkeypatch: pytest.MonkeyPatch, worker: str
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    mine = worker_block()
    others = set()
    for other in {"", "gw0", "gw1", "gw3"} - {worker}:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", other)
        others |= set(worker_block())
    assert ports.POOL_START <= mine.start and mine.stop <= ephemeral_range()[0]
    assert others.isdisjoint(mine)


def test_a_dead_address_refuses_connections_and_cannot_be_taken() -> None:
    with dead_address() as address:
        host, port = address.rsplit(":", 1)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=5).close()
        with socket.socket() as other, pytest.raises(OSError, match="in use"):
            other.bind((host, int(port)))
