"""The on-call CLI whole: its commands, ``db``, and the process commands of
:mod:`remediation.cli.launch` (``worker``, ``beat``, ``watch``, ``demo``, ``api``), which the console
script runs without importing this module. :func:`main` passes the Celery dispatcher to the lever
commands.

Why: docs/architecture.md#the-house-layers-imports-pointing-down
"""

from __future__ import annotations

from typing import Annotated

import typer

from remediation.cli.launch import PROG, register, settings_or_exit
from remediation.cli.oncall import app
from remediation.ports.dispatch import Dispatcher
from remediation.settings import Settings, parse_duration

register(app)
db_app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument()] = "head") -> None:
    """Apply migrations up to REVISION (default: head)."""
    from remediation.db.migrate import upgrade

    settings = settings_or_exit()
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

    settings = settings_or_exit()
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


def broker_dispatcher(settings: Settings) -> Dispatcher:
    """Levers' follow-up work goes to the workers over the broker (built after --config took effect;
    celery is imported only by a command that needs it)."""
    from remediation.adapters.celery import celery_dispatcher

    return celery_dispatcher(settings)


def main() -> None:
    app(obj=broker_dispatcher, prog_name=PROG)


if __name__ == "__main__":  # python -m remediation.cli.main: the console script without installing it
    main()
