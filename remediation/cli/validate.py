"""``remediation validate NODE``: run the validation on demand, on a node already out of the pool.

The same validation the workflow's ``validate`` step uses (``validation.backend``), run from this process:
it waits for the check (printing where it stands), takes its set-up down, records the check in the
database and the audit log with ``--actor``, and exits 0 on a pass and 1 otherwise. ``release NODE
--validate`` (:mod:`remediation.cli.oncall`) runs it first and releases only on a pass.

Why: docs/policy.md#validate-before-return-a-gpu-validation-validationbackend-default-none
"""

from __future__ import annotations

from typing import Any

import typer

from remediation.adapters.factory import slurm_backend, validator_backend
from remediation.adapters.slurm.backend import close_slurm
from remediation.cli.context import CLUSTER, EXIT_CONFIG, EXIT_REQUEST, CliError, State, cli_errors, state
from remediation.db.scope import scoped
from remediation.domain.states import CheckPurpose, ValidationOutcome
from remediation.services.clusters import node_cluster
from remediation.validation.rules import last_line
from remediation.validation.service import ManualCheck, ValidationRefused, run_check


def run_validation(st: State, node: str, purpose: CheckPurpose) -> dict[str, Any]:
    if st.server is not None:
        raise CliError(f"{'release --validate' if purpose is CheckPurpose.RELEASE_VALIDATE else 'validate'} runs the GPU "
                       "check from this machine through Slurm and writes the database directly: run it on the "
                       "database host without --server", EXIT_CONFIG)
    with st.sessions()() as s:
        cluster = node_cluster(s, node, st.cluster)  # the check is the node's cluster's, as are its rows
    fleet = st.settings().fleet()
    settings = fleet.get(cluster, st.settings())
    validator = validator_backend(settings)
    if validator is None:
        raise CliError("validation.backend is none: there is no validation to run (set it to slurm or "
                       "kubernetes)", EXIT_CONFIG)
    typer.echo(f"node/{node}: running the GPU check through {validator.backend} ...", err=True)
    slurm = slurm_backend(settings)
    try:
        return run_check(scoped(st.sessions(), cluster), validator, slurm, asked=ManualCheck(node, st.actor, purpose),
                         settings=settings, now=st.now)
    except ValidationRefused as exc:
        raise CliError(str(exc), EXIT_REQUEST) from None
    finally:
        close_slurm(slurm)


def verdict_line(node: str, rec: dict[str, Any]) -> str:
    last = last_line(rec["output"])
    code = "-" if rec["exit_code"] is None else rec["exit_code"]
    return (f"node/{node} GPU check {rec['outcome'].upper()}: `{' '.join(rec['command'])}` exit {code} in "
            f"{rec['duration_s']:.1f}s{f' ({last[:200]})' if last else ''}")


@cli_errors
def validate(ctx: typer.Context, node: str = typer.Argument(..., help="Slurm node name (drained)."),
             *, cluster: str | None = CLUSTER) -> None:
    """Run the GPU check the node's last cause picks, now, through the configured validator; the node must be
    drained (it stays drained: a pass returns nothing by itself). Exit 0 on a pass, 1 otherwise."""
    st = state(ctx, cluster)
    rec = run_validation(st, node, CheckPurpose.VALIDATE)
    typer.echo(verdict_line(node, rec))
    if rec["outcome"] != ValidationOutcome.PASSED:
        raise typer.Exit(EXIT_REQUEST)
