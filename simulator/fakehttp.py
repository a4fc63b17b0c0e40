"""What the cloud fakes share: a threaded stdlib HTTP(S) server, a request log and fault injection.

:class:`FakeServer` serves from a daemon thread on a free port, HTTPS with an ``ssl_context``;
:class:`RequestLog` records every request; :class:`Faults` fails the next N (or a random share of)
matching requests; :class:`Hold` delays an answer after the request acted.

Why: docs/wire-protocols.md#the-simulated-cluster
"""

from __future__ import annotations

import random
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socket import SHUT_RDWR, socket
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True)
class LoggedRequest:
    method: str
    path: str
    query: dict[str, str]
    status: int
    at: float = 0.0  # time.time() when the answer was ready


class Answered(Protocol):
    method: str
    path: str
    status: int


R = TypeVar("R", bound=Answered)


class RequestLog(Generic[R]):
    """Thread-safe list of the requests a fake answered (every fake's, the kube-apiserver's included)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[R] = []

    def add(self, item: R) -> None:
        with self._lock:
            self._items.append(item)

    @property
    def items(self) -> list[R]:
        with self._lock:
            return list(self._items)

    def count(self, method: str, path_suffix: str, *, status: int | None = None) -> int:
        """Requests whose path ends with ``path_suffix`` (case-insensitive), optionally with a status."""
        suffix = path_suffix.lower()
        return sum(
            1
            for r in self.items
            if r.method == method
            and r.path.lower().endswith(suffix)
            and (status is None or r.status == status)
        )

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


@dataclass
class Fault:
    status: int
    remaining: int
    retry_after: float | None = None
    match: str | None = None  # case-insensitive substring of the path; None matches every request
    method: str | None = None


@dataclass
class Hold:
    """Hold the answers to the next ``remaining`` matching requests for up to ``seconds``.

    ``held`` is set once a request is being held (its effect has happened, its answer has not gone
    out); ``release`` lets the held answers go at once."""

    seconds: float
    remaining: int
    match: str | None = None
    method: str | None = None
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (
            self.match is None or self.match in path.lower()
        )

    def wait(self) -> None:
        self.held.set()
        self.release.wait(self.seconds)


@dataclass
class _RandomFaults:
    rate: float
    choices: Sequence[tuple[int, float | None]]
    rng: random.Random
    match: str | None
    method: str | None


@dataclass
class Faults:
    """Queue of injected failures; the first matching fault with calls left is used."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _queue: list[Fault] = field(default_factory=list)
    _holds: list[Hold] = field(default_factory=list)
    _random: _RandomFaults | None = None
    injected: int = 0  # failures answered so far (queued and random)

    def fail_next(
        self,
        count: int,
        status: int = 503,
        *,
        retry_after: float | None = None,
        match: str | None = None,
        method: str | None = None,
    ) -> None:
        with self._lock:
            self._queue.append(Fault(status, count, retry_after, match.lower() if match else None, method))

    def fail_randomly(
        self,
        rate: float,
        choices: Sequence[tuple[int, float | None]] = ((503, None),),
        *, seed: int = 0,
        match: str | None = None,
        method: str | None = None,
    ) -> None:
        """From now on each matching request fails with probability ``rate``, with a (status,
        Retry-After) drawn from ``choices``; ``rate=0`` stops it. Seeded, so a run is repeatable."""
        with self._lock:
            self._random = (
                _RandomFaults(
                    rate, tuple(choices), random.Random(seed), match.lower() if match else None, method
                )
                if rate > 0
                else None
            )

    def delay_next(
        self, count: int, seconds: float, *, match: str | None = None, method: str | None = None
    ) -> Hold:
        """Hold the answers to the next ``count`` matching requests (after they acted) for up to
        ``seconds``; returns the :class:`Hold`, whose ``held`` event tells when one is held."""
        hold = Hold(seconds, count, match.lower() if match else None, method)
        with self._lock:
            self._holds.append(hold)
        return hold

    def take_hold(self, method: str, path: str) -> Hold | None:
        """The first armed hold matching the request, with one use consumed."""
        with self._lock:
            for hold in self._holds:
                if hold.remaining > 0 and hold.matches(method, path):
                    hold.remaining -= 1
                    return hold
        return None

    def take(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._queue:
                if fault.remaining <= 0:
                    continue
                if fault.method and fault.method != method:
                    continue
                if fault.match and fault.match not in path.lower():
                    continue
                fault.remaining -= 1
                self.injected += 1
                return fault
            r = self._random
            if (
                r is not None
                and (r.method is None or r.method == method)
                and (r.match is None or r.match in path.lower())
                and r.rng.random() < r.rate
            ):
                status, retry_after = r.rng.choice(r.choices)
                self.injected += 1
                return Fault(status, 0, retry_after, r.match, r.method)
            return None

    def clear(self) -> None:
        with self._lock:
            self._queue.clear()
            self._random = None
            for hold in self._holds:
                hold.release.set()
            self._holds.clear()


class _Server(ThreadingHTTPServer):
    """One thread per connection, every one of them ended by ``server_close``.

    A keep-alive connection's thread waits in ``recv`` for as long as the client keeps its pool open. Left
    running at interpreter exit, such a thread wakes when the client's sockets are collected and may
    write to stderr (an error report) while Python finalizes, which aborts the process. So the server
    keeps its open connections, and closing it shuts each one down and waits for its thread."""

    daemon_threads = True
    ssl_context: ssl.SSLContext | None = None
    #: How long ``server_close`` waits for the connection threads, all together.
    close_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._open: dict[Any, threading.Thread] = {}
        self._open_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(target=self._serve_connection, args=(request, client_address), daemon=True)
        with self._open_lock:
            self._open[request] = thread
        thread.start()

    def _serve_connection(self, request: Any, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open.pop(request, None)

    def server_close(self) -> None:
        super().server_close()
        with self._open_lock:
            open_now = dict(self._open)
        for request in open_now:
            try:
                request.shutdown(SHUT_RDWR)  # wakes the thread's recv; it then closes the socket itself
            except OSError:
                pass  # already closed by its client
        deadline = time.monotonic() + self.close_timeout_s
        for thread in open_now.values():
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def get_request(self) -> tuple[socket, Any]:
        sock, addr = super().get_request()
        if self.ssl_context is not None:
            # Handshake lazily, in the handler thread (see the module docstring).
            sock = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr


Response = tuple[int, dict[str, str], bytes]


class FakeServer:
    """Serve ``dispatch(method, path, query, body, headers) -> (status, headers, body)`` on 127.0.0.1:0.

    Request header names reach ``dispatch`` in lower case."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.log: RequestLog[LoggedRequest] = RequestLog()
        self.faults = Faults()
        outer = self

        class _RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the SDKs' connection pools expect

            def _serve(self) -> None:
                parts = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                try:
                    request_headers = {k.lower(): v for k, v in self.headers.items()}
                    status, headers, payload = outer.dispatch(
                        self.command, parts.path, query, body=body, headers=request_headers
                    )
                except Exception as exc:  # a bug in the fake must surface as a 500, not a hung client
                    status, headers, payload = 500, {"Content-Type": "text/plain"}, repr(exc).encode()
                outer.log.add(LoggedRequest(self.command, parts.path, query, status, time.time()))
                if hold := outer.faults.take_hold(self.command, parts.path):
                    hold.wait()
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client died while its answer was held

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                return

        self._httpd = _Server(("127.0.0.1", 0), _RequestHandler)
        self._httpd.ssl_context = ssl_context
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def dispatch(
        self, method: str, path: str, query: dict[str, str], *, body: bytes, headers: dict[str, str]
    ) -> Response:
        raise NotImplementedError  # each protocol module answers its own paths

    def start(self) -> FakeServer:
        self._thread = threading.Thread(
            # A short poll interval: shutdown() waits for it, and tests start many servers.
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=type(self).__name__,
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
