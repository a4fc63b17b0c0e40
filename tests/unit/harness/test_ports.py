"""Ports for the servers tests start (tests/ports.py, CONTRIBUTING.md "Ports"): leases never overlap,
within a process or across processes, and sit below the kernel's ephemeral range; a dead address
refuses connections and cannot be taken; and no helper that picks a port and lets it go comes back.

The last is an AST scan of every package: a function (or a script's top level) that binds a socket to
port 0, reads ``getsockname()`` and closes the socket (its ``with`` block ends, or ``.close()``) before
it returns or uses the number. A server kept open on its port 0 socket is not one."""

from __future__ import annotations

import ast
import inspect
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import ports
from tests.ports import dead_address, ephemeral_range, lease, worker_block

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("tests", "bench", "scripts", "simulator", "remediation", "watchers", "workers")
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


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


# --------------------------------------------------------------------- no port picked and let go


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``scope`` outside the functions and classes nested in it (those are scopes too)."""
    for child in ast.iter_child_nodes(scope):
        yield child
        if not isinstance(child, SCOPES):
            yield from _own_nodes(child)


def _binds_port_zero(call: ast.Call) -> bool:
    """``X.bind((host, 0))`` or ``socket.create_server((host, 0))``."""
    name = call.func.attr if isinstance(call.func, ast.Attribute) else ""
    address = call.args[0] if call.args else None
    return (
        name in ("bind", "create_server")
        and isinstance(address, ast.Tuple)
        and len(address.elts) >= 2
        and isinstance(address.elts[1], ast.Constant)
        and address.elts[1].value == 0
    )


def _assignment(node: ast.AST) -> tuple[ast.expr | None, list[ast.expr]]:
    """(value, targets) of an assignment or a ``with`` item, else (None, [])."""
    if isinstance(node, ast.Assign):
        return node.value, node.targets
    if isinstance(node, ast.AnnAssign):
        return node.value, [node.target]
    if isinstance(node, ast.withitem):
        return node.context_expr, [node.optional_vars] if node.optional_vars is not None else []
    return None, []


def _zero_bound_sockets(nodes: list[ast.AST]) -> set[str]:
    """The sockets (as source text) the scope binds to port 0."""
    found = set()
    for node in nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "bind":
            if _binds_port_zero(node):
                found.add(ast.unparse(node.func.value))
        value, targets = _assignment(node)
        if isinstance(value, ast.Call) and _binds_port_zero(value):
            found |= {ast.unparse(t) for t in targets}
    return found


def _method_calls(nodes: list[ast.AST], sock: str, method: str) -> list[ast.Call]:
    return [
        n
        for n in nodes
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == method
        and ast.unparse(n.func.value) == sock
    ]


def _holds_port(node: ast.AST, reads: list[ast.Call], numbers: set[str]) -> bool:
    """Whether ``node`` (an expression) carries the port: a read of it, or a name it was put in."""
    inner = list(ast.walk(node))
    return any(r in inner for r in reads) or any(
        isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in numbers for n in inner
    )


def _withs_of(nodes: list[ast.AST], sock: str) -> list[ast.With | ast.AsyncWith]:
    return [
        n
        for n in nodes
        if isinstance(n, ast.With | ast.AsyncWith)
        and any(i.optional_vars is not None and ast.unparse(i.optional_vars) == sock for i in n.items)
    ]


def _let_go(nodes: list[ast.AST], sock: str, reads: list[ast.Call]) -> bool:
    """Whether the scope closes ``sock`` and then hands on the port it read: returns it, uses a name
    holding it, or keeps it beyond the scope (an attribute, an item); a return inside the ``with``
    whose target the socket is closes it on the way out."""
    read = min(r.lineno for r in reads)
    stored = [
        targets
        for value, targets in map(_assignment, nodes)
        if value is not None and any(r in ast.walk(value) for r in reads)
    ]
    numbers = {
        t.id for targets in stored for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)
    }
    kept = any(not isinstance(target, ast.Name | ast.Tuple) for targets in stored for target in targets)
    withs = _withs_of(nodes, sock)
    closed = [c.end_lineno or c.lineno for c in _method_calls(nodes, sock, "close")]
    closed += [w.end_lineno or w.lineno for w in withs]
    returned_inside = any(
        isinstance(n, ast.Return) and n.value is not None and _holds_port(n.value, reads, numbers)
        for w in withs
        for stmt in w.body
        for n in [stmt, *_own_nodes(stmt)]
    )
    used_after = any(
        _holds_port(n, reads, numbers) and n.lineno > line
        for line in closed
        if line >= read
        for n in nodes
        if isinstance(n, ast.Return | ast.Name)
    )
    return returned_inside or used_after or (kept and any(line >= read for line in closed))


def picked_and_let_go(source: str, filename: str) -> list[str]:
    """Each scope of ``source`` that closes a port-0 socket before it hands the port it read on."""
    tree = ast.parse(source, filename)
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    found = []
    for scope in [tree, *functions]:
        nodes = list(_own_nodes(scope))
        for sock in sorted(_zero_bound_sockets(nodes)):
            reads = _method_calls(nodes, sock, "getsockname")
            if reads and _let_go(nodes, sock, reads):
                where = f"{filename}:{min(r.lineno for r in reads)} {getattr(scope, 'name', '<module>')}"
                found.append(f"{where}: picks port 0 on {sock}, closes it, hands the number on")
    return found


def scan(root: Path) -> tuple[list[str], int]:
    """Every finding under ``root``'s packages, and how many files were read."""
    files = [f for top in SCANNED for f in sorted((root / top).rglob("*.py")) if "__pycache__" not in f.parts]
    findings = [hit for f in files for hit in picked_and_let_go(f.read_text(), str(f.relative_to(root)))]
    return findings, len(files)


def test_no_helper_picks_a_port_and_lets_it_go() -> None:
    findings, read = scan(ROOT)
    assert read > 300, f"the scan read only {read} files"  # it looked at the tree
    assert findings == [], "\n".join(findings) + "\nuse tests/ports.py: reported_port, lease, dead_address"


PLANTED = {
    "the-old-free-port": (
        "tests/probe.py",
        """
        import socket

        def free_port() -> int:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return int(s.getsockname()[1])
        """,
        "tests/probe.py:7 free_port",
    ),
    "close-then-return": (
        "bench/probe.py",
        """
        import socket

        def pick():
            sock = socket.socket()
            sock.bind(("", 0))
            port = sock.getsockname()[1]
            sock.close()
            return port
        """,
        "bench/probe.py:7 pick",
    ),
    "annotated-then-closed": (
        "workers/probe.py",
        """
        import socket

        def pick() -> int:
            sock = socket.socket()
            sock.bind(("::1", 0, 0, 0))
            port: int = sock.getsockname()[1]
            sock.close()
            return port
        """,
        "workers/probe.py:7 pick",
    ),
    "with-block-then-start-a-server": (
        "scripts/probe.py",
        """
        import socket, subprocess

        def start_server():
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            subprocess.Popen(["redis-server", "--port", str(port)])
        """,
        "scripts/probe.py:7 start_server",
    ),
    "create-server-in-a-method": (
        "simulator/probe.py",
        """
        import socket

        class Thing:
            def port(self):
                with socket.create_server(("127.0.0.1", 0)) as listener:
                    return listener.getsockname()[1]
        """,
        "simulator/probe.py:7 port",
    ),
    "kept-on-self": (
        "tests/integration/probe.py",
        """
        import socket

        class Server:
            def __init__(self):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", 0))
                    self.port = sock.getsockname()[1]
        """,
        "tests/integration/probe.py:8 __init__",
    ),
    "a-script-top-level": (
        "scripts/probe.py",
        """
        import socket, subprocess

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        PORT = s.getsockname()[1]
        s.close()
        subprocess.run(["slurmctld", "-p", str(PORT)])
        """,
        "scripts/probe.py:6 <module>",
    ),
}


@pytest.mark.parametrize(("relpath", "source", "expected"), PLANTED.values(), ids=PLANTED.keys())
def test_the_scan_catches_a_planted_port_picker(
    tmp_path: Path, relpath: str, source: str, expected: str
) -> None:
    """Planted in a copy of the layout, not in the tree: other tests read the tree meanwhile."""
    planted = tmp_path / relpath
    planted.parent.mkdir(parents=True)
    planted.write_text(textwrap.dedent(source))
    findings, read = scan(tmp_path)
    assert read == 1 and len(findings) == 1 and findings[0].startswith(expected + ":"), findings


KEPT_OPEN = {
    "a-server-on-its-port-0-socket": """
        import socket, threading

        def serve(server):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            threading.Thread(target=server.run, kwargs={"sockets": [sock]}).start()
            return server, f"http://127.0.0.1:{sock.getsockname()[1]}"
        """,
    "closed-after-the-test-used-it": """
        import contextlib, socket

        @contextlib.contextmanager
        def served(server):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            server.start(sock)
            try:
                yield f"http://127.0.0.1:{port}"
            finally:
                server.stop()
                sock.close()
        """,
    "a-dead-address-held-while-used": inspect.getsource(ports.dead_address),
    "a-fixed-port-probed": inspect.getsource(ports._bindable),
}


@pytest.mark.parametrize("source", KEPT_OPEN.values(), ids=KEPT_OPEN.keys())
def test_the_scan_leaves_a_socket_kept_open_alone(tmp_path: Path, source: str) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "probe.py").write_text(textwrap.dedent(source))
    assert scan(tmp_path) == ([], 1)
