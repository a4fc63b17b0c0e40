"""The ``remediation`` on-call CLI: read commands and the audited levers.

Conventions are kubectl's and scontrol's: ``noun verb`` for reads (``nodes list``, ``nodes show
NODE``), a table by default, ``-o wide`` / ``-o json`` on every read, ``--help`` everywhere, and on any
error one line ``error: ...`` on stderr with a non-zero exit. Exit codes: 1 the request cannot be done
(unknown node, bad filter, a lever refused), 2 bad configuration or usage, 3 database unavailable.

Levers (``quarantine``, ``release``, ``cancel``, ``pause``, ``resume``, ``report``, ``breaker close``,
``incidents resolve``)
call the one :class:`remediation.services.lever_service.LeverService`, which runs each in one transaction
(writing the audit row with ``--actor``) and hands follow-up work to its dispatcher only after the commit.
The dispatcher is passed in, never looked up: the console script (:func:`remediation.cli.ops.main`)
passes the Celery one as the click context's ``obj``; without one, follow-ups wait for the sweeper.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from remediation.cli import incidents, read
from remediation.cli.context import (
    EXIT_CONFIG,
    EXIT_REQUEST,
    CliError,
    State,
    cli_errors,
    default_actor,
    no_broker,
    state,
)
from remediation.cli.gate import run_gate, validate, verdict_line
from remediation.cli.simulate import simulate
from remediation.cli.status import status
from remediation.services.readmodels import get_node
from remediation.settings import CONFIG_ENV

app = typer.Typer(
    name="remediation",
    help="On-call tool for node-remediation: what is broken, what the service did, what it waits on, "
    "what is quarantined and why, and the levers to act.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(read.nodes, name="nodes")
app.add_typer(read.events, name="events")
app.add_typer(read.remediations, name="remediations")
app.add_typer(read.rejected, name="rejected")
app.add_typer(read.audit, name="audit")
app.add_typer(incidents.app, name="incidents")
app.command("stats")(read.stats)
app.command("status")(status)
app.command("simulate")(simulate)
app.command("validate")(validate)

REASON = typer.Option(..., "--reason", "-r", help="Why (required; recorded in the audit log).")


@app.callback()
@cli_errors
def main(
    ctx: typer.Context,
    config: str = typer.Option(None, "--config", "-c", help="YAML or TOML config file (sets REMEDIATION_CONFIG)."),
    actor: str = typer.Option(None, "--actor", help="Who is acting, for the audit log (default: $USER)."),
) -> None:
    if config is not None:
        if not Path(config).is_file():
            raise CliError(f"--config {config}: no such file", EXIT_CONFIG)
        # The environment, not an argument: the composition root's Celery app reads the same file.
        os.environ[CONFIG_ENV] = str(config)
    actor = (actor or default_actor()).strip()
    if not actor or len(actor) > 128 or any(not c.isprintable() for c in actor):
        raise CliError("--actor must be 1-128 printable characters")
    # The console script passes how to reach the workers (a DispatcherFactory); tests pass their own.
    st = State(actor=actor, dispatcher_factory=ctx.obj if callable(ctx.obj) else no_broker)
    ctx.obj = st
    ctx.call_on_close(st.close)


def _done(message: str) -> None:
    typer.echo(message)


@app.command()
@cli_errors
def quarantine(ctx: typer.Context, node: str = typer.Argument(..., help="Slurm node name."),
               reason: str = REASON) -> None:
    """Take NODE out of service until a human releases it (drain in Slurm, taint in Kubernetes)."""
    st = state(ctx)
    followup = st.levers().quarantine(node, st.actor, reason)
    _done(f"node/{node} quarantining (remediation #{followup.remediation_id})")


@app.command()
@cli_errors
def release(ctx: typer.Context, node: str = typer.Argument(..., help="Slurm node name."),
            reason: str = REASON,
            gated: bool = typer.Option(False, "--validate", help="Run the GPU check first (the health gate) "
                                       "and release only if it passes.")) -> None:
    """Release NODE from quarantine: resume it in Slurm and remove our taint and cordon."""
    st = state(ctx)
    if gated:
        with st.sessions()() as s:
            status = get_node(s, node).status
        if status != "quarantined":
            raise CliError(f"{node} is not quarantined (status: {status}); nothing to release", EXIT_REQUEST)
        rec = run_gate(st, node, "release_validate")
        typer.echo(verdict_line(node, rec))
        if rec["outcome"] != "passed":
            raise CliError(f"node/{node} stays quarantined: its GPU check did not pass", EXIT_REQUEST)
    undo = st.levers().release(node, st.actor, reason)
    if undo.error is not None:  # committed, but the Slurm/Kubernetes undo could not be queued
        raise CliError(f"node/{node} released in the database, but the release actions could not be "
                       f"queued ({undo.error}); resume it by hand (scontrol update nodename={node} state=resume)",
                       EXIT_REQUEST)
    _done(f"node/{node} released")


@app.command()
@cli_errors
def cancel(ctx: typer.Context, remediation_id: int = typer.Argument(..., metavar="REMEDIATION_ID"),
           reason: str = REASON,
           give_back: bool = typer.Option(False, "--give-back", help="Also resume our drain (only if the "
                                          "reason is still ours) and remove our cordon and taint.")) -> None:
    """Stop one remediation where it stands; the node is left as it is for a human to decide, or with
    --give-back, what is ours on it is undone."""
    st = state(ctx)
    done = st.levers().cancel(remediation_id, st.actor, reason, give_back=give_back)
    node, step = done.node, done.step
    if done.undo is None:
        _done(f"remediation/{remediation_id} cancelled at {step} (node/{node} left as it is)")
        return
    if done.undo.error is not None:  # committed, but the Slurm/Kubernetes undo could not be queued
        raise CliError(f"remediation/{remediation_id} cancelled, but giving back node/{node} could not be "
                       f"queued ({done.undo.error}); resume it by hand (scontrol update nodename={node} "
                       "state=resume)", EXIT_REQUEST)
    _done(f"remediation/{remediation_id} cancelled at {step}; giving back node/{node} (our drain, cordon, taint)")


breaker_app = typer.Typer(help="The storm breaker: once open it stays open until a human closes it.",
                          no_args_is_help=True)
app.add_typer(breaker_app, name="breaker")


@breaker_app.command("status")
@cli_errors
def breaker_status(ctx: typer.Context) -> None:
    """Open or closed, why, and since when."""
    st = state(ctx)
    latch = st.levers().breaker_status()
    if latch.get("open"):
        _done(f"storm breaker OPEN since {latch.get('at')}: {latch.get('reason')}\n"
              "VM actions and evictions are held; close it with: remediation breaker close -r REASON")
    elif latch.get("closed_at"):
        _done(f"storm breaker closed at {latch.get('closed_at')} by {latch.get('closed_by')}: "
              f"{latch.get('close_reason')}")
    else:
        _done("storm breaker closed (it has never opened)")


@breaker_app.command("close")
@cli_errors
def breaker_close(ctx: typer.Context, reason: str = REASON) -> None:
    """Close the storm breaker. Each held remediation re-checks its trigger before its next action:
    nodes healthy again are cancelled with our drain and cordon given back; the rest proceed."""
    st = state(ctx)
    followups = st.levers().close_breaker(st.actor, reason)
    _done(f"storm breaker closed; {len(followups)} held remediation(s) re-check their trigger now")


@app.command()
@cli_errors
def pause(ctx: typer.Context, reason: str = REASON) -> None:
    """Pause all automation: running remediations wait at their next step."""
    st = state(ctx)
    was = st.levers().set_paused(True, st.actor, reason)
    _done("automation paused" + (" (it already was)" if was else ""))


@app.command()
@cli_errors
def resume(ctx: typer.Context, reason: str = REASON) -> None:
    """Resume all automation after a pause (a human's, or the system's on a fault of its own), and let
    every remediation held on an unmapped error go on."""
    st = state(ctx)
    was = st.levers().set_paused(False, st.actor, reason)
    _done("automation resumed" + ("" if was else " (it was not paused)"))


@app.command()
@cli_errors
def report(ctx: typer.Context, node: str = typer.Argument(..., help="Slurm node name."),
           reason: str = REASON) -> None:
    """Report NODE as bad (for users without scontrol rights); decided like a watcher's event."""
    st = state(ctx)
    followups = st.levers().report(node, st.actor, reason)
    if followups:
        _done(f"node/{node} reported: remediation #{followups[0].remediation_id} opened")
    else:
        _done(f"node/{node} reported and recorded (no new remediation: see `remediation nodes show {node}`)")


if __name__ == "__main__":  # pragma: no cover
    app()
