"""A private redis-server on a leased port, for the tests and benchmarks that must restart or configure it.

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

from tests.pace import within
from tests.ports import lease

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
        self.binary, self.dir = binary, workdir
        self.lease = lease()  # a fixed port: a restart comes back on it (redis cannot report one)
        self.port = self.lease.port
        self.persistence = PERSISTENCE[persistence]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start (or restart, same port and dir) and return the monotonic time it answered PING."""
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                *self.persistence, "--daemonize", "no", "--logfile", str(self.dir / "redis.log")]
        self.proc = subprocess.Popen(args, start_new_session=True)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        deadline = within(20)
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
        """Kill the server; it may be started again on the same port."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill()

    def close(self) -> None:
        """Kill the server for good and give its port back."""
        self.stop()
        self.lease.close()


ACL_FILE = Path(__file__).resolve().parents[1] / "deploy" / "base" / "redis" / "users.acl"
#: The multi-cluster component's users (deploy/components/multi-cluster): one watcher user per cluster.
MULTI_CLUSTER_ACL_FILE = ACL_FILE.parents[2] / "components" / "multi-cluster" / "redis" / "users.acl"
ADMIN = "test-admin"


def shipped(directive: str) -> str:
    """The value the shipped redis.conf (beside ACL_FILE) gives ``directive``."""
    for line in (ACL_FILE.parent / "redis.conf").read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == directive:
            return value.strip()
    raise AssertionError(f"the shipped redis.conf sets no {directive}")


class AclRedis:
    """redis-server on a leased port with the shipped ACL users (deploy/base/redis/users.acl) and value
    bound (proto-max-bulk-len in redis.conf beside it), plus an
    all-powerful ``test-admin`` user for the test's own looks; TLS-only (``--port 0``) when given a
    server certificate. ``url(user)`` is that component's URL, with the shipped placeholder password."""

    def __init__(self, workdir: Path, tls: tuple[Path, Path, Path] | None = None,
                 *, acl_file: Path = ACL_FILE) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisMissing("redis-server is not installed (scripts/setup.sh installs it)")
        self.dir, self.tls = workdir, tls
        self.lease = lease()
        self.port = self.lease.port
        acl = workdir / "users.acl"
        acl.write_text(acl_file.read_text() + f"user {ADMIN} on >{ADMIN} ~* &* +@all\n")
        args = [binary, "--bind", "127.0.0.1", "--dir", str(workdir), *PERSISTENCE["volatile"],
                "--aclfile", str(acl), "--daemonize", "no", "--logfile", str(workdir / "redis.log"),
                "--proto-max-bulk-len", shipped("proto-max-bulk-len")]
        if tls is None:
            args += ["--port", str(self.port)]
        else:
            ca, cert, key = tls
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-ca-cert-file", str(ca),
                     "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-auth-clients", "no"]
        self.proc = subprocess.Popen(args, start_new_session=True)
        admin = self.client(ADMIN)
        deadline = within(20)
        while time.monotonic() < deadline:
            try:
                if admin.ping():
                    admin.close()
                    return
            except (redis.ConnectionError, redis.AuthenticationError):
                time.sleep(0.05)
        self.stop()
        raise AssertionError(f"redis-server did not start:\n{(workdir / 'redis.log').read_text()[-2000:]}")

    def url(self, user: str) -> str:
        password = ADMIN if user == ADMIN else f"change-me-{user}"
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{user}:{password}@127.0.0.1:{self.port}/0"

    def client(self, user: str) -> redis.Redis:
        extra = {"ssl_ca_certs": str(self.tls[0])} if self.tls else {}
        return redis.Redis.from_url(self.url(user), socket_connect_timeout=2, **extra)

    def denials(self) -> list[str]:
        """What the ACL refused since start: ``user command key`` per ACL LOG entry."""
        entries = self.client(ADMIN).acl_log(count=100)
        return [f"{e['username']} {e['reason']} {e['object']}" for e in entries]

    def stop(self) -> None:
        """Kill the server and give its port back."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.lease.close()
