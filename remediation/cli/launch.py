"""The commands that start a long-running process: ``worker``, ``beat``, ``watch``, ``api``, ``demo``.

Each checks the settings and execs its process by name (``celery -A remediation.workers.celery_app``,
``python -m remediation.watchers.slurm.watcher``, ``remediation.demo.run``, ``remediation.api.serve``),
importing nothing else. The console script (:mod:`remediation.cli.console`) runs them without the
on-call CLI, whose imports are most of a start's CPU; the on-call CLI lists them too.

Why: docs/running.md#the-cli
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from remediation.adapters import logs
from remediation.settings import Settings, SettingsError, load_settings
from remediation.vocabulary import WORKER_QUEUES

PROG = "remediation"
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def settings_or_exit() -> Settings:
    """The settings, or exit 2 with the reason; this process's logging set up from them."""
    try:
        settings = load_settings()
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    logs.configure_from(settings)  # this process's logging (a process exec'd from here sets up its own)
    return settings


def exec_module(module: str, *args: str) -> None:
    """Replace this process with ``python -m module args`` (same interpreter, same environment)."""
    os.execvp(sys.executable, [sys.executable, "-m", module, *args])


def demo(
    workdir: Annotated[Path | None, typer.Option(help="Where the demo's SQLite database goes.")] = None,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 180.0,
    port: Annotated[int, typer.Option(help="Dashboard port on 127.0.0.1 while the demo runs (0: any free port).")] = 8080,
) -> None:
    """Run the whole loop on a simulated 32-node cluster (kube-apiserver, GCE, Azure and slurmrestd
    endpoints on 127.0.0.1): SQLite, an in-process broker, the dashboard, no servers to install."""
    args = ["--timeout", str(timeout), "--port", str(port)]
    exec_module("remediation.demo.run", *(["--workdir", str(workdir)] if workdir else []), *args)


def worker(ctx: typer.Context) -> None:
    """Start a Celery worker (extra arguments go to `celery worker`, e.g. -c 4 -B)."""
    settings_or_exit()
    exec_module("celery", "-A", "remediation.workers.celery_app", "worker", "-Q", ",".join(WORKER_QUEUES), *ctx.args)


def beat(ctx: typer.Context) -> None:
    """Start Celery beat (sweeper, ingest safety net, notifications)."""
    settings_or_exit()
    exec_module("celery", "-A", "remediation.workers.celery_app", "beat", *ctx.args)


def watch(kind: Annotated[str, typer.Argument(help="slurm or kube")]) -> None:
    """Run a watcher (only the leader publishes; SIGTERM stops it cleanly)."""
    if kind not in ("slurm", "kube"):
        typer.echo(f"error: unknown watcher {kind!r}: choose slurm or kube", err=True)
        raise typer.Exit(2)
    settings_or_exit()
    exec_module(f"remediation.watchers.{kind}.watcher")


def api(
    host: Annotated[str | None, typer.Option(help="Bind address (default: api.bind).")] = None,
    port: Annotated[int | None, typer.Option(
        help="Port (default: api.port; 0: any free port, the one uvicorn's start-up line names).")] = None,
) -> None:
    """Serve the dashboard, the JSON API and /metrics."""
    settings_or_exit()
    exec_module("remediation.api.serve", *(["--host", host] if host else []),
                *(["--port", str(port)] if port is not None else []))


#: The process commands, in the order --help lists them, with their click context settings.
COMMANDS: dict[str, tuple[Callable[..., None], dict[str, bool] | None]] = {
    "demo": (demo, None), "worker": (worker, PASS_THROUGH), "beat": (beat, PASS_THROUGH),
    "watch": (watch, None), "api": (api, None)}
LAUNCHERS = frozenset(COMMANDS)


def register(app: typer.Typer) -> typer.Typer:
    """Add the process commands to ``app`` (the launcher's own, and the on-call CLI's)."""
    for name, (command, context) in COMMANDS.items():
        app.command(name, context_settings=context)(command)
    return app
