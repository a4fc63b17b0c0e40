"""The on-call CLI (typer + rich). ``remediation.cli.main.app`` is the Typer app; the console script's
composition root (``remediation.cli.ops``) extends it with the operational commands."""
