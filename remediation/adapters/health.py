"""The health endpoint of a long-running process: ``/livez``, ``/readyz`` and ``/metrics`` on a local port.

Watchers, workers and beat answer these on ``health.port``. Liveness asks only whether the process's own
loop still turns; readiness whether it does its job right now. Each answer is a small JSON object saying
why. One daemon thread, the standard library's server.

Why: docs/architecture.md#each-process-says-how-it-is-without-asking-anyone-else
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

Check = Callable[[], tuple[bool, dict[str, Any]]]


class HealthServer:
    """``/livez``, ``/readyz`` (200 or 503, with a JSON body) and ``/metrics`` from ``registry``."""

    def __init__(self, bind: str, port: int, live: Check, *, ready: Check,
                 registry: CollectorRegistry) -> None:
        checks = {"/livez": live, "/readyz": ready}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path in checks:
                    try:
                        ok, body = checks[path]()
                    except Exception as exc:  # a broken check is a failed probe, never a dead server
                        ok, body = False, {"error": f"{type(exc).__name__}: {exc}"}
                    body = {"ok": ok, **body}
                    self._send(200 if ok else 503, json.dumps(body).encode(), "application/json")
                else:
                    self._send(
                        404, b'{"error": "not found: /livez, /readyz or /metrics"}', "application/json"
                    )

            def _send(self, status: int, data: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the http.server API
                pass  # a probe every few seconds is not news

        self._server = ThreadingHTTPServer((bind, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="health", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        self._thread.start()
        log.info("health endpoint on port %d (/livez, /readyz, /metrics)", self.port)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
