"""The `remediation` console script: the composition root.

The on-call commands (nodes, events, remediations, stats and the levers) live in the domain's CLI,
``remediation.cli.main``, which knows nothing of Celery. This module wires the concrete pieces in:
it installs the Celery dispatcher (so a lever's follow-ups are queued at once) and adds the commands
that start processes: ``worker``, ``beat``, ``watch``, ``api``, ``db`` and ``demo``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from remediation.cli.main import app
from remediation.settings import ConfigError, load_settings


def _settings_or_exit():  # type: ignore[no-untyped-def]
    try:
        return load_settings()
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command("demo")
def demo(
    workdir: Annotated[Path | None, typer.Option(help="Where the demo's SQLite database goes.")] = None,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 180.0,
    port: Annotated[int, typer.Option(help="Dashboard port on 127.0.0.1 while the demo runs (0: any free port).")] = 8080,
) -> None:
    """Run the whole loop on a simulated 32-node cluster (kube-apiserver, GCE, Azure and slurmrestd
    endpoints on 127.0.0.1): SQLite, an in-process broker, the dashboard, no servers to install."""
    from workers.demo import run_demo

    summary = run_demo(workdir or Path(tempfile.mkdtemp(prefix="remediation-demo-")), timeout_s=timeout, port=port)
    if summary["timed_out"]:
        raise typer.Exit(1)


@app.command("worker", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(ctx: typer.Context) -> None:
    """Start a Celery worker (extra arguments go to `celery worker`, e.g. -c 4 -B)."""
    _settings_or_exit()
    os.execvp(sys.executable, [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker",
                               "-Q", "ingest,workflow", *ctx.args])


@app.command("beat", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def beat(ctx: typer.Context) -> None:
    """Start Celery beat (sweeper, ingest safety net, notifications)."""
    _settings_or_exit()
    os.execvp(sys.executable, [sys.executable, "-m", "celery", "-A", "workers.celery_app", "beat", *ctx.args])


@app.command("watch")
def watch(kind: Annotated[str, typer.Argument(help="slurm or kube")]) -> None:
    """Run a watcher (only the leader publishes; SIGTERM stops it cleanly)."""
    if kind not in ("slurm", "kube"):
        typer.echo(f"error: unknown watcher {kind!r}: choose slurm or kube", err=True)
        raise typer.Exit(2)
    _settings_or_exit()
    if kind == "slurm":
        from watchers.slurm import main as run_watcher
    else:
        from watchers.kube import main as run_watcher
    raise typer.Exit(run_watcher())


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


@app.command("api")
def api(
    host: Annotated[str | None, typer.Option(help="Bind address (default: api.bind).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: api.port).")] = None,
) -> None:
    """Serve the dashboard, the JSON API and /metrics."""
    import uvicorn

    from remediation.api.app import create_app
    from workers.queues import queue_depth

    settings = _settings_or_exit()
    uvicorn.run(create_app(settings, queue_depth=lambda: queue_depth(settings)),
                host=host or settings.api.bind, port=port or settings.api.port, log_level="info")


class _LazyCeleryDispatcher:
    """Imports the Celery app on first use, i.e. after the CLI's --config option took effect."""

    def steps(self, followups):  # type: ignore[no-untyped-def]
        from workers.tasks import enqueue

        enqueue(followups)

    def release(self, node: str) -> None:
        from workers.tasks import CeleryDispatcher

        CeleryDispatcher().release(node)


def main() -> None:
    from remediation.dispatch import set_dispatcher

    set_dispatcher(_LazyCeleryDispatcher())
    app()
