"""The ``remediation`` on-call CLI: read commands and the audited levers.

``noun verb`` reads with a table, ``-o wide`` or ``-o json``; one-line errors. Reads and levers go through
:mod:`remediation.cli.backend`. Levers call :class:`remediation.services.levers.LeverService`; the
dispatcher comes in as the click context's ``obj`` (:func:`remediation.cli.main.main`).

Why: docs/running.md#the-cli
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from remediation.cli import domains, incidents, policy, read, repair
from remediation.cli.backend import backend
from remediation.cli.completion import completion_script
from remediation.cli.context import (
    CLUSTER,
    EXIT_CONFIG,
    EXIT_REQUEST,
    CliError,
    State,
    cli_errors,
    default_actor,
    no_broker,
    state,
)
from remediation.cli.reliability import reliability_cmd
from remediation.cli.remote import SERVER_ENV, TOKEN_ENV, TOKEN_FILE_ENV, check_transport, read_token
from remediation.cli.simulate import simulate
from remediation.cli.status import status
from remediation.cli.validate import run_validation, validate, verdict_line
from remediation.domain.statemachine import QUARANTINE_STATUSES
from remediation.domain.states import CheckPurpose, ValidationOutcome
from remediation.settings import CONFIG_ENV
from remediation.vocabulary import DEFAULT_CLUSTER

app = typer.Typer(
    name="remediation",
    help="On-call tool for node-remediation: what is broken, what the service did, what it waits on, "
    "what is quarantined and why, and the levers to act.\n\n"
    "API mode (on-call): --server URL (or REMEDIATION_SERVER) with a token from --token-file, "
    "REMEDIATION_TOKEN_FILE or REMEDIATION_TOKEN; levers are audited as the token's name.\n\n"
    "Direct database mode (without --server): for admins on the database host; it reads the database "
    "URL from the config, and levers are audited as --actor or $USER (via=db).\n\n"
    "Exit codes: 1 the request cannot be done, 2 bad configuration or usage (a refused token), "
    "3 the database or the API server is unavailable.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(read.nodes, name="nodes")
app.add_typer(read.events, name="events")
app.add_typer(read.remediations, name="remediations")
app.add_typer(read.rejected, name="rejected")
app.add_typer(read.audit, name="audit")
app.add_typer(incidents.app, name="incidents")
app.add_typer(domains.app, name="domains")
app.add_typer(repair.app, name="repair")
app.add_typer(policy.app, name="policy")
app.command("stats")(read.stats)
app.command("status")(status)
app.command("rehearse")(simulate)
app.command("simulate", hidden=True, help="The old name of rehearse; kept as an alias.")(simulate)
app.command("validate")(validate)
app.command("reliability")(reliability_cmd)

REASON = typer.Option(..., "--reason", "-r", help="Why (required; recorded in the audit log).")
PROFILE = typer.Option(None, "--profile", help="A profile's own storm breaker, not the fleet's.")


@app.callback()
@cli_errors
def main(
    ctx: typer.Context,
    config: str = typer.Option(None, "--config", "-c", help="YAML or TOML config file (sets REMEDIATION_CONFIG)."),
    actor: str = typer.Option(None, "--actor", help="Direct database mode only: who is acting, for the audit "
                              "log (default: $USER). With --server the token's name is the actor."),
    *, server: str | None = typer.Option(None, "--server", envvar=SERVER_ENV, show_envvar=True,
                               help="The API server's URL: every read and lever goes through it, authenticated "
                               "by your token. Without it: direct database mode (admins on the database host)."),
    token_file: str | None = typer.Option(None, "--token-file", envvar=TOKEN_FILE_ENV, show_envvar=True,
                                   help=f"File holding your bearer token for --server (else ${TOKEN_ENV})."),
    insecure: bool = typer.Option(False, "--insecure", help="Allow an http:// --server that is not on "
                                  "loopback, though the token then crosses the network in clear."),
) -> None:
    if config is not None:
        if not Path(config).is_file():
            raise CliError(f"--config {config}: no such file", EXIT_CONFIG)
        # The environment, not an argument: the composition root's Celery app reads the same file.
        os.environ[CONFIG_ENV] = str(config)
    actor_given = actor is not None
    actor = (actor or default_actor()).strip()
    if not actor or len(actor) > 128 or any(not c.isprintable() for c in actor):
        raise CliError("--actor must be 1-128 printable characters")
    server = server.strip() if server else None  # REMEDIATION_SERVER="": direct database mode
    if server is not None:
        check_transport(server, insecure)
    token = read_token(token_file, os.environ.get(TOKEN_ENV)) if server is not None else None
    if server is not None and actor_given:
        raise CliError("--actor is for direct database mode: with --server the token's name is the actor",
                       EXIT_CONFIG)
    # The console script passes how to reach the workers (a DispatcherFactory); tests pass their own.
    st = State(actor=actor, dispatcher_factory=ctx.obj if callable(ctx.obj) else no_broker, server=server,
               token=token)
    ctx.obj = st
    ctx.call_on_close(st.close)


def _done(message: str) -> None:
    typer.echo(message)


@app.command()
@cli_errors
def quarantine(ctx: typer.Context, node: str = typer.Argument(..., help="Slurm node name."),
               reason: str = REASON, *, cluster: str | None = CLUSTER) -> None:
    """Take NODE out of service until a human releases it (drain in Slurm, taint in Kubernetes)."""
    _done(backend(state(ctx, cluster)).quarantine(node, reason))


@app.command()
@cli_errors
def release(ctx: typer.Context, node: str = typer.Argument(..., help="Slurm node name."),
            reason: str = REASON,
            *, validate_first: bool = typer.Option(False, "--validate",
                                                   help="Run the GPU check first (the validation) "
                                       "and release only if it passes (direct database mode)."), cluster: str | None = CLUSTER) -> None:
    """Release NODE from quarantine: resume it in Slurm and remove our taint and cordon."""
    st = state(ctx, cluster)
    if validate_first:
        status = backend(st).node(node).status
        if status not in QUARANTINE_STATUSES:
            raise CliError(f"{node} is not quarantined (status: {status}); nothing to release", EXIT_REQUEST)
        rec = run_validation(st, node, CheckPurpose.RELEASE_VALIDATE)
        typer.echo(verdict_line(node, rec))
        if rec["outcome"] != ValidationOutcome.PASSED:
            raise CliError(f"node/{node} stays quarantined: its GPU check did not pass", EXIT_REQUEST)
    _done(backend(st).release(node, reason))


@app.command()
@cli_errors
def cancel(ctx: typer.Context, remediation_id: int = typer.Argument(..., metavar="REMEDIATION_ID"),
           reason: str = REASON,
           *, give_back: bool = typer.Option(False, "--give-back", help="Also resume our drain (only if the "
                                          "reason is still ours) and remove our cordon and taint."), cluster: str | None = CLUSTER) -> None:
    """Stop one remediation where it stands; the node is left as it is for a human to decide, or with
    --give-back, what is ours on it is undone."""
    _done(backend(state(ctx, cluster)).cancel(remediation_id, reason, give_back))


breaker_app = typer.Typer(help="The storm breaker: once open it stays open until a human closes it.",
                          no_args_is_help=True)
app.add_typer(breaker_app, name="breaker")


@breaker_app.command("status")
@cli_errors
def breaker_status(ctx: typer.Context, profile: str | None = PROFILE, *, cluster: str | None = CLUSTER) -> None:
    """Open or closed, why, and since when: the fleet's breaker, or with --profile that profile's."""
    latch = backend(state(ctx, cluster)).breaker(profile)
    whose, flag = (f"profile {profile}'s storm breaker", f" --profile {profile}") if profile else ("storm breaker", "")
    if latch.get("cluster") not in (None, DEFAULT_CLUSTER):  # one of several clusters' breakers
        whose, flag = f"{whose} (cluster {latch['cluster']})", f"{flag} --cluster {latch['cluster']}"
    if latch.get("open"):
        _done(f"{whose} OPEN since {latch.get('at')}: {latch.get('reason')}\n"
              f"VM actions and evictions are held; close it with: remediation breaker close{flag} -r REASON")
    elif latch.get("closed_at"):
        _done(f"{whose} closed at {latch.get('closed_at')} by {latch.get('closed_by')}: "
              f"{latch.get('close_reason')}")
    else:
        _done(f"{whose} closed (it has never opened)")


@breaker_app.command("close")
@cli_errors
def breaker_close(ctx: typer.Context, reason: str = REASON, profile: str | None = PROFILE, *, cluster: str | None = CLUSTER) -> None:
    """Close the storm breaker (the fleet's, or with --profile that profile's). Each held remediation
    re-checks its trigger before its next action: nodes healthy again are cancelled with our drain and
    cordon given back; the rest proceed."""
    _done(backend(state(ctx, cluster)).close_breaker(reason, profile))


@app.command()
@cli_errors
def pause(ctx: typer.Context, reason: str = REASON, *, cluster: str | None = CLUSTER) -> None:
    """Pause all automation: running remediations wait at their next step."""
    _done(backend(state(ctx, cluster)).set_paused(True, reason))


@app.command()
@cli_errors
def resume(ctx: typer.Context, reason: str = REASON, *, cluster: str | None = CLUSTER) -> None:
    """Resume all automation after a pause (a human's, or the system's on a fault of its own), and let
    every remediation held on an unmapped error go on."""
    _done(backend(state(ctx, cluster)).set_paused(False, reason))


@app.command()
@cli_errors
def report(ctx: typer.Context, node: str = typer.Argument(..., help="Slurm node name."),
           reason: str = REASON, *, cluster: str | None = CLUSTER) -> None:
    """Report NODE as bad (for users without scontrol rights); decided like a watcher's event."""
    _done(backend(state(ctx, cluster)).report(node, reason))


@app.command()
@cli_errors
def whoami(ctx: typer.Context) -> None:
    """Which mode this CLI is in and whom levers are audited as (with --server: the token's name and role)."""
    st = state(ctx)
    if st.server is None:
        _done(f"direct database mode: levers are audited as {st.actor!r} (via=db)")
        return
    me = backend(st).whoami()  # type: ignore[attr-defined]
    kind = "named token" if me.get("named") else "unnamed legacy token"
    _done(f"{st.server}: {me.get('name')} ({me.get('role')}, {kind}); levers are audited as "
          f"{me.get('name') if me.get('named') else 'NAME (token fingerprint)'} (via=api)")


@app.command("completion")
@cli_errors
def completion(shell: str = typer.Argument(..., help="bash, zsh or fish.")) -> None:
    """Print the shell completion script: `eval "$(remediation completion bash)"` in ~/.bashrc, or
    `remediation completion zsh > "${fpath[1]}/_remediation"`."""
    _done(completion_script(shell))


if __name__ == "__main__":  # pragma: no cover
    app()
