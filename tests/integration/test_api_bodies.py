"""Request bodies against a real API process: none is read before its sender is known, none past the cap.

Each request goes over a raw socket so the client never holds the body: the headers go first, the
body follows from a generator in a thread, and the answer is read as soon as it comes. The server's
memory is read from /proc (VmRSS) before and after; a body that were read whole would show.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.apiproc import ApiProcess, base_env
from tests.scenario_table import OVERSIZE, BadInputs

ADMIN = "admin-token-bodies-0123456789"
BIG = 200 * 1024 * 1024
CHUNK = 1024 * 1024
RSS_SLACK_KB = 20 * 1024


@pytest.fixture
def api(pg_url: str, tmp_path: Path) -> Iterator[ApiProcess]:
    proc = ApiProcess(base_env(pg_url, REMEDIATION_API__ADMIN_TOKENS=f'["{ADMIN}"]'), tmp_path / "api.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def zeros(total: int) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        piece = min(CHUNK, total - sent)
        sent += piece
        yield b"0" * piece


def post(api: ApiProcess, path: str, headers: dict[str, str], chunked: bool, total: int = BIG) -> int:
    """POST ``total`` bytes to ``path``; the status the server answers with (it may answer mid-body)."""
    sock = socket.create_connection(("127.0.0.1", api.port), timeout=30)
    head = {"Host": "127.0.0.1", "Content-Type": "application/json", **headers}
    head |= {"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(total)}
    sock.sendall(
        f"POST {path} HTTP/1.1\r\n".encode()
        + "".join(f"{k}: {v}\r\n" for k, v in head.items()).encode()
        + b"\r\n"
    )

    def body() -> None:
        try:
            for piece in zeros(total):
                sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server answered and closed: the rest of the body is refused, as it should be

    sender = threading.Thread(target=body, daemon=True)
    sender.start()
    try:
        status = sock.makefile("rb").readline()
    finally:
        sock.close()
        sender.join(30)
    assert status.startswith(b"HTTP/1.1 "), status
    return int(status.split()[1])


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_huge_body_without_a_token_is_refused_unread(api: ApiProcess, chunked: bool, bad_inputs: BadInputs) -> None:
    before = rss_kb(api.proc.pid)
    status = post(api, "/api/v1/pause", {}, chunked)
    assert status == 401
    assert post(api, "/api/v1/pause", {"Authorization": "Bearer not-a-known-token-0123"}, chunked) == 401
    grew = rss_kb(api.proc.pid) - before
    assert grew < RSS_SLACK_KB, f"the API grew by {grew} KiB"
    bad_inputs.tried(OVERSIZE, f"POST /api/v1/pause, {BIG // 2**20} MiB {'chunked ' if chunked else ''}body, no token",
                     f"{status} unread, RSS +{grew} KiB", lost=None)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_huge_body_with_a_token_is_too_large(api: ApiProcess, chunked: bool, bad_inputs: BadInputs) -> None:
    before = rss_kb(api.proc.pid)
    status = post(api, "/api/v1/pause", {"Authorization": f"Bearer {ADMIN}"}, chunked)
    assert status == 413
    grew = rss_kb(api.proc.pid) - before
    assert grew < RSS_SLACK_KB, f"the API grew by {grew} KiB"
    bad_inputs.tried(OVERSIZE, f"POST /api/v1/pause, {BIG // 2**20} MiB {'chunked ' if chunked else ''}body, admin token",
                     f"{status}, RSS +{grew} KiB", lost=None)


def test_a_dashboard_form_without_a_session_is_not_read(api: ApiProcess) -> None:
    before = rss_kb(api.proc.pid)
    assert post(api, "/pause", {}, chunked=True) == 303
    for chunked in (False, True):  # the login form is read without credentials, but only 16 KiB of it
        assert post(api, "/login", {"Content-Type": "application/x-www-form-urlencoded"}, chunked) == 413
    grew = rss_kb(api.proc.pid) - before
    assert grew < RSS_SLACK_KB, f"the API grew by {grew} KiB"
