"""Replicated servers for the failover tests, each on leased ports in a temporary directory.

- :class:`SentinelSet`: one Redis primary, one replica and three sentinels (Debian's redis-server and
  redis-sentinel), every data node with the production persistence (``appendfsync always``). The
  sentinels agree on a failover with a quorum of two and call a primary down after three seconds of
  silence, so a failover takes a few seconds, not the default half-minute. One second was too short: on
  a loaded two-core machine an ``appendfsync always`` primary can miss a ping for that long, and a
  second, unasked failover could follow the test's own.
- :class:`StandbyPair`: a Postgres primary and a streaming replica made with ``pg_basebackup``, with
  synchronous replication once the replica streams (``synchronous_standby_names``): a commit returns
  only when the replica holds it, the setting an HA Postgres needs for "0 lost" (docs/architecture.md,
  "Failover loses nothing").
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psycopg
import redis

from remediation.settings import Settings, load_settings
from tests.integration.workerproc import wait_for
from tests.pace import within
from tests.ports import lease
from tests.redisproc import PERSISTENCE, RedisMissing

MASTER = "nr-primary"


class RedisNode:
    """One redis-server (a data node): started, SIGKILLed and started again on the same port and dir."""

    def __init__(self, binary: str, workdir: Path, replica_of: int | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.binary, self.dir, self.replica_of = binary, workdir, replica_of
        self.lease = lease()
        self.port = self.lease.port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, replica_of: int | None = None) -> None:
        """Start (again); ``replica_of``: as a replica of that port, as a restarted pod whose start-up
        asks the sentinels for the primary does."""
        if replica_of is not None:
            self.replica_of = replica_of
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            *PERSISTENCE["durable"],
            "--daemonize",
            "no",
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        self.proc = subprocess.Popen(args, start_new_session=True)
        client = self.client()
        deadline = within(20)
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return
            except (redis.ConnectionError, redis.BusyLoadingError):
                time.sleep(0.02)
        raise AssertionError(f"redis-server did not start:\n{(self.dir / 'redis.log').read_text()[-2000:]}")

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=5)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def close(self) -> None:
        """Kill the node for good and give its port back."""
        self.kill()
        self.lease.close()


class SentinelSet:
    """A primary, a replica and three sentinels watching them as :data:`MASTER`."""

    def __init__(self, workdir: Path) -> None:
        server, sentinel = shutil.which("redis-server"), shutil.which("redis-sentinel")
        if server is None or sentinel is None:
            raise RedisMissing("redis-server and redis-sentinel are needed (scripts/setup.sh installs them)")
        self.dir = workdir
        self.primary = RedisNode(server, workdir / "a")
        self.primary.start()
        self.replica = RedisNode(server, workdir / "b", replica_of=self.primary.port)
        self.replica.start()
        self.sentinel_lease = lease(3)
        self.sentinel_ports = list(self.sentinel_lease.ports)
        self.sentinels: list[subprocess.Popen[bytes]] = []
        for i, port in enumerate(self.sentinel_ports):
            conf = workdir / f"sentinel-{i}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {workdir}\nlogfile {workdir}/sentinel-{i}.log\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {MASTER} 3000\n"
                f"sentinel failover-timeout {MASTER} 4000\n"
                f"sentinel parallel-syncs {MASTER} 1\n"
            )
            self.sentinels.append(subprocess.Popen([sentinel, str(conf)], start_new_session=True))
        self.wait_formed()

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.sentinel_ports]

    def ask(self, i: int) -> redis.Redis:
        return redis.Redis(port=self.sentinel_ports[i], socket_connect_timeout=1, socket_timeout=2)

    def primary_port(self) -> int | None:
        """The primary's port as a majority of the sentinels name it (None until they agree)."""
        seen: list[int] = []
        for i in range(3):
            try:
                addr = self.ask(i).sentinel_get_master_addr_by_name(MASTER)
            except redis.RedisError:
                continue
            if addr:
                seen.append(int(addr[1]))
        best = max(set(seen), key=seen.count, default=None)
        return best if best is not None and seen.count(best) >= 2 else None

    def wait_formed(self, timeout: float = 30) -> None:
        """Until every sentinel knows the replica and the two other sentinels: before that, a killed
        primary could not be failed over."""
        deadline = within(timeout)
        while time.monotonic() < deadline:
            try:
                if all(
                    len(self.ask(i).sentinel_slaves(MASTER)) >= 1
                    and len(self.ask(i).sentinel_sentinels(MASTER)) >= 2
                    for i in range(3)
                ):
                    return
            except redis.RedisError:
                pass
            time.sleep(0.1)
        raise AssertionError("the sentinels did not find each other and the replica")

    def node(self, port: int) -> RedisNode:
        return self.primary if port == self.primary.port else self.replica

    def replicas_online(self, port: int) -> int:
        info = self.node(port).client().info("replication")
        return sum(
            1
            for k, v in info.items()
            if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
        )

    def replicated(self) -> bool:
        """Whether the primary the sentinels name now has a replica online. Asked of whichever primary
        they name at the time, so a second failover in between is followed, not waited out."""
        port = self.primary_port()
        try:
            return port is not None and self.replicas_online(port) >= 1
        except redis.RedisError:
            return False

    def output(self) -> str:
        """What a timed-out wait shows: each sentinel's failover decisions and the data nodes' log tails."""
        marks = ("sdown", "odown", "switch-master", "failover", "convert-to-slave", "elected-leader")
        parts = []
        for i in range(len(self.sentinels)):
            log = self.dir / f"sentinel-{i}.log"
            lines = log.read_text(errors="replace").splitlines() if log.exists() else []
            parts.append(f"--- sentinel-{i}\n" + "\n".join(line for line in lines if any(m in line for m in marks)))
        for node in (self.primary, self.replica):
            log = node.dir / "redis.log"
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            parts.append(f"--- redis on port {node.port}\n{tail}")
        return "\n".join(parts) + "\n"

    def stop(self) -> None:
        for proc in self.sentinels:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
        self.sentinel_lease.close()
        self.primary.close()
        self.replica.close()


class StandbyPair:
    """A Postgres primary (:class:`~tests.reliability.test_restarts.PrivateCluster`, migrated) and a
    streaming replica of it, with synchronous commit to that replica."""

    def __init__(self) -> None:
        from tests.reliability.test_restarts import PrivateCluster

        self.primary = PrivateCluster()
        self.primary.init()
        self.replica_dir = self.primary.base / "replica"
        self.replica_lease = lease()
        self.replica_port = self.replica_lease.port
        self.primary._run(
            str(self.primary.bin / "pg_basebackup"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary.port),
            "-U",
            "postgres",
            "-D",
            str(self.replica_dir),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        )
        with (self.replica_dir / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"primary_conninfo = 'host=127.0.0.1 port={self.primary.port} user=postgres "
                "application_name=standby1'\n"
            )
        self._pg_ctl(self.replica_dir, self.replica_port, "start")
        self._wait(
            lambda c: (
                c.execute(
                    "SELECT count(*) FROM pg_stat_replication WHERE application_name = "
                    "'standby1' AND state = 'streaming'"
                ).fetchone()[0]
                == 1
            ),
            self.primary.port,
            "the replica to stream",
        )
        with self.connect(self.primary.port) as c:
            c.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby1'")
            c.execute("SELECT pg_reload_conf()")
        self._wait(
            lambda c: c.execute("SELECT sync_state FROM pg_stat_replication").fetchone()[0] == "sync",
            self.primary.port,
            "synchronous replication",
        )
        self.url = (
            f"postgresql+psycopg://postgres@/remediation?host=127.0.0.1:{self.primary.port}"
            f"&host=127.0.0.1:{self.replica_port}&target_session_attrs=read-write"
        )

    def connect(self, port: int) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{port}/remediation", autocommit=True, connect_timeout=2
        )

    def _pg_ctl(self, data: Path, port: int, *action: str) -> None:
        opts = f"-p {port} -k {self.primary.base} -c listen_addresses=127.0.0.1"
        self.primary._run(
            str(self.primary.bin / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(data / "pg.log"),
            "-w",
            "-t",
            "60",
            "-o",
            opts,
            *action,
        )

    def _wait(self, ok: object, port: int, what: str, timeout: float = 30) -> None:
        deadline = within(timeout)
        while time.monotonic() < deadline:
            try:
                with self.connect(port) as c:
                    if ok(c):  # type: ignore[operator]
                        return
            except psycopg.Error:
                pass
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")

    def crash_primary(self) -> None:
        self.primary.crash()

    def promote(self) -> float:
        """Promote the replica and return the monotonic time it took writes."""
        self.primary._run(str(self.primary.bin / "pg_ctl"), "-D", str(self.replica_dir), "-w", "promote")
        self._wait(
            lambda c: c.execute("SELECT NOT pg_is_in_recovery()").fetchone()[0],
            self.replica_port,
            "the promoted replica to take writes",
        )
        return time.monotonic()

    def destroy(self) -> None:
        subprocess.run(
            [str(self.primary.bin / "pg_ctl"), "-D", str(self.replica_dir), "-m", "immediate", "stop"],
            capture_output=True,
            user=self.primary.user,
            check=False,
            timeout=60,
        )
        self.replica_lease.close()
        self.primary.destroy()


def sentinel_env(cluster: SentinelSet) -> dict[str, str]:
    """What points a process at the sentinels: the URL keeps only the database (its host is not used)."""
    return {
        "REMEDIATION_BROKER__REDIS_URL": "redis://sentinel-named-primary/0",
        "REMEDIATION_BROKER__SENTINEL__ADDRESSES": json.dumps(cluster.addresses),
        "REMEDIATION_BROKER__SENTINEL__MASTER": MASTER,
        "REMEDIATION_BROKER__REPLICA_ACKS": "1",
    }


def sentinel_settings(cluster: SentinelSet, prefix: str) -> Settings:
    return load_settings(
        broker={
            "redis_url": "redis://sentinel-named-primary/0",
            "key_prefix": prefix,
            "replica_acks": 1,
            "sentinel": {"addresses": cluster.addresses, "master": MASTER},
        }
    )


def fail_over(cluster: SentinelSet) -> tuple[float, float]:  # bounds for a loaded machine; the times are returned
    """SIGKILL the primary; wait until a majority of sentinels name the replica; start the old primary
    again as the new one's replica and wait until it is online. Returns (failover s, rejoin s)."""
    old = cluster.primary_port()
    assert old is not None
    cluster.node(old).kill()
    killed = time.monotonic()
    wait_for(lambda: cluster.primary_port() not in (None, old), 120, "the sentinels to promote the replica", cluster)
    promoted = time.monotonic()
    new = cluster.primary_port()
    assert new is not None
    cluster.node(old).start(replica_of=new)
    wait_for(cluster.replicated, 120, "the old primary to rejoin as a replica", cluster)
    return promoted - killed, time.monotonic() - promoted
