"""The on-call CLI (typer + rich). ``remediation.cli.main.app`` is the Typer app; the console script's
composition root (``workers.cli``) extends it with the operational commands."""
