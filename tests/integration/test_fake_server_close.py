"""A simulated endpoint ends every connection thread when it stops, keep-alive ones included: a thread
left waiting in ``recv`` at interpreter exit can abort the process that ran it (the demo's SIGABRT)."""

from __future__ import annotations

import http.client
import threading

from remediation.simulator.fakehttp import FakeServer, Response


class Echo(FakeServer):
    def dispatch(
        self, method: str, path: str, query: dict[str, str], body: bytes, headers: dict[str, str]
    ) -> Response:
        return 200, {"Content-Type": "text/plain"}, path.encode()


def connection_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "_serve_connection" in t.name or "process_request" in t.name]


def test_stop_ends_keep_alive_connections_and_their_threads() -> None:
    before = set(connection_threads())
    server = Echo().start()
    clients = [http.client.HTTPConnection("127.0.0.1", server.port, timeout=10) for _ in range(3)]
    for i, client in enumerate(clients):
        client.request("GET", f"/hello/{i}")
        assert client.getresponse().read() == f"/hello/{i}".encode()  # the connection stays open
    assert len(set(connection_threads()) - before) == 3  # one waiting thread per open connection
    server.stop()
    assert set(connection_threads()) - before == set()
    for client in clients:
        client.close()
