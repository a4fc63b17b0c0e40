"""Start and stop a real API process (`python -m remediation.cli api`, as the console script runs it) for integration tests."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.pace import within
from tests.ports import UVICORN_LINE, reported_port

ROOT = Path(__file__).resolve().parents[2]


def base_env(pg_url: str, **extra: str) -> dict[str, str]:
    """This process's environment without any REMEDIATION_ setting, plus the database and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")}
    env.update({"REMEDIATION_DATABASE__URL": pg_url, "PYTHONPATH": str(ROOT)})
    env.update(extra)
    return env


class ApiProcess:
    """``remediation api`` on port 0; stderr goes to ``log``, where uvicorn names the port it bound.
    Ready once /healthz answers 200."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._err = log.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "remediation.cli",
                "api",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._err,
            cwd=ROOT,
        )

    @functools.cached_property
    def port(self) -> int:
        return reported_port(self.log, UVICORN_LINE, self.proc, timeout=90.0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = within(timeout)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"the API exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}"
                )
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)  # polling a server that is starting up; the barrier is /healthz answering
        raise AssertionError(f"the API did not answer within {timeout}s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._err.close()
