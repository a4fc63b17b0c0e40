"""Scenarios 11, 12 and 14: the service never makes a bad day worse.

- **11, job safety on the real slurmctld.** A job runs (``sbatch -w NODE --wrap "sleep 600"``, state R)
  and a researcher sets the node FAIL. Nothing destructive happens while the job is R: the barrier is
  the drain step's own check count (the step looked N times while the job ran), not a sleep. After
  ``scancel`` the remediation proceeds and succeeds. With ``on_jobs_timeout=requeue`` the job is
  requeued by ``scontrol requeue`` (checked with ``scontrol show job``), audited with its id.
- **12, a latching breaker in a storm on the real slurmctld.** Three of four nodes fail with the same
  reason ("leaf switch lost"). The breaker opens; with a short ``breaker_window_s`` the window slides,
  and still nothing reaches the VM step (each held remediation looked again after the slide). A human
  resumes one node in Slurm, then closes the breaker: that node's remediation is cancelled with our
  cordon given back; the two still bad proceed, one VM action each.
- **14, honest dry-run on Postgres.** Real Celery workers in dry-run over the simulated world, a storm
  big enough to trip the breaker: every step and audit row says "would" and carries ``dry_run``, the
  repeat-offender count and the breaker do not move, the world is untouched, and the page is marked
  DRY-RUN.

Every figure in the suite's table is measured from what happened in the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from remediation.adapters.bus import RedisEventBus
from remediation.adapters.memory import MemoryWorld
from remediation.db.models import AuditLog, Node, Remediation, RemediationStep
from remediation.db.queries import cluster_view, recent_failure_counts
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.ports.dispatch import FollowUp
from remediation.services import lever_rules
from remediation.services.breaker import state as breaker_state
from remediation.services.notify import run_pass
from remediation.services.workflow import RetryLater
from remediation.settings import NotifySettings, load_settings
from remediation.workers.celery_app import make_app
from tests.conftest import REDIS_URL
from tests.faults import SOFTWARE_FAULT, show_fault
from tests.integration.slurm.conftest import SlurmCluster, slurm, slurm_cluster  # noqa: F401  (fixtures)
from tests.integration.slurm.test_slurm_workflow import (  # noqa: F401  (fixture)
    Pipeline,
    pipeline,
    rems_of,
    steps_of,
    wait_idle,
)
from tests.integration.workerproc import Worker, wait_for, worker_env
from tests.pace import within
from tests.reliability.conftest import Recorder
from tests.reliability.test_storm import Receiver, receiver  # noqa: F401  (fixture)

CHECKS_WHILE_RUNNING = 5


def submit(slurm: SlurmCluster, node: str, tmp_path: Path, *extra: str) -> str:
    out = slurm.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "-D", str(tmp_path), *extra,
                    "--wrap", "sleep 600")
    return out.stdout.strip().split(";")[0]


def job_field(slurm: SlurmCluster, job: str, name: str) -> str:
    out = slurm.run("scontrol", "show", "job", "-o", job).stdout
    for word in out.split():
        if word.startswith(f"{name}="):
            return word.split("=", 1)[1]
    raise AssertionError(f"no {name} in: {out}")


def wait_running(slurm: SlurmCluster, job: str, node: str) -> None:
    deadline = within(20)
    while (job_field(slurm, job, "JobState"), job_field(slurm, job, "NodeList")) != ("RUNNING", node):
        assert time.monotonic() < deadline, f"job {job} never ran on {node}"
        time.sleep(0.1)


@pytest.mark.scenario("11 job safety: researcher FAIL on a busy node")
def test_no_vm_action_under_a_running_job_then_it_proceeds_after_scancel(
    slurm: SlurmCluster,  # noqa: F811
    pipeline: Callable[..., Pipeline],  # noqa: F811
    tmp_path: Path,
    scenario_figures: Recorder,
) -> None:
    p = pipeline()
    node = "gpu-node-1"
    job = submit(slurm, node, tmp_path)
    wait_running(slurm, job, node)
    with p.watching():
        slurm.scontrol("update", f"nodename={node}", "state=fail", "reason=gpu fell off the bus")
        event = p.wait_event(node, 5.0)
        (f,) = p.take_opened()
        states_seen = set()
        checks_while_running = 0
        for i in range(CHECKS_WHILE_RUNNING):
            f = p.engine.run(f.remediation_id, f.step)
            assert f is not None and f.step == "slurm_drain"
            checks_while_running += job_field(slurm, job, "JobState") == "RUNNING"
            assert checks_while_running == i + 1  # the job was R at this check
            states_seen.add("+".join(sorted(s for s in [slurm.nodes_now()[node][0], *slurm.nodes_now()[node][1]])))
            time.sleep(f.countdown)
        (rem,) = rems_of(p.sessions, node)
        (drain,) = steps_of(p.sessions, rem.id)
        vm_calls_while_running = len(p.vm.by_key)  # type: ignore[attr-defined]
        assert drain.checks == CHECKS_WHILE_RUNNING and drain.detail["jobs"] == [job]
        assert rem.wait_reason == f"waiting for 1 job ({job}) to leave"
        assert vm_calls_while_running == 0
        slurm.run("scancel", job)
        cancelled = time.monotonic()
        p.settle([f])
        took = time.monotonic() - cancelled
    (rem,) = rems_of(p.sessions, node)
    rows = steps_of(p.sessions, rem.id)
    lost = scenario_figures.record(
        db=p.sessions,
        duplicate_actions=len(p.vm.by_key) - 1, recovery_s=round(took, 2),  # type: ignore[attr-defined]
        notes=(f"event {event.state}; slurm_drain checked {rows[0].checks}x, {checks_while_running} of them while "
               f"job {job} was R; {vm_calls_while_running} VM actions while it ran; node seen as "
               f"{', '.join(sorted(states_seen))}; recovery = scancel to remediation succeeded"),
    )
    assert not lost, f"{lost} published events are not in Postgres"
    assert rem.status == "succeeded", [(r.step, r.status, r.outcome, r.error) for r in rows]
    assert [r.step for r in rows][-3:] == ["vm_restart", "verify", "return"]
    assert len(p.vm.by_key) == 1  # type: ignore[attr-defined]
    assert "trigger cleared" in rows[-2].outcome
    wait_idle(slurm, node)


@pytest.mark.scenario("11 job safety: on_jobs_timeout=requeue")
def test_on_jobs_timeout_requeue_requeues_the_job(
    slurm: SlurmCluster,  # noqa: F811
    pipeline: Callable[..., Pipeline],  # noqa: F811
    tmp_path: Path,
    scenario_figures: Recorder,
) -> None:
    p = pipeline()
    p.settings = p.settings.model_copy(update={"workflow": p.settings.workflow.model_copy(
        update={"drain_timeout_s": 3, "on_jobs_timeout": "requeue"})})
    node = "gpu-node-2"
    job = submit(slurm, node, tmp_path, "--requeue")
    wait_running(slurm, job, node)
    with p.watching():
        slurm.scontrol("update", f"nodename={node}", "state=fail", "reason=ecc storm")
        p.wait_event(node, 5.0)
        (f,) = p.take_opened()
        started = time.monotonic()
        p.settle([f], timeout=90)
        took = time.monotonic() - started
    (rem,) = rems_of(p.sessions, node)
    with p.sessions() as s:
        requeued = s.scalars(select(AuditLog).where(AuditLog.action == "jobs_requeued")).all()
    restarts = int(job_field(slurm, job, "Restarts"))
    state, where = job_field(slurm, job, "JobState"), job_field(slurm, job, "NodeList")
    lost = scenario_figures.record(
        db=p.sessions, duplicate_actions=len(requeued) - 1,
        recovery_s=round(took, 2),
        notes=f"job {job} requeued after drain_timeout_s={p.settings.workflow.drain_timeout_s} (Restarts={restarts}, now {state} on {where}); "
              f"{len(requeued)} jobs_requeued audit row(s) naming it; remediation {rem.status}",
    )
    assert not lost, f"{lost} published events are not in Postgres"
    assert rem.status == "succeeded"
    assert [(a.target, a.detail["jobs"]) for a in requeued] == [(node, [job])]
    assert restarts == 1 and where != node  # requeued: pending again, or running elsewhere
    slurm.run("scancel", job)
    wait_idle(slurm, node)


@pytest.mark.scenario("12 latching breaker: storm on the real slurmctld")
def test_latching_breaker_holds_past_the_window_until_closed_on_the_real_slurmctld(
    slurm: SlurmCluster,  # noqa: F811
    pipeline: Callable[..., Pipeline],  # noqa: F811
    scenario_figures: Recorder,
) -> None:
    window = 10
    p = pipeline(breaker_max_fraction=0.5, breaker_min_failures=2, breaker_window_s=window)
    failing = ["gpu-node-0", "gpu-node-1", "gpu-node-2"]
    with p.watching():
        for node in failing:
            slurm.scontrol("update", f"nodename={node}", "state=fail", f"reason={SOFTWARE_FAULT}")
        p.wait_until(lambda: len(p.opened) == len(failing), 10, "three remediations opened")
        todo = p.take_opened()
        opened_at = time.monotonic()
        looks_after_slide: dict[int, int] = {f.remediation_id: 0 for f in todo}
        queue = list(todo)
        # Run every held remediation until the window has slid past all three failures, and then
        # until each has looked again at least three times: none may reach the VM step.
        while min(looks_after_slide.values()) < 3:
            nxt_queue = []
            for f in queue:
                try:
                    nxt = p.engine.run(f.remediation_id, f.step)
                except RetryLater as exc:
                    nxt = FollowUp(f.remediation_id, f.step, exc.countdown)
                assert nxt is not None
                assert nxt.step in ("slurm_drain", "k8s_cordon", "k8s_evict"), nxt
                if time.monotonic() - opened_at > window + 1 and nxt.step == "k8s_evict":
                    looks_after_slide[f.remediation_id] += 1
                nxt_queue.append(nxt)
            queue = nxt_queue
            p.ingest()
            time.sleep(max(f.countdown for f in queue))
        held_for = time.monotonic() - opened_at
        with p.sessions() as s:
            latch = breaker_state(s)
            waits = [r.wait_reason or "" for r in s.scalars(select(Remediation))]
        assert latch["open"] is True and "until a human closes it" in waits[0]
        vm_while_open = len(p.vm.by_key)  # type: ignore[attr-defined]
        assert vm_while_open == 0
        drained = {n: slurm.nodes_now()[n] for n in failing}
        assert all("DRAIN" in flags and reason.startswith("remediation:") for _, flags, reason in drained.values())
        # The switch is fixed; a human resumes one node, looks, and closes the breaker.
        slurm.scontrol("update", "nodename=gpu-node-0", "state=resume")
        p.wait_event("gpu-node-0", 5.0, kind="healthy")
        closed = time.monotonic()
        with p.sessions() as s, s.begin():
            followups = lever_rules.close_breaker(s, "oncall", "leaf switch replaced", now=datetime.now(UTC))
        assert sorted(f.remediation_id for f in followups) == sorted(looks_after_slide)
        p.settle(followups, timeout=120)
        recovery = time.monotonic() - closed
    status = {n: rems_of(p.sessions, n)[-1] for n in failing}
    vm_nodes = sorted(op.vm.name for op in p.vm.by_key.values())  # type: ignore[attr-defined]
    kube0 = p.world.node("gpu-node-0")["k8s"]
    resumed_cancelled = [n for n in failing if status[n].status == "cancelled"]
    with p.sessions() as s:
        opened = len(s.scalars(select(AuditLog).where(AuditLog.action == "breaker_open")).all())
    lost = scenario_figures.record(
        db=p.sessions,
        duplicate_actions=len(vm_nodes) - len(set(vm_nodes)), recovery_s=round(recovery, 2),
        notes=(f"{len(failing)}/{len(slurm.nodes_now())} nodes failed ('leaf switch lost'); breaker held "
               f"{held_for:.1f}s, window {window}s; {sum(looks_after_slide.values())} looks after the slide, "
               f"{vm_while_open} VM actions while open; after close: {len(resumed_cancelled)} resumed node "
               f"cancelled (cordon given back: {not kube0['unschedulable']}), {len(vm_nodes)} proceeded; "
               f"{opened} breaker_open row; recovery = close to last remediation done"),
    )
    assert not lost, f"{lost} published events are not in Postgres"
    assert status["gpu-node-0"].status == "cancelled" and "healthy again" in (status["gpu-node-0"].outcome or "")
    assert not kube0["unschedulable"]
    assert [status[n].status for n in failing[1:]] == ["succeeded", "succeeded"]
    assert vm_nodes == failing[1:]
    assert opened == 1
    for node in failing:
        wait_idle(slurm, node)


@pytest.mark.scenario("14 honest dry-run (Postgres, real workers)")
def test_dry_run_storm_writes_would_everywhere_and_counts_nothing(
    pg_url: str, redis_prefix: str, tmp_path: Path, receiver: Receiver, scenario_figures: Recorder,  # noqa: F811
) -> None:
    pool = 16
    nodes = [f"gpu-node-{i}" for i in range(pool)]
    failing = nodes[:8]  # 50%: a real run would trip the breaker (10%) at once
    world = MemoryWorld(nodes=nodes, journal=tmp_path / "world.json")
    world.set_slurm("gpu-node-1", state="ALLOCATED")
    world.set_jobs("gpu-node-1", ["4242"])  # a busy node: dry-run says it would wait for the job
    for n in failing:  # Slurm shows them failed, as the watcher saw: nothing of ours changes that
        show_fault(world, n, "FAIL", SOFTWARE_FAULT)
    before = world.snapshot()["nodes"]
    env = worker_env(pg_url, REDIS_URL, redis_prefix, tmp_path,
                     REMEDIATION_DRY_RUN="true", REMEDIATION_MEMORY__NODES=f"gpu-node-[0-{pool - 1}]",
                     REMEDIATION_WORKFLOW__DRAIN_TIMEOUT_S="2",  # the busy node pages (jobs_timeout)
                     REMEDIATION_NOTIFY__WEBHOOK_URL=receiver.url)
    client = redis.Redis.from_url(REDIS_URL)
    app = make_app(load_settings(broker={"redis_url": REDIS_URL, "key_prefix": redis_prefix}))
    bus = RedisEventBus(client, redis_prefix, kick=lambda: app.send_task("remediation.ingest", queue="ingest"))
    db = create_engine(pg_url, poolclass=NullPool)
    settings = load_settings()

    def count(*where: object) -> int:
        with Session(db) as s:
            return int(s.scalar(select(func.count()).select_from(Remediation).where(*where)) or 0)  # type: ignore[arg-type]

    now = lambda: datetime.now(UTC)  # noqa: E731
    workers = [Worker(env, tmp_path, concurrency=3)]
    started = time.monotonic()
    try:
        bus.publish([NodeEvent(source=Source.SLURM, node=n, kind=EventKind.INVENTORY, state="IDLE",
                               observed_at=now()) for n in nodes])
        wait_for(lambda: count() == 0 and _nodes(db) == pool, 30, "the inventory", workers[0])
        bus.publish([NodeEvent(source=Source.SLURM, node=n, kind=EventKind.UNHEALTHY, state="IDLE+FAIL",
                               reason=SOFTWARE_FAULT, observed_at=now()) for n in failing])
        # All but the busy node finish; the busy one honestly "would wait" for its job (nothing was
        # drained in dry-run, so it keeps waiting while the job runs).
        wait_for(lambda: count(Remediation.status == "succeeded") == len(failing) - 1
                 and count(Remediation.status == "waiting") == 1 and _audits(db, "jobs_timeout") == 1, 60,
                 "the dry-run remediations", workers[0])
    finally:
        for w in workers:
            w.stop()
    took = time.monotonic() - started
    run_pass(sessionmaker(db), NotifySettings(webhook_url=receiver.url))
    with Session(db) as s:
        rems = list(s.scalars(select(Remediation)))
        steps = list(s.scalars(select(RemediationStep)))
        logged = [a for a in s.scalars(select(AuditLog)) if a.target in failing]
        offenders = recent_failure_counts(s, failing, now(), window=settings.policy.repeat_offender_window)
        view = cluster_view(s, now(), settings.policy.breaker_window, exclude=None)
        latch = breaker_state(s)
        busy = next(r for r in rems if r.node == "gpu-node-1")
        busy_drain = next(st for st in steps if st.remediation_id == busy.id and st.step == "slurm_drain")
    say_would = [r for r in steps if (r.outcome or r.error or "").startswith("would")]
    audit_would = [a for a in logged if a.reason.startswith("would") and a.dry_run]
    pages = receiver.posts
    dry_pages = [p for p in pages if "[DRY-RUN]" in str(p.get("text", ""))]
    untouched = world.snapshot()["nodes"] == before and not world.calls()
    lost = scenario_figures.record(
        db=db,
        duplicate_actions=len(world.calls(effect=True)),  # dry-run: any real action is one too many
        notes=(f"{len(failing)}/{pool} nodes failed in {took:.1f}s; {len(say_would)}/{len(steps)} step rows and {len(audit_would)}/{len(logged)} audit rows say "
               f"'would' with dry_run=true; repeat-offender counts {offenders or 'unchanged (none)'}; breaker "
               f"count {view.failed_in_window}, open={bool(latch.get('open'))}; world untouched={untouched}; "
               f"{len(dry_pages)}/{len(pages)} pages marked DRY-RUN; busy node: {busy_drain.outcome!r}"),
    )
    assert not lost, f"{lost} published events are not in Postgres"
    assert len(steps) == (len(failing) - 1) * 6 + 1 and len(say_would) == len(steps), [
        (r.step, r.outcome) for r in steps if r not in say_would]
    assert all(r.dry_run for r in steps) and all(r.dry_run for r in rems)
    assert logged and len(audit_would) == len(logged)
    assert offenders == {} and view.failed_in_window == 0 and not latch.get("open")
    assert untouched
    assert busy.status in ("waiting", "running")  # open: a stopped worker may have been mid-look
    assert (busy_drain.outcome or "").startswith("would (dry-run): held: 1 job (4242) still on gpu-node-1 2s")
    assert pages and len(dry_pages) == len(pages), pages
    db.dispose()
    client.close()


def _nodes(db: object) -> int:
    with Session(db) as s:  # type: ignore[call-overload]
        return int(s.scalar(select(func.count()).select_from(Node)) or 0)


def _audits(db: object, action: str) -> int:
    with Session(db) as s:  # type: ignore[call-overload]
        return int(s.scalar(select(func.count()).select_from(AuditLog).where(AuditLog.action == action)) or 0)
