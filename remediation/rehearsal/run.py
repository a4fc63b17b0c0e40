"""Rehearse a policy: replay a failure trace through the real ingest and workflow, on a simulated clock.

:func:`rehearse` sets the stage (a throw-away in-memory SQLite database, the in-memory world and its
fleet and topology, adapters from the one adapter factory) and hands the trace to
:mod:`remediation.rehearsal.loop`; :mod:`remediation.rehearsal.report` reads the figures.

Why: docs/rehearsal.md#how-the-rehearsal-is-built
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from remediation.adapters.factory import AdaptersByPolicy, memory_adapters, memory_world
from remediation.clock import FakeClock
from remediation.db.models import Node
from remediation.db.session import make_session_factory, memory_engine
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.hostlist import expand
from remediation.profiles.metrics import BASE
from remediation.profiles.rules import winners
from remediation.profiles.service import facts_of, refresh_pools
from remediation.rehearsal.goodput import JobModel, policy_facts, replay
from remediation.rehearsal.loop import Loop, Rehearsal, Tally
from remediation.rehearsal.report import Report, fabric_quarantines, read_report, world_figures
from remediation.rehearsal.trace import Fault, leaf_of
from remediation.rehearsal.world import WorldJobs
from remediation.services.ingest import IngestRules, ingest
from remediation.services.workflow import Workflow
from remediation.settings import ProfileSettings, Settings


@functools.lru_cache(maxsize=1)
def _migrated_template() -> Path:
    """One migrated SQLite file per process: each rehearsal copies it into memory (a second policy or
    another seed costs no second migration). Alembic is imported here, not at the top: every CLI
    start imports this module, and only a rehearsal migrates."""
    from remediation.db.migrate import upgrade

    root = Path(tempfile.mkdtemp(prefix="remediation-rehearsal-"))
    atexit.register(shutil.rmtree, root, True)
    path = root / "template.db"
    upgrade(f"sqlite:///{path}")
    return path


@dataclass(frozen=True)
class Pace:
    """How simulated time passes: a machine action's reboot, a human's repair, a GPU reset, a GPU
    check and the evidence job take ``reboot_s``, ``repair_s``, ``reset_s``, ``check_s`` and ``evidence_s``; the rehearsal ends ``settle``
    after the last fault's repair. ``loop`` picks the event loop (default) or the original polling
    loop (see :mod:`remediation.rehearsal.loop`); the two decide the same."""

    reboot_s: float = 600.0
    repair_s: float = 4 * 3600.0
    reset_s: float = 120.0
    check_s: float = 120.0
    evidence_s: float = 10.0
    settle: timedelta = timedelta(days=1)
    loop: Loop = "events"


@dataclass(frozen=True)
class Layout:
    """What the rehearsal knows of its nodes beyond their names, and how it reads them out.
    ``leaf_size``: nodes per leaf switch (None: no topology is published). ``facts``: what the watchers
    would report of the nodes (partitions, features, labels), which the settings' profiles select on;
    with profiles, every figure is reported for each profile's pool too. ``report_by``: the profiles
    whose pools the figures are broken down by (default: the settings' own), so that a policy without
    profiles can be read pool by pool beside one with them. ``jobs``: the training jobs packed onto the
    nodes, whose ETTR the rehearsal reports (:mod:`remediation.rehearsal.goodput`)."""

    leaf_size: int | None = None
    facts: list[NodeGroup] | None = None
    report_by: Sequence[ProfileSettings] | None = None
    jobs: JobModel = JobModel()


def rehearse(faults: list[Fault], settings: Settings, nodes: list[str], *, pace: Pace = Pace(),
             layout: Layout = Layout(), progress: Callable[[datetime, Tally], None] | None = None) -> Report:
    """Replay ``faults`` under ``settings``; a second policy is just a second call. ``progress`` is called
    after each event with the simulated time and a tally. What is still open when the rehearsal ends
    is reported so."""
    reboot_s, repair_s, reset_s, check_s = pace.reboot_s, pace.repair_s, pace.reset_s, pace.check_s
    leaf_size, facts, report_by = layout.leaf_size, layout.facts, layout.report_by
    # A throw-away database in memory: durability buys nothing here.
    db = memory_engine(_migrated_template())
    sessions = make_session_factory(db)
    start = faults[0].at if faults else datetime.now().astimezone()
    clock = FakeClock(start - timedelta(seconds=1))
    _inventory(sessions, nodes, clock.now(), groups=facts or [])
    world = memory_world(nodes, clock.now, reboot_s)
    adapters = memory_adapters(world)
    every = WorldJobs(world, clock.now, reset_s=reset_s, check_s=check_s, evidence_s=pace.evidence_s)
    jobs = every if settings.validation.runs_jobs else None
    real = dataclasses.replace(adapters, validator=jobs)
    # A profile's hammer and validation in the world: none is none; any other acts on the world's
    # machines (at this rehearsal's reboot time) and runs the world's jobs.
    engine = Workflow(sessions, AdaptersByPolicy(
        settings, real, base=real, machines=lambda s: None if s.machine.backend == "none" else adapters.machine,
        validators=lambda s: every if s.validation.runs_jobs else None), settings, clock=clock)
    with sessions() as s, s.begin():
        refresh_pools(s, engine.governance)
    if leaf_size:
        # The Slurm watcher's first topology publish: every node's leaf switch, before any fault.
        with sessions() as s, s.begin():
            ingest(s, [_domains_event(name, leaf_size, clock.now()).to_json() for name in nodes],
                   settings.policy, clock=clock, rules=IngestRules(incidents=settings.incidents,
                                                                   governance=engine.governance))
    rehearsal = Rehearsal(engine, world, clock=clock, loop=pace.loop, repair_s=repair_s)
    # Long enough after the last fault for its repair and the remediations after it to finish.
    until = (faults[-1].at if faults else start) + timedelta(seconds=repair_s) + pace.settle
    rehearsal.run(faults, until, progress)
    report = read_report(sessions, len(faults), clock.now())
    report.runs = rehearsal.tally.runs
    report.fabric_quarantines = fabric_quarantines(sessions, faults)
    report.node_hours_out = rehearsal.fleet.close(clock.now())
    report.node_hours_by_class = dict(sorted(rehearsal.fleet.by_class.items()))
    # The jobs' window: the trace's, up to the last fault's repair (the settle day is the policy's, not theirs).
    report.goodput = replay(rehearsal.fleet.spans, nodes, model=layout.jobs,
                            facts=policy_facts(settings.workflow, settings.kube, settings.slurm),
                            window=(start, until - pace.settle))
    if jobs is not None or settings.profiles:
        report.gpu_resets, report.gpu_resets_fixed = len(every.resets), sum(every.resets)
    report.hand_repairs = rehearsal.tally.hand_repairs
    world_figures(world, report)
    if groups := (settings.profiles if report_by is None else report_by):
        report.profiles = by_profile(sessions, faults, clock.now(), world=world,
                                     hours=rehearsal.fleet.by_node, profiles=groups)
    db.dispose()
    return report


def by_profile(sessions: Any, faults: list[Fault], end: datetime, *, world: Any, hours: dict[str, float],
               profiles: Sequence[ProfileSettings]) -> dict[str, dict[str, Any]]:
    """Every figure for each profile's pool (the nodes it selects first), "(base)" for the nodes none does.
    A pool's storm breaker is its own latch's only where the rehearsed settings have that profile."""
    with sessions() as s:
        known = list(facts_of(s).values())
    won = winners(profiles, known)
    pools = {name: set(nodes) for name, nodes in won.items()}
    pools[BASE] = {n.name for n in known} - set().union(*pools.values())
    out = {}
    for name, members in sorted((name, members) for name, members in pools.items() if members):
        mine = [f for f in faults if f.event.node in members]
        sub = read_report(sessions, len(mine), end, nodes=members, profile=None if name == BASE else name)
        sub.fabric_quarantines = fabric_quarantines(sessions, mine)
        sub.node_hours_out = sum(hours.get(n, 0.0) for n in members)
        world_figures(world, sub, members)
        out[name] = {"nodes": len(members), **sub.as_dict()}
    return out


@dataclass(frozen=True)
class NodeGroup:
    """What the watchers would report of the nodes of ``hostlist``: the profiles select on it."""

    hostlist: str
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()


def _inventory(sessions: Any, nodes: list[str], at: datetime, *, groups: list[NodeGroup]) -> None:
    """The whole fleet is known before the first fault, as the watchers' first resync makes it live: the
    storm breaker's pool is the cluster, not the few nodes that have failed so far. A node gets the facts
    of the last group that lists it."""
    facts: dict[str, dict[str, Any]] = {}
    for g in groups:
        for name in expand(g.hostlist):
            facts[name] = {"partitions": list(g.partitions), "features": list(g.features), "labels": dict(g.labels)}
    with sessions() as s, s.begin():
        s.execute(insert(Node), [{"name": n, "status": "healthy", "status_reason": "", "first_seen_at": at,
                                  "updated_at": at, **facts.get(n, {})} for n in nodes])


def _domains_event(name: str, leaf_size: int, now: datetime) -> NodeEvent:
    """What the Slurm watcher publishes for a node cabled to a synthesised leaf switch."""
    leaf = leaf_of(int(name.rsplit("-", 1)[1]), leaf_size)
    return NodeEvent(source=Source.SLURM, node=name, kind=EventKind.DOMAINS, state="topology",
                     domains={"leaf-switch": leaf}, reason=f"leaf-switch={leaf}", observed_at=now,
                     dedupe_key=f"rehearsal:{name}:domains")


