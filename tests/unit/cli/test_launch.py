"""The console script starts a process without importing the on-call CLI, and hands every other
command to it (remediation.cli.console, remediation.cli.launch)."""

from __future__ import annotations

import subprocess
import sys

from remediation.adapters.celery import WORKER_QUEUES as CELERY_QUEUES
from remediation.cli.launch import LAUNCHERS, WORKER_QUEUES

RUN = """
import sys
sys.argv = ["remediation", *sys.argv[1:]]
from remediation.cli.console import main
try:
    main()
finally:
    print("on-call CLI imported:", "remediation.cli.oncall" in sys.modules, file=sys.stderr)
"""


def console(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_a_process_command_runs_without_the_on_call_cli() -> None:
    done = console("watch", "nfs")  # refused before anything is exec'd
    assert done.returncode == 2, done.stderr
    assert "unknown watcher 'nfs': choose slurm or kube" in done.stderr
    assert "on-call CLI imported: False" in done.stderr


def test_every_other_command_goes_to_the_on_call_cli_which_lists_the_process_commands_too() -> None:
    done = console("--help")
    assert done.returncode == 0, done.stderr
    assert "on-call CLI imported: True" in done.stderr
    listed = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("│ ") and len(line.split()) > 2}
    assert LAUNCHERS | {"nodes", "remediations", "db"} <= listed, sorted(listed)


def test_a_global_option_before_the_command_goes_to_the_on_call_cli() -> None:
    done = console("--config", "/nonexistent/remediation.yaml", "worker")
    assert done.returncode == 2 and "--config /nonexistent/remediation.yaml: no such file" in done.stderr
    assert "on-call CLI imported: True" in done.stderr


def test_the_worker_consumes_the_queues_the_celery_adapter_routes_to() -> None:
    assert WORKER_QUEUES == CELERY_QUEUES == ("ingest", "workflow", "requests")
