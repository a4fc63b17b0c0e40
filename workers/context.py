"""Per-process resources of a worker: database engine, adapters, the workflow, Redis.

Built lazily on first use *in the process that uses them* (Celery's prefork children must not inherit
their parent's sockets), and rebuilt if the pid changes.

Why: docs/running.md#the-workers
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from functools import cached_property

import redis
from sqlalchemy import Engine as SAEngine
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.bus import Keys
from remediation.adapters.factory import AdaptersByPolicy, redis_client
from remediation.clock import SystemClock
from remediation.db.intents import StepIntents
from remediation.db.session import make_engine, make_session_factory
from remediation.profiles.rules import Governance
from remediation.profiles.service import governance
from remediation.services.workflow import Workflow
from remediation.settings import Settings


@dataclass
class Runtime:
    settings: Settings

    @cached_property
    def db(self) -> SAEngine:
        return make_engine(self.settings.database)

    @cached_property
    def sessions(self) -> sessionmaker[Session]:
        return make_session_factory(self.db)

    @cached_property
    def workflow(self) -> Workflow:
        return Workflow(
            self.sessions, AdaptersByPolicy.build(self.settings, intents=StepIntents(self.sessions)), self.settings,
            clock=SystemClock(),
            worker=f"{socket.gethostname()}:{os.getpid()}",
        )

    @cached_property
    def governance(self) -> Governance:
        return governance(self.settings)

    @cached_property
    def redis(self) -> redis.Redis:
        return redis_client(self.settings, timeout=10.0)  # a batch read of the stream, never a blocking one

    @property
    def embedded(self) -> bool:
        """Events live in process memory (remediation.adapters.memstream), not in Redis."""
        return self.settings.broker.redis_url.startswith("memory://")

    @property
    def keys(self) -> Keys:
        return Keys(self.settings.broker.key_prefix)


_runtime: tuple[int, Runtime] | None = None


def runtime(settings: Settings) -> Runtime:
    global _runtime
    if _runtime is None or _runtime[0] != os.getpid() or _runtime[1].settings is not settings:
        _runtime = (os.getpid(), Runtime(settings))
    return _runtime[1]
