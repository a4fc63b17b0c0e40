"""A private redis-server on a free port, for the tests and benchmarks that must restart or configure it.

Two persistence settings, the two the project talks about (docs/architecture.md, "Redis must keep the
stream across restarts"):

- ``durable`` (the production requirement): ``appendonly yes`` with ``appendfsync always``, so every
  write Redis acknowledged is on disk before the client hears "OK", and a SIGKILL loses nothing;
- ``volatile``: nothing on disk (``--save "" --appendonly no``), what the shared test server runs.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import redis

from tests.ports import free_port

PERSISTENCE = {
    "durable": ["--appendonly", "yes", "--appendfsync", "always", "--save", ""],
    "volatile": ["--appendonly", "no", "--save", ""],
}


class RedisMissing(RuntimeError):
    """redis-server is not installed."""


class PrivateRedis:
    def __init__(self, workdir: Path, persistence: str = "durable") -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisMissing("redis-server is not installed (scripts/setup.sh installs it)")
        self.binary, self.dir, self.port = binary, workdir, free_port()
        self.persistence = PERSISTENCE[persistence]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start (or restart, same port and dir) and return the monotonic time it answered PING."""
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                *self.persistence, "--daemonize", "no", "--logfile", str(self.dir / "redis.log")]
        self.proc = subprocess.Popen(args, start_new_session=True)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    client.close()
                    return time.monotonic()
            except redis.BusyLoadingError:
                pass  # replaying the AOF
            except redis.ConnectionError:
                pass
            time.sleep(0.02)
        raise AssertionError(f"redis-server did not start:\n{(self.dir / 'redis.log').read_text()[-2000:]}")

    def config(self, name: str) -> str:
        value = redis.Redis.from_url(self.url).config_get(name)[name]
        return str(value)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
