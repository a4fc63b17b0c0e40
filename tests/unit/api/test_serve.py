"""`remediation api`: the port it asks uvicorn for. ``--port 0`` is a port (any free one, which uvicorn
names in its start-up line), not an unset option: tests start the API that way and read the port back.
The CLI execs ``python -m remediation.api.serve`` with the options it was given; the server picks the
port."""

from __future__ import annotations

from typing import Any

import pytest
import uvicorn
from typer.testing import CliRunner

from remediation.api import serve
from remediation.cli import launch, main


@pytest.mark.parametrize(
    ("argv", "env_port", "expected"),
    [(["--port", "0"], "9191", 0), (["--port", "8181"], "9191", 8181), ([], "9191", 9191)],
    ids=["zero-is-any-free-port", "option-wins", "setting-when-unset"],
)
def test_api_asks_uvicorn_for_the_port_given(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], env_port: str, expected: int
) -> None:
    asked: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: asked.update(kwargs))
    monkeypatch.setattr(serve.logs, "configure_from", lambda settings: None)  # the test process's logging
    monkeypatch.setenv("REMEDIATION_API__PORT", env_port)
    serve.main(argv)
    assert asked["port"] == expected


@pytest.mark.parametrize(
    ("argv", "passed"),
    [(["--port", "0"], ["--port", "0"]), (["--host", "::1"], ["--host", "::1"]), ([], [])],
    ids=["port-zero-is-passed-on", "host-is-passed-on", "nothing-when-unset"],
)
def test_the_cli_execs_the_server_with_its_options(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], passed: list[str]
) -> None:
    execs: list[tuple[str, ...]] = []
    monkeypatch.setattr(launch, "exec_module", lambda *args: execs.append(args))
    monkeypatch.setattr(launch.logs, "configure_from", lambda settings: None)
    result = CliRunner().invoke(main.app, ["api", *argv])
    assert result.exit_code == 0, result.output
    assert execs == [("remediation.api.serve", *passed)]
