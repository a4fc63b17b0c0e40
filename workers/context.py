"""Per-process resources of a worker: database engine, each cluster's adapters and workflow, Redis.

Built lazily on first use *in the process that uses them* (Celery's prefork children must not inherit
their parent's sockets), and rebuilt if the pid changes. A worker serves every cluster of
``settings.fleet()``; each has its own workflow, with its own adapters, over sessions scoped to it.

Why: docs/running.md#the-workers
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field, replace
from functools import cached_property

import redis
from sqlalchemy import Engine as SAEngine
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.bus import Keys
from remediation.adapters.factory import AdaptersByPolicy, rack_power_backend, redis_client
from remediation.clock import SystemClock
from remediation.db.intents import StepIntents
from remediation.db.models import DomainRepair, DomainRepairStep, Remediation
from remediation.db.scope import scoped
from remediation.db.session import make_engine, make_session_factory
from remediation.domain_repair.service import DomainRepairs
from remediation.profiles.rules import Governance
from remediation.profiles.service import governance
from remediation.services.workflow import Workflow
from remediation.settings import Settings

#: Remediations whose cluster a process remembers (a remediation never changes cluster).
KNOWN_CLUSTERS = 65_536


@dataclass
class Runtime:
    settings: Settings
    _cluster_of: dict[int, str] = field(default_factory=dict)

    @cached_property
    def db(self) -> SAEngine:
        return make_engine(self.settings.database)

    @cached_property
    def sessions(self) -> sessionmaker[Session]:
        """Sessions that see every cluster: for what names a row by id, never for acting on a node."""
        return make_session_factory(self.db)

    @cached_property
    def clusters(self) -> dict[str, Settings]:
        """Each cluster served, with the settings that act on it."""
        return self.settings.fleet()

    @cached_property
    def workflows(self) -> dict[str, Workflow]:
        """Each cluster's workflow: its adapters, over sessions that reach its rows only."""
        return {name: self._workflow(name, cfg) for name, cfg in self.clusters.items()}

    def _workflow(self, name: str, cfg: Settings) -> Workflow:
        sessions = scoped(self.sessions, name)
        return Workflow(sessions, AdaptersByPolicy.build(cfg, intents=StepIntents(sessions)), cfg,
                        clock=SystemClock(), worker=f"{socket.gethostname()}:{os.getpid()}")

    @cached_property
    def repairs(self) -> dict[str, DomainRepairs]:
        """Each cluster's domain repairs, over its workflow's sessions and adapters."""
        return {name: self._repairs(wf) for name, wf in self.workflows.items()}

    def _repairs(self, wf: Workflow) -> DomainRepairs:
        """A cluster's domain repairs: its workflow's adapters, with intents (the checkpoint request, the
        rack's reset) kept on the domain repair's own step rows."""
        intents = StepIntents(wf.sessions, DomainRepairStep)
        adapters = replace(wf.adapters, intents=intents, rack=rack_power_backend(wf.settings, intents))
        return DomainRepairs(wf.sessions, adapters, wf.settings, clock=wf.clock, worker=wf.worker)

    def repairs_for(self, repair_id: int) -> DomainRepairs | None:
        """The domain repairs of the cluster repair ``repair_id`` is in (None: no such repair, or a
        cluster this worker does not serve)."""
        with self.sessions() as s:
            cluster = s.scalar(select(DomainRepair.cluster).where(DomainRepair.id == repair_id))
        return self.repairs.get(cluster) if cluster is not None else None

    def workflow_for(self, remediation_id: int) -> Workflow | None:
        """The workflow of the cluster remediation ``remediation_id`` is in, as the database records it
        (None: no such remediation, or a cluster this worker does not serve)."""
        cluster = self.cluster_for(remediation_id)
        return self.workflows.get(cluster) if cluster is not None else None

    def cluster_for(self, remediation_id: int) -> str | None:
        """The cluster of remediation ``remediation_id``, as the database records it (None: no such one)."""
        cluster = self._cluster_of.get(remediation_id)
        if cluster is None:
            with self.sessions() as s:
                cluster = s.scalar(select(Remediation.cluster).where(Remediation.id == remediation_id))
            if cluster is None:
                return None
            if len(self._cluster_of) >= KNOWN_CLUSTERS:
                self._cluster_of.clear()
            self._cluster_of[remediation_id] = cluster
        return cluster

    @cached_property
    def governances(self) -> dict[str, Governance]:
        return {name: governance(cfg) for name, cfg in self.clusters.items()}

    @cached_property
    def redis(self) -> redis.Redis:
        return redis_client(self.settings, timeout=10.0)  # a batch read of the stream, never a blocking one

    @property
    def embedded(self) -> bool:
        """Events live in process memory (remediation.adapters.memstream), not in Redis."""
        return self.settings.broker.redis_url.startswith("memory://")

    @property
    def keys(self) -> Keys:
        """Every stream of every cluster served."""
        return Keys(self.settings.broker.key_prefix, served=tuple(self.clusters))


_runtime: tuple[int, Runtime] | None = None


def runtime(settings: Settings) -> Runtime:
    global _runtime
    if _runtime is None or _runtime[0] != os.getpid() or _runtime[1].settings is not settings:
        _runtime = (os.getpid(), Runtime(settings))
    return _runtime[1]
