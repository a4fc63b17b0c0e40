"""The ``remediation`` console script: a process command (:mod:`remediation.cli.launch`) runs from
here without importing the on-call CLI; every other command goes to :mod:`remediation.cli.main`.

Why: docs/running.md#the-cli
"""

from __future__ import annotations

import sys

import typer

from remediation.cli.launch import LAUNCHERS, PROG, register


def main() -> None:
    """Run a process command straight away; every other command, and a global option such as
    --config before the command, goes to the on-call CLI."""
    if len(sys.argv) > 1 and sys.argv[1] in LAUNCHERS:
        launcher = typer.Typer(name=PROG, add_completion=False, pretty_exceptions_enable=False,
                               context_settings={"help_option_names": ["-h", "--help"]})
        register(launcher)(prog_name=PROG)
        return
    from remediation.cli.main import main as on_call

    on_call()
