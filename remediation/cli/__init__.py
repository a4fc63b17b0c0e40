"""The on-call CLI (typer + rich). ``remediation.cli.main.app`` holds the on-call commands;
``remediation.cli.ops`` adds the process commands and is the console script."""
