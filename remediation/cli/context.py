"""What every CLI command shares: the lazily loaded settings and database, the actor, and the rule that an
error is one line on stderr and a non-zero exit (1 the request, 2 configuration or usage, 3 the database),
never a traceback.

Why: docs/running.md#the-cli
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

import typer
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters import logs
from remediation.clock import SystemClock
from remediation.db.scope import scoped
from remediation.db.session import DatabaseUnavailable, check_database, make_engine, make_session_factory
from remediation.incidents.service import IncidentError
from remediation.ports.dispatch import Dispatcher, SweeperOnly
from remediation.ports.errors import RemediationError
from remediation.profiles.service import governance
from remediation.repair_requests.service import RepairNotFound, RepairRefused
from remediation.services.audit import VIA
from remediation.services.clusters import AmbiguousNode
from remediation.services.lever_rules import LeverError
from remediation.services.levers import LeverService
from remediation.services.readmodels import ReadModelError
from remediation.settings import Settings, SettingsError, load_settings
from remediation.vocabulary import checked_cluster

log = logging.getLogger(__name__)

EXIT_REQUEST, EXIT_CONFIG, EXIT_DATABASE = 1, 2, 3

P = ParamSpec("P")
R = TypeVar("R")


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_REQUEST) -> None:
        super().__init__(message)
        self.code = code


def default_actor() -> str:
    return os.environ.get("USER") or os.environ.get("LOGNAME") or "unknown"


DispatcherFactory = Callable[[Settings], Dispatcher]


def no_broker(settings: Settings) -> Dispatcher:
    """Where levers' follow-ups go when nobody passed a broker: to the sweeper (see SweeperOnly)."""
    return SweeperOnly()


@dataclass
class State:
    """Per-invocation state hung on the click context (``ctx.obj``)."""

    actor: str
    dispatcher_factory: DispatcherFactory = no_broker
    server: str | None = None  # --server: reads and levers go through the API (remediation.cli.remote)
    token: str | None = None  # the bearer token for --server
    remote: Any = None  # the API client, once built (closed with the state)
    cluster: str | None = None  # --cluster: only this cluster (None: every cluster; a node's own for a lever)
    _settings: Settings | None = None
    _engine: Engine | None = None
    _sessions: sessionmaker[Session] | None = None
    clock: SystemClock = field(default_factory=SystemClock)

    def settings(self) -> Settings:
        if self._settings is None:
            try:
                self._settings = load_settings()
            except SettingsError as exc:
                raise CliError(str(exc), EXIT_CONFIG) from None
            logs.configure_from(self._settings)
        return self._settings

    def sessions(self) -> sessionmaker[Session]:
        if self._sessions is None:
            self._engine = make_engine(self.settings().database)
            check_database(self._engine)
            self._sessions = make_session_factory(self._engine)
            self._sessions.configure(info={VIA: "db"})  # audit rows written from here say via=db
        return self._sessions

    def now(self) -> datetime:
        return self.clock.now()

    def levers(self, cluster: str | None = None) -> LeverService:
        """The lever service, with the dispatcher the console script passed in (built after --config);
        with ``cluster``, over sessions scoped to it (its rows, its audit, its controls)."""
        settings = self.settings()
        service = LeverService(self.sessions(), self.dispatcher_factory(settings), settings.policy,
                               clock=self.clock, via="db", governance=governance(settings))
        return service if cluster is None else service.in_cluster(cluster)

    def reading(self, cluster: str | None = None) -> Session:
        """A session for a read: scoped to ``cluster`` (else ``--cluster``), or seeing every cluster."""
        cluster = cluster or self.cluster
        return (self.sessions() if cluster is None else scoped(self.sessions(), cluster))()

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()
        if self._engine is not None:
            self._engine.dispose()


CLUSTER = typer.Option(None, "--cluster", metavar="NAME",
                       help="Only this cluster (default: every cluster; a lever on a node acts in the node's "
                       "own cluster, and needs --cluster only when the name is in several).")


def state(ctx: typer.Context, cluster: str | None = None) -> State:
    """The invocation's state; ``cluster`` is the command's ``--cluster`` (checked: a DNS label)."""
    obj = ctx.find_object(State)
    if obj is None:  # a sub-app invoked on its own (tests, embedding): defaults
        obj = State(actor=default_actor())
        ctx.obj = obj
    if cluster is not None:
        try:
            obj.cluster = checked_cluster(cluster)
        except ValueError as exc:
            raise CliError(f"--cluster: {exc}", EXIT_CONFIG) from None
    return obj


def one_line(text: str) -> str:
    """Multi-line messages (pydantic's list of bad fields) folded into one greppable line."""
    out = ""
    for part in (p.strip() for p in str(text).strip().splitlines()):
        if part:
            out += part if not out else (" " if out.endswith(":") else "; ") + part
    return out


def fail(message: str, code: int = EXIT_REQUEST) -> typer.Exit:
    typer.echo(f"error: {one_line(message)}", err=True)
    return typer.Exit(code)


def cli_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn every failure of a command into ``error: <one line>`` and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except CliError as exc:
            raise fail(str(exc), exc.code) from None
        except AmbiguousNode as exc:  # a usage error: the user must say which cluster
            raise fail(str(exc), EXIT_CONFIG) from None
        except (ReadModelError, LeverError, IncidentError, RepairNotFound, RepairRefused) as exc:
            raise fail(str(exc)) from None
        except DatabaseUnavailable as exc:
            raise fail(str(exc), EXIT_DATABASE) from None
        except RemediationError as exc:  # a backend read directly (the evidence store): its one line
            raise fail(exc.message) from None
        except SQLAlchemyError as exc:
            orig: Any = getattr(exc, "orig", None) or exc
            raise fail(f"database error: {type(orig).__name__}: {orig}", EXIT_DATABASE) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except Exception as exc:  # a bug: still one line for on-call; the traceback goes to debug logs
            log.debug("unexpected error", exc_info=True)
            raise fail(f"unexpected {type(exc).__name__}: {exc}") from None

    return wrapper
