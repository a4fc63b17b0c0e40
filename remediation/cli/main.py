"""The ``remediation`` console script: the on-call CLI plus the commands that start processes.

``worker``, ``beat``, ``watch``, ``demo`` and ``api`` hand the process to its own entry point by name
(``celery -A remediation.workers.celery_app``, ``python -m remediation.watchers.slurm.watcher``, ``python -m remediation.demo.run``,
``python -m remediation.api.serve``); the CLI never imports them. ``db`` runs here. :func:`main` passes
the Celery dispatcher to the lever commands.

Why: docs/architecture.md#the-house-layers-imports-pointing-down
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from remediation.adapters import logs
from remediation.adapters.celery import WORKER_QUEUES
from remediation.cli.completion import PROG
from remediation.cli.oncall import app
from remediation.ports.dispatch import Dispatcher
from remediation.settings import Settings, SettingsError, load_settings, parse_duration


def _settings_or_exit() -> Settings:
    try:
        settings = load_settings()
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    logs.configure_from(settings)  # this process's logging (a process exec'd from here sets up its own)
    return settings


def _exec_module(module: str, *args: str) -> None:
    """Replace this process with ``python -m module args`` (same interpreter, same environment)."""
    os.execvp(sys.executable, [sys.executable, "-m", module, *args])


@app.command("demo")
def demo(
    workdir: Annotated[Path | None, typer.Option(help="Where the demo's SQLite database goes.")] = None,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 180.0,
    port: Annotated[int, typer.Option(help="Dashboard port on 127.0.0.1 while the demo runs (0: any free port).")] = 8080,
) -> None:
    """Run the whole loop on a simulated 32-node cluster (kube-apiserver, GCE, Azure and slurmrestd
    endpoints on 127.0.0.1): SQLite, an in-process broker, the dashboard, no servers to install."""
    args = ["--timeout", str(timeout), "--port", str(port)]
    _exec_module("remediation.demo.run", *(["--workdir", str(workdir)] if workdir else []), *args)


@app.command("worker", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(ctx: typer.Context) -> None:
    """Start a Celery worker (extra arguments go to `celery worker`, e.g. -c 4 -B)."""
    _settings_or_exit()
    _exec_module("celery", "-A", "remediation.workers.celery_app", "worker", "-Q", ",".join(WORKER_QUEUES), *ctx.args)


@app.command("beat", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def beat(ctx: typer.Context) -> None:
    """Start Celery beat (sweeper, ingest safety net, notifications)."""
    _settings_or_exit()
    _exec_module("celery", "-A", "remediation.workers.celery_app", "beat", *ctx.args)


@app.command("watch")
def watch(kind: Annotated[str, typer.Argument(help="slurm or kube")]) -> None:
    """Run a watcher (only the leader publishes; SIGTERM stops it cleanly)."""
    if kind not in ("slurm", "kube"):
        typer.echo(f"error: unknown watcher {kind!r}: choose slurm or kube", err=True)
        raise typer.Exit(2)
    _settings_or_exit()
    _exec_module(f"remediation.watchers.{kind}.watcher")


db_app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument()] = "head") -> None:
    """Apply migrations up to REVISION (default: head)."""
    from remediation.db.migrate import upgrade

    settings = _settings_or_exit()
    try:
        upgrade(settings.database.url, revision)
    except Exception as exc:
        typer.echo(f"error: migration failed: {str(exc).splitlines()[0]}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"database at {revision}")


@db_app.command("prune")
def db_prune(
    older_than: Annotated[str | None, typer.Option(
        "--older-than", help="Prune events observed longer ago than this: 90d, 12h, 30m, 2w or seconds "
        "(default: retention.events_older_than).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would go; delete nothing.")] = False,
) -> None:
    """Delete old events that no remediation owns, old refused payloads, and the collected evidence of
    remediations closed longer ago than retention.evidence_older_than (direct database access).
    Every remediation keeps its own events; audit rows are never pruned. Beat runs this every
    retention.prune_interval_s."""
    from remediation.adapters.factory import evidence_storage
    from remediation.clock import SystemClock
    from remediation.db.session import DatabaseUnavailable, check_database, make_engine, make_session_factory
    from remediation.evidence_collection.service import EvidenceRetention
    from remediation.ports.errors import RemediationError
    from remediation.services.retention import prune_events

    settings = _settings_or_exit()
    try:
        age = parse_duration(older_than) if older_than is not None else settings.retention.events_older_than
    except ValueError as exc:
        typer.echo(f"error: --older-than {exc}", err=True)
        raise typer.Exit(2) from None
    engine = make_engine(settings.database)
    try:
        check_database(engine)
        collected = EvidenceRetention(settings.retention.evidence_older_than, evidence_storage(settings))
        result = prune_events(make_session_factory(engine), age, SystemClock().now(),
                              batch=settings.retention.batch,
                              dry_run=dry_run, evidence=collected)
    except DatabaseUnavailable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(3) from None
    except RemediationError as exc:  # the evidence store: unreachable, or refused
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(3) from None
    finally:
        engine.dispose()
    verb = "would delete" if result.dry_run else "deleted"
    typer.echo(f"{verb} {result.events_pruned} event(s) observed before {result.cutoff:%Y-%m-%d %H:%M:%S} UTC; "
               f"kept {result.events_kept_linked} older event(s) a remediation owns; "
               f"{verb} {result.rejected_pruned} rejected payload(s); "
               f"audit log untouched ({result.audit_rows} row(s))" + (" (dry-run: nothing deleted)" if dry_run else ""))
    if (ev := result.evidence) is not None:
        typer.echo(f"{verb} {ev.items} collected evidence item(s) of remediations closed before "
                   f"{ev.cutoff:%Y-%m-%d %H:%M:%S} UTC, and {ev.blobs} file(s) or object(s)"
                   + (f"; {ev.left} location(s) the store could not remove (see the log)" if ev.left else ""))


@app.command("api")
def api(
    host: Annotated[str | None, typer.Option(help="Bind address (default: api.bind).")] = None,
    port: Annotated[int | None, typer.Option(
        help="Port (default: api.port; 0: any free port, the one uvicorn's start-up line names).")] = None,
) -> None:
    """Serve the dashboard, the JSON API and /metrics."""
    _settings_or_exit()
    _exec_module("remediation.api.serve", *(["--host", host] if host else []),
                 *(["--port", str(port)] if port is not None else []))


def broker_dispatcher(settings: Settings) -> Dispatcher:
    """Levers' follow-up work goes to the workers over the broker (built after --config took effect;
    celery is imported only by a command that needs it)."""
    from remediation.adapters.celery import celery_dispatcher

    return celery_dispatcher(settings)


def main() -> None:
    app(obj=broker_dispatcher, prog_name=PROG)


if __name__ == "__main__":  # python -m remediation.cli.main: the console script without installing it
    main()
