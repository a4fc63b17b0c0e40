"""``remediation completion bash|zsh|fish``: the shell completion script, from typer's own mechanism.

The script calls ``remediation`` back with ``_REMEDIATION_COMPLETE`` set, and typer completes commands,
sub-commands and options from the same command tree that parses them, so completion never drifts
from the CLI. The console script fixes the program name (``remediation``) so the variable matches
however the CLI was started. (``--install-completion`` and ``--show-completion``, typer's options for
the shell it detects, are there too.)

Why: docs/running.md#the-cli
"""

from __future__ import annotations

from typer.completion import completion_init, get_completion_script  # type: ignore[attr-defined]

from remediation.cli.context import EXIT_CONFIG, CliError
from remediation.cli.launch import PROG

COMPLETE_VAR = "_REMEDIATION_COMPLETE"
SHELLS = ("bash", "zsh", "fish")


def completion_script(shell: str) -> str:
    if shell not in SHELLS:
        raise CliError(f"no completion for shell {shell!r}: choose {', '.join(SHELLS)}", EXIT_CONFIG)
    completion_init()  # typer's completion classes answer the script's call-back
    return get_completion_script(prog_name=PROG, complete_var=COMPLETE_VAR, shell=shell)
