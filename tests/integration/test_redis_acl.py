"""Least privilege on the bus: each component runs as its own Redis ACL user (deploy/base/redis/users.acl).

A real redis-server loads the shipped ACL file; the real Slurm watcher, Celery worker processes (no
beat until the storm is in: the workers' kick relay alone starts the ingest), beat and API process each
connect as their own user, and a storm of events goes end to end. Nothing any of them did was refused (ACL LOG is empty), and the
watcher's user cannot read, delete or trim the stream, nor touch Celery's queues. The same over TLS.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import redis
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from remediation.adapters.bus import Keys
from remediation.adapters.celery import SWEEP_TASK
from remediation.adapters.factory import make_bus, make_lock
from remediation.adapters.lock import LeaderLock, drawn_tokens
from remediation.adapters.memory import MemorySlurm, MemoryWorld
from remediation.adapters.queues import queue_depth
from remediation.adapters.stream import Reading, claim_kick, consume
from remediation.db.models import AuditLog, Node, RejectedEvent, Remediation
from remediation.domain.admission import Published, Publisher
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.statemachine import OPEN_STATUSES
from remediation.settings import Settings, load_settings
from remediation.simulator.kube.tls import write_cluster_pki
from remediation.watchers.runtime import Stopper
from remediation.watchers.slurm.watcher import run as run_slurm_watcher
from tests.integration.apiproc import ApiProcess, base_env
from tests.integration.workerproc import ROOT, Worker, beat_argv, wait_for, worker_env
from tests.redisproc import ADMIN as ADMIN_USER
from tests.redisproc import MULTI_CLUSTER_ACL_FILE, AclRedis
from tests.scenario_table import FORGED, BadInputs

PREFIX = "remediation"  # the ACL file's key prefix
ADMIN_TOKEN = "acl-test-admin-token-0123456789abcdef"
STORM = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]


@pytest.fixture
def plain(tmp_path: Path) -> Iterator[AclRedis]:
    server = AclRedis(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[AclRedis]:
    (tmp_path / "pki").mkdir()
    pki = write_cluster_pki(tmp_path / "pki")
    server = AclRedis(tmp_path, tls=(pki.ca_file, pki.cert_file, pki.key_file))
    yield server
    server.stop()


def opened(pg_url: str) -> set[str]:
    engine = create_engine(pg_url, poolclass=NullPool)
    with Session(engine) as s:
        nodes = set(s.scalars(select(Remediation.node)))
    engine.dispose()
    return nodes


def lever(api: ApiProcess, path: str) -> None:
    r = httpx.post(f"{api.url}/api/v1/nodes/{path}", json={"reason": "acl test"},
                   headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
    assert r.status_code == 200, r.text


def status(pg_url: str, node: str) -> str | None:
    engine = create_engine(pg_url, poolclass=NullPool)
    with Session(engine) as s:
        row = s.get(Node, ("default", node))
        found = row.status if row is not None else None
    engine.dispose()
    return found


def audited(pg_url: str, action: str) -> list[str]:
    engine = create_engine(pg_url, poolclass=NullPool)
    with Session(engine) as s:
        targets = list(s.scalars(select(AuditLog.target).where(AuditLog.action == action)))
    engine.dispose()
    return targets


def storm_end_to_end(server: AclRedis, pg_url: str, tmp_path: Path, ca: str | None = None) -> None:
    """Watcher, worker and API, each as its own user, through a storm; the ACL refused nothing."""
    tls = {"REMEDIATION_BROKER__CA_FILE": ca} if ca else {}
    env = worker_env(pg_url, server.url("worker"), PREFIX, tmp_path, **tls)
    world = MemoryWorld(nodes=[f"gpu-node-{i}" for i in range(8)], journal=tmp_path / "world.json")
    watcher_settings = load_settings(
        broker={"redis_url": server.url("watcher-slurm"), "key_prefix": PREFIX, "ca_file": ca},
        slurm={"backend": "memory", "poll_interval_s": 0.2},
        sim={"journal": str(tmp_path / "world.json"), "nodes": "gpu-node-[0-7]"},
    )
    worker = Worker(env, tmp_path, beat=False)  # no beat, no safety net: the relay kicks the ingest
    api = ApiProcess(
        base_env(
            pg_url,
            REMEDIATION_BROKER__REDIS_URL=server.url("api"),
            REMEDIATION_BROKER__KEY_PREFIX=PREFIX,
            REMEDIATION_API__ADMIN_TOKENS=f'["{ADMIN_TOKEN}"]',
            **tls,
        ),
        tmp_path / "api.log",
    )
    stopper = Stopper(install=False)
    beat: subprocess.Popen[bytes] | None = None
    watcher = threading.Thread(
        target=run_slurm_watcher,
        args=(watcher_settings, stopper),
        kwargs={"slurm": MemorySlurm(world)},
        daemon=True,
    )
    try:
        api.wait_ready()
        wait_for(worker.ready, 60, "the worker", worker)
        watcher.start()
        for node in STORM:
            world.set_slurm(node, flags=["FAIL"], reason="xid 79")
        wait_for(lambda: set(STORM) <= opened(pg_url), 60, "the storm's remediations", worker)
        beat = subprocess.Popen(
            beat_argv(tmp_path / "beat-schedule"),
            env={**env, "REMEDIATION_BROKER__REDIS_URL": server.url("beat")},
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        # A lever through the API: its follow-up work goes to the workers on the workflow queue.
        lever(api, "gpu-node-6/quarantine")
        wait_for(lambda: "gpu-node-6" in opened(pg_url), 60, "the lever's remediation", worker)
        wait_for(
            lambda: " on gpu-node-6" in worker.output(), 60, "a worker to run the lever's first step", worker
        )
        # A release through the API: the requests queue names its audit row; the worker re-reads it and acts.
        wait_for(lambda: status(pg_url, "gpu-node-6") == "quarantined", 60, "the lever's quarantine", worker)
        lever(api, "gpu-node-6/release")
        wait_for(lambda: audited(pg_url, "release_done") == ["gpu-node-6"], 60, "the release task", worker)
        sweeps = worker.acknowledged(SWEEP_TASK)
        wait_for(lambda: worker.acknowledged(SWEEP_TASK) > sweeps + 1, 30, "beat's sweeps", worker)
        metrics = httpx.get(f"{api.url}/metrics", timeout=10).text
        assert 'remediation_queue_depth{queue="events"}' in metrics  # the API read the ingest group's lag
        assert 'remediation_queue_depth{queue="requests"}' in metrics  # and the levers' queue
    finally:
        stopper.stop()
        if watcher.is_alive():
            watcher.join(10)
        api.stop()
        worker.stop()
        if beat is not None:
            beat.terminate()
            beat.wait(15)
    assert server.denials() == []
    engine = create_engine(pg_url, poolclass=NullPool)
    with Session(engine) as s:
        assert s.scalar(select(func.count()).select_from(Remediation)) >= len(STORM) + 1
    engine.dispose()


def test_each_component_runs_as_its_own_user(plain: AclRedis, pg_url: str, tmp_path: Path) -> None:
    storm_end_to_end(plain, pg_url, tmp_path)


@pytest.mark.parametrize(
    "command",
    [
        ("XRANGE", f"{PREFIX}:events:slurm", "-", "+"),
        ("XREAD", "STREAMS", f"{PREFIX}:events:slurm", "0"),
        ("XREADGROUP", "GROUP", "ingest", "me", "STREAMS", f"{PREFIX}:events:slurm", ">"),
        ("XTRIM", f"{PREFIX}:events:slurm", "MAXLEN", "0"),
        ("XDEL", f"{PREFIX}:events:slurm", "1-1"),
        ("DEL", f"{PREFIX}:events:slurm"),
        ("XADD", f"{PREFIX}:events", "*", "e", "{}"),
        ("XADD", f"{PREFIX}:events:kube", "*", "e", "{}"),
        ("LPUSH", f"{PREFIX}:celery:ingest", "{}"),
        ("LPUSH", f"{PREFIX}:celery:workflow", "{}"),
        ("LRANGE", f"{PREFIX}:celery:workflow", "0", "-1"),
        ("DEL", f"{PREFIX}:celery:workflow"),
        ("SET", f"{PREFIX}:leader:kube", "x"),
        ("SET", f"{PREFIX}:leader:kube:token", "99999999999999"),
        ("KEYS", "*"),
    ],
    ids=[
        "xrange",
        "xread",
        "xreadgroup",
        "xtrim",
        "xdel",
        "del-stream",
        "xadd-workers-stream",
        "xadd-other-watchers-stream",
        "lpush-ingest",
        "lpush-workflow",
        "lrange-queue",
        "del-queue",
        "other-kinds-lock",
        "other-kinds-fencing-token",
        "keys",
    ],
)
def test_a_watcher_may_only_append(plain: AclRedis, command: tuple[str, ...]) -> None:
    watcher = plain.client("watcher-slurm")
    assert watcher.xadd(f"{PREFIX}:events:slurm", {"e": "{}"})  # what it is for: its own stream
    with pytest.raises(redis.exceptions.NoPermissionError):
        watcher.execute_command(*command)


def test_a_watcher_holds_its_lock_with_a_fencing_token_and_waits_for_replicas(plain: AclRedis) -> None:
    """What the lock needs and nothing more: its own key and token counter, TIME in the script, WAIT."""
    watcher = plain.client("watcher-slurm")
    lock = LeaderLock(watcher, f"{PREFIX}:leader:slurm")
    assert lock.acquire_or_renew() and lock.token > 0
    assert watcher.wait(0, 10) == 0  # broker.replica_acks: allowed (this server has no replica)
    lock.release()
    assert plain.denials() == []


@pytest.mark.parametrize("user", ["api", "beat"])
def test_api_and_beat_may_queue_only_requests(plain: AclRedis, user: str) -> None:
    """The ingest and workflow queues' tasks act; only the workers write them. The API and beat write
    the requests queue, whose tasks re-read from Postgres what to do (remediation/adapters/celery.py)."""
    client = plain.client(user)
    assert client.lpush(f"{PREFIX}:celery:requests", "{}")
    for key in ("ingest", "workflow", "_kombu.binding.workflow", "_kombu.binding.ingest"):
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command("LPUSH" if "binding" not in key else "SADD", f"{PREFIX}:celery:{key}", "{}")


def test_redis_refuses_an_entry_over_the_shipped_value_bound(plain: AclRedis) -> None:
    """proto-max-bulk-len (1 MiB in the shipped redis.conf): a watcher cannot write an entry that would
    make the ingest's reads huge; Redis itself refuses it, whatever the watcher's user may do."""
    watcher = plain.client("watcher-slurm")
    assert watcher.xadd(f"{PREFIX}:events:slurm", {"e": b"x" * 1_000_000})  # under the bound
    with pytest.raises(redis.RedisError):  # "invalid bulk length", or the pipe Redis closed on it
        watcher.xadd(f"{PREFIX}:events:slurm", {"e": b"x" * (2 << 20)})
    assert plain.client(ADMIN_USER).xlen(f"{PREFIX}:events:slurm") == 1


def test_the_default_user_is_off(plain: AclRedis) -> None:
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=plain.port).ping()


def test_components_speak_tls(tls: AclRedis, pg_url: str, tmp_path: Path) -> None:
    with pytest.raises(redis.ConnectionError):  # TLS only: no plain-text port
        redis.Redis(port=tls.port, socket_connect_timeout=2).ping()
    assert tls.tls is not None
    storm_end_to_end(tls, pg_url, tmp_path, ca=str(tls.tls[0]))


def forged(node: str, token: int, **fields: object) -> str:
    """A Slurm fault on ``node`` as the Slurm watcher would publish it, with ``fields`` put over it."""
    return json.dumps({"source": "slurm", "node": node, "kind": "unhealthy", "state": "FAIL", "reason": "xid 79",
                       "observed_at": datetime.now(UTC).isoformat(), "fence": {"lock": "slurm", "token": token},
                       **fields})


def test_the_watchers_credential_reports_its_own_source_and_nothing_more(
    plain: AclRedis, pg_url: str, tmp_path: Path, bad_inputs: BadInputs
) -> None:
    """Poisoned and forged entries, written with the Slurm watcher's own credential to the one stream
    it may write, in one batch with a real fault: the real worker refuses each (kept in
    rejected_events, with its reason, and acknowledged), opens nothing for them, and remediates the
    real fault, though an entry ahead of it took its dedupe key. A well-formed fault on a node Slurm
    shows healthy is recorded but acted on never: Slurm does not confirm it."""
    env = worker_env(pg_url, plain.url("worker"), PREFIX, tmp_path)
    world = MemoryWorld(nodes=[f"gpu-node-{i}" for i in range(12)], journal=tmp_path / "world.json")
    world.set_slurm("gpu-node-1", flags=["FAIL"], reason="xid 79")  # the real fault: Slurm shows it
    watcher = plain.client("watcher-slurm")
    lock = LeaderLock(watcher, f"{PREFIX}:leader:slurm")
    assert lock.acquire_or_renew()  # fencing is on: the slurm lock hands out tokens
    token = lock.token
    topology = {"kind": "domains", "state": "topology", "reason": "forged"}
    bad = [
        ("invalid event", forged("gpu-node-2", token, observed_at="9999-12-31T23:59:59-01:00")),
        ("future", forged("gpu-node-3", token, observed_at=(datetime.now(UTC) + timedelta(days=1)).isoformat())),
        ("manual", forged("gpu-node-4", token, source="manual")),
        ("foreign-source", forged("gpu-node-5", token, source="kubernetes", state="Ready=False")),
        ("foreign-fence", forged("gpu-node-6", token, fence={"lock": "kube", "token": token})),
        ("forged-token", forged("gpu-node-7", token, fence={"lock": "slurm", "token": token + 1000})),
        ("unfenced", forged("gpu-node-0", token, fence=None)),
        ("oversize", forged("gpu-node-8", token, reason="x" * 100_000)),
        ("foreign-fact", forged("gpu-node-9", token, **topology, domains={"nvidia.com/gpu.clique": "c.1"})),
        ("foreign-fact", forged("gpu-node-9", token, kind="labels", state="labels", reason="forged",
                                labels={"pool": "shadow"})),
    ]
    key = "slurm:gpu-node-1:FAIL:2026-11-28T12:00:00:0a1b2c3d"  # Slurm's keys can be foretold
    ahead = forged("gpu-node-1", token, kind="healthy", state="IDLE", reason="", dedupe_key=key)
    real = forged("gpu-node-1", token, dedupe_key=key)
    unconfirmed = forged("gpu-node-10", token)  # Slurm shows gpu-node-10 IDLE
    pipe = watcher.pipeline(transaction=False)
    for payload in [*(p for _, p in bad), ahead, real, unconfirmed]:
        pipe.xadd(f"{PREFIX}:events:slurm", {"e": payload})
    pipe.execute()
    worker = Worker(env, tmp_path, beat=False)  # the kick relay finds the entries and starts the ingest
    try:
        wait_for(lambda: "gpu-node-1" in opened(pg_url), 60, "the real fault's remediation", worker)
        wait_for(lambda: " on gpu-node-1" in worker.output(), 60, "a worker to act on the real fault", worker)
        wait_for(lambda: outcome(pg_url, "gpu-node-10") is not None, 60, "the forged fault's end", worker)
        admin = plain.client(ADMIN_USER)
        wait_for(lambda: admin.xpending(f"{PREFIX}:events:slurm", "ingest")["pending"] == 0, 30, "the acks", worker)
    finally:
        worker.stop()
        lock.release()
    engine = create_engine(pg_url, poolclass=NullPool)
    with Session(engine) as s:
        errors = list(s.scalars(select(RejectedEvent.error)))
    engine.dispose()
    assert sorted(e.split(":")[0] for e in errors) == sorted(r for r, _ in bad), errors
    assert opened(pg_url) == {"gpu-node-1", "gpu-node-10"}
    assert outcome(pg_url, "gpu-node-10") == ("cancelled", "unconfirmed: Slurm reports gpu-node-10 IDLE now; nothing done")
    assert world.calls(op="slurm.drain", effect=True) and {c["node"] for c in world.calls(effect=True)} == {"gpu-node-1"}
    assert plain.denials() == []
    lost = int("gpu-node-1" not in {c["node"] for c in world.calls(op="slurm.drain", effect=True)})  # the real fault
    for error in errors:
        bad_inputs.tried(FORGED, f"{error.split(':')[0]} entry on the Slurm stream, with the watcher's credential",
                         f"rejected and kept ({error[:80]}), acknowledged", lost=lost)
    bad_inputs.tried(FORGED, "a healthy edge sent ahead under the real fault's foretold dedupe key",
                     "both recorded, the real fault remediated", lost=lost)
    bad_inputs.tried(FORGED, "a well-formed, fenced fault on a node Slurm shows IDLE",
                     "recorded; cancelled unconfirmed before any action", lost=lost)


def outcome(pg_url: str, node: str) -> tuple[str, str] | None:
    """How ``node``'s remediation ended (None: it has not)."""
    engine = create_engine(pg_url, poolclass=NullPool)
    with Session(engine) as s:
        row = s.scalars(select(Remediation).where(Remediation.node == node)).first()
        ended = (row.status, row.outcome) if row is not None and row.status not in OPEN_STATUSES else None
    engine.dispose()
    return ended


# ------------------------------------------------------------------------ many clusters

CLUSTERS = ("east", "west", "lab")  # deploy/components/multi-cluster's clusters


@pytest.fixture
def multi(tmp_path: Path) -> Iterator[AclRedis]:
    server = AclRedis(tmp_path, acl_file=MULTI_CLUSTER_ACL_FILE)
    yield server
    server.stop()


def _watched(server: AclRedis, cluster: str, kind: str = "slurm") -> Settings:
    return load_settings(broker={"redis_url": server.url(f"watcher-{kind}-{cluster}"), "key_prefix": PREFIX},
                         cluster={"name": cluster})


def test_a_clusters_watcher_publishes_on_its_own_clusters_stream(multi: AclRedis) -> None:
    """The real bus and lock, as each cluster's Slurm watcher makes them, publish a fenced event as
    that cluster's own Redis user; the worker user reads every cluster's stream and token counter and
    acknowledges the entries; the API user reads every cluster's queue depth. Nothing was refused."""
    tokens = {}
    for cluster in CLUSTERS:
        settings = _watched(multi, cluster)
        bus = make_bus(settings)
        lock = make_lock(settings, "slurm", bus=bus)
        assert lock.acquire_or_renew()
        tokens[cluster] = lock.token
        assert bus.publish([NodeEvent(source=Source.SLURM, node="gpu-node-1", kind=EventKind.UNHEALTHY,
                                      state="FAIL", reason=f"xid 79 in {cluster}", observed_at=datetime.now(UTC))]) == 1
    worker = multi.client("worker")
    got: list[Published] = []
    keys = Keys(PREFIX, served=CLUSTERS)
    assert all(claim_kick(worker, one) for one in keys.every_cluster())  # the relay, cluster by cluster
    assert consume(worker, keys, got.extend, reading=Reading(batch=64, claim_idle_ms=60_000, linger_s=0)) == 3
    assert worker.mget([one.kick for one in keys.every_cluster()]) == [None] * 3  # the ingest dropped them
    assert sorted(p.cluster for p in got) == sorted(CLUSTERS)
    assert all(NodeEvent.model_validate_json(bytes(p)).cluster == p.cluster for p in got)
    for cluster in CLUSTERS:
        assert drawn_tokens(worker, Keys(PREFIX, cluster=cluster).space) == {"slurm": tokens[cluster]}
        where = Keys(PREFIX, Publisher.SLURM, cluster).stream
        assert worker.xpending(where, "ingest")["pending"] == 0
    # The API's queue depth, as its own user, counts every cluster's streams (all acknowledged now).
    api = load_settings(broker={"redis_url": multi.url("api"), "key_prefix": PREFIX},
                        clusters=[{"name": c} for c in CLUSTERS])
    assert queue_depth(api)["events_pending"] == 0
    assert multi.denials() == []


def _refused_across_clusters() -> list[tuple[str, tuple[str, ...]]]:
    """(the user, a command it must be refused): east's watchers on what is not theirs."""
    east = "watcher-slurm-east"
    cases = [(east, ("XADD", f"{PREFIX}:cluster:{other}:events:slurm", "*", "e", "{}")) for other in ("west", "lab")]
    cases += [(east, ("SET", f"{PREFIX}:cluster:west:leader:slurm", "x")),
              (east, ("SET", f"{PREFIX}:cluster:west:leader:slurm:token", "99999999")),
              (east, ("GET", f"{PREFIX}:cluster:west:leader:slurm:token")),
              (east, ("XADD", f"{PREFIX}:cluster:east:events:kube", "*", "e", "{}")),
              (east, ("XADD", f"{PREFIX}:cluster:east:events", "*", "e", "{}")),
              (east, ("XADD", f"{PREFIX}:events:slurm", "*", "e", "{}")),
              (east, ("SET", f"{PREFIX}:leader:slurm", "x")),
              (east, ("XRANGE", f"{PREFIX}:cluster:east:events:slurm", "-", "+")),
              ("watcher-kube-west", ("XADD", f"{PREFIX}:cluster:east:events:kube", "*", "e", "{}")),
              ("watcher-kube-west", ("SET", f"{PREFIX}:cluster:east:leader:kube", "x"))]
    return cases


@pytest.mark.parametrize(("user", "command"), _refused_across_clusters(),
                         ids=lambda v: v if isinstance(v, str) else " ".join(v[:2]))
def test_a_clusters_watcher_cannot_write_another_clusters_stream_or_lock(
    multi: AclRedis, user: str, command: tuple[str, ...]
) -> None:
    client = multi.client(user)
    kind, cluster = user.removeprefix("watcher-").split("-", 1)
    assert client.xadd(f"{PREFIX}:cluster:{cluster}:events:{kind}", {"e": "{}"})  # its own: allowed
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.execute_command(*command)


def test_a_clusters_watcher_cannot_take_another_clusters_lock(multi: AclRedis) -> None:
    """The real lock, as east's Slurm watcher would make it for west (a misconfigured cluster name with
    east's credential), is refused: the watcher cannot lead west or draw west's fencing tokens."""
    settings = _watched(multi, "west").model_copy(
        update={"broker": _watched(multi, "east").broker})
    lock = make_lock(settings, "slurm")
    assert not lock.acquire_or_renew()
    assert any(d.startswith("watcher-slurm-east ") for d in multi.denials())  # the ACL said no
    admin = multi.client(ADMIN_USER)
    assert admin.get(f"{PREFIX}:cluster:west:leader:slurm") is None
    assert admin.get(f"{PREFIX}:cluster:west:leader:slurm:token") is None
