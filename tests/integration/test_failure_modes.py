"""Missing servers and dry-run: a clear error, nothing lost, nothing changed."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from remediation.adapters.bus import BusUnavailable, Keys, RedisEventBus
from remediation.adapters.stream import Reading, consume
from remediation.clock import SystemClock
from remediation.db.models import Event, RemediationStep
from remediation.db.session import DatabaseUnavailable, check_database, make_engine
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.services.ingest import ingest
from remediation.settings import DatabaseSettings, Settings
from tests.faults import SOFTWARE_FAULT


def event(node: str = "gpu-node-1") -> NodeEvent:
    return NodeEvent(source=Source.SLURM, node=node, kind=EventKind.UNHEALTHY, state="FAIL", reason=SOFTWARE_FAULT,
                     observed_at=datetime.now(UTC))


def test_publishing_without_redis_is_a_clear_error() -> None:
    bus = RedisEventBus(redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=1), "x")
    with pytest.raises(BusUnavailable, match="cannot publish to Redis"):
        bus.publish([event()])


def test_database_down_is_one_clear_sentence() -> None:
    engine = make_engine(DatabaseSettings(url="postgresql+psycopg://postgres@127.0.0.1:1/nope"))
    with pytest.raises(DatabaseUnavailable, match=r"cannot reach database postgresql\+psycopg://postgres@127.0.0.1:1/nope"):
        check_database(engine)


def test_unmigrated_database_says_so(tmp_path: Path) -> None:
    engine = make_engine(DatabaseSettings(url=f"sqlite:///{tmp_path / 'empty.db'}"))
    with pytest.raises(DatabaseUnavailable, match="not migrated: run `remediation db upgrade`"):
        check_database(engine)


def test_events_survive_a_postgres_outage(redis_client: redis.Redis, redis_prefix: str, pg_url: str) -> None:
    """The ingest acknowledges stream entries only after its commit: a failed batch stays pending and is
    claimed and recorded once Postgres is back."""
    bus = RedisEventBus(redis_client, redis_prefix)
    bus.publish([event("gpu-node-1"), event("gpu-node-2")])
    keys = Keys(redis_prefix)
    policy = Settings().policy
    down = sessionmaker(create_engine("postgresql+psycopg://postgres@127.0.0.1:1/x", poolclass=NullPool))

    def handle_with(sessions: sessionmaker[Session]):  # noqa: ANN202
        def handle(payloads) -> None:  # noqa: ANN001
            with sessions() as s, s.begin():
                ingest(s, payloads, policy, clock=SystemClock())
        return handle

    with pytest.raises(OperationalError):
        consume(redis_client, keys, handle_with(down), reading=Reading(batch=100, claim_idle_ms=0))
    assert redis_client.xlen(keys.stream) == 2  # still there, pending for the dead attempt
    up_engine = create_engine(pg_url, poolclass=NullPool)
    handled = consume(redis_client, keys, handle_with(sessionmaker(up_engine)), reading=Reading(batch=100,
        claim_idle_ms=0))
    assert handled == 2 and redis_client.xlen(keys.stream) == 0
    with Session(up_engine) as s:
        assert sorted(s.scalars(select(Event.node))) == ["gpu-node-1", "gpu-node-2"]
    up_engine.dispose()


# resume is not among them: the (real) reader shows the node was never drained, so nothing is ours to resume.
EXPECTED_WOULD = ["drain", "cordon", "evict pods", "restart", "untaint", "uncordon"]


def test_dry_run_records_every_step_and_changes_nothing(sessions: sessionmaker[Session]) -> None:
    from remediation.adapters.factory import make_adapters
    from remediation.adapters.memory import MemoryWorld
    from remediation.adapters.noop import NoopKube, NoopSlurm
    from remediation.clock import FakeClock
    from remediation.ports.dispatch import FollowUp
    from remediation.services.workflow import Workflow

    settings = Settings(dry_run=True, slurm={"backend": "memory"}, kube={"backend": "memory"},
                        machine={"backend": "memory"}, policy={"min_restart_gap_s": 0})
    world = MemoryWorld(nodes=["gpu-node-5"])
    world.set_slurm("gpu-node-5", flags=["FAIL"], reason=SOFTWARE_FAULT, user="researcher")  # the event's fault
    shown = world.node("gpu-node-5")["slurm"]
    adapters = make_adapters(settings, world)
    assert isinstance(adapters.slurm, NoopSlurm) and isinstance(adapters.kube, NoopKube)
    clock = FakeClock()
    with sessions() as s, s.begin():
        opened = ingest(s, [event("gpu-node-5").to_json()], settings.policy, clock=clock).opened
    engine = Workflow(sessions, adapters, settings, clock=clock)
    todo = [FollowUp(rid, step) for rid, step in opened]
    while todo:
        f = todo.pop()
        clock.advance(f.countdown)
        nxt = engine.run(f.remediation_id, f.step)
        todo += [nxt] if nxt else []
    with sessions() as s:
        steps = s.scalars(select(RemediationStep.step).order_by(RemediationStep.id)).all()
    assert steps == ["slurm_drain", "k8s_cordon", "k8s_evict", "vm_restart", "verify", "return"]
    would = [a["would"] for a in adapters.slurm.record.actions]
    assert would == EXPECTED_WOULD
    assert world.calls() == []  # the world was read, never changed
    assert world.node("gpu-node-5")["slurm"] == shown  # still the researcher's FAIL: never drained


def test_a_payload_the_database_refuses_costs_one_row_not_the_stream(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence in depth: if the database ever refuses a batch for its content (a DataError, not an
    outage), the batch is recorded payload by payload and the refused one is kept in rejected_events;
    otherwise that batch would be claimed and refused forever, blocking every event behind it."""
    from sqlalchemy.exc import DataError

    import remediation.services.ingest as ingest_module
    from remediation.db.models import RejectedEvent
    from remediation.services.ingest import ingest_batch

    real = ingest_module.ingest

    def picky(session, payloads, policy, **options):  # noqa: ANN001, ANN002, ANN003, ANN202
        if any(b"poison" in (p if isinstance(p, bytes) else p.encode()) for p in payloads):
            raise DataError("INSERT ...", {}, Exception("invalid byte sequence for encoding"))
        return real(session, payloads, policy, **options)

    monkeypatch.setattr(ingest_module, "ingest", picky)
    engine = create_engine(pg_url, poolclass=NullPool)
    sessions = sessionmaker(engine)
    poison = event("gpu-node-3").model_copy(update={"reason": "poison"}).to_json()
    result = ingest_batch(sessions, [event("gpu-node-1").to_json(), poison, event("gpu-node-2").to_json()],
                          Settings().policy, clock=SystemClock())
    assert (result.recorded, result.rejected) == (2, 1)
    with Session(engine) as s:
        (row,) = s.scalars(select(RejectedEvent)).all()
        assert "poison" in row.payload and row.error == "could not be recorded: invalid byte sequence for encoding"
        assert sorted(s.scalars(select(Event.node))) == ["gpu-node-1", "gpu-node-2"]
    engine.dispose()

    def down(session, payloads, policy, clock, *rest, **options):  # noqa: ANN001, ANN002, ANN003, ANN202
        raise OperationalError("SELECT 1", {}, Exception("connection refused"))

    monkeypatch.setattr(ingest_module, "ingest", down)
    with pytest.raises(OperationalError):  # an outage is not a poison: nothing is rejected, all is retried
        ingest_batch(sessions, [event("gpu-node-4").to_json()], Settings().policy, clock=SystemClock())
