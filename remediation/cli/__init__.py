"""The on-call CLI (typer + rich). ``remediation.cli.oncall.app`` holds the on-call commands;
``remediation.cli.main`` adds the process commands and is the console script.

Why: docs/running.md#the-cli
"""
