"""The on-call CLI against real Postgres holding a realistic history (see history.py).

Commands run through typer's CliRunner in-process with the database chosen the way an operator
chooses it (REMEDIATION_DATABASE__URL), so settings loading, the database check and the error
handling are the real ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from remediation.cli.oncall import app
from remediation.db.models import AuditLog, Node, Remediation
from remediation.db.session import make_engine, make_session_factory
from remediation.ports.dispatch import Dispatcher, SweeperOnly
from remediation.settings import DatabaseSettings
from tests.integration.history import History, RecordingDispatcher, build
from tests.pace import budget


@pytest.fixture
def db(pg_url: str) -> Iterator[tuple[str, sessionmaker[Session]]]:
    engine = make_engine(DatabaseSettings(url=pg_url))
    yield pg_url, make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def history(db: tuple[str, sessionmaker[Session]]) -> History:
    return build(db[1])


@pytest.fixture
def dispatch() -> RecordingDispatcher:
    return RecordingDispatcher()


@pytest.fixture
def dispatcher(request: pytest.FixtureRequest) -> Dispatcher:
    """The test's recorder when it asks for ``dispatch``; otherwise no broker (as without the console
    script, which passes the Celery dispatcher)."""
    if "dispatch" in request.fixturenames:
        rec: RecordingDispatcher = request.getfixturevalue("dispatch")
        return rec
    return SweeperOnly()


@pytest.fixture
def run(db: tuple[str, sessionmaker[Session]], monkeypatch: pytest.MonkeyPatch, dispatcher: Dispatcher):  # noqa: ANN201
    # Recorded so that the CLI's own `--config` (which sets it, by design) is undone after the test.
    monkeypatch.setenv("REMEDIATION_CONFIG", "")
    runner = CliRunner()

    def invoke(*args: str, url: str | None = None):  # noqa: ANN202
        env = {"REMEDIATION_DATABASE__URL": url or db[0], "USER": "oncall-tester", "COLUMNS": "250"}
        return runner.invoke(app, list(args), env=env, obj=lambda settings: dispatcher)

    return invoke


def test_nodes_list_table_shows_every_node_with_status(run, history) -> None:
    res = run("nodes", "list")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split()[:5] == ["NAME", "STATUS", "PROFILE", "REMEDIATION", "STEP"]
    # A long reason wraps onto continuation lines (indented): one row per line that starts a row.
    rows = {line.split()[0]: line.split() for line in lines[1:] if not line[:1].isspace()}
    assert set(rows) == {f"gpu-node-{i}" for i in range(10)}
    assert rows["gpu-node-8"][1] == "quarantined"
    assert rows["gpu-node-4"][1:5] == ["remediating", "-", f"#{history.waiting}", "slurm_drain"]
    assert rows["gpu-node-3"][1] == "healthy"


def test_nodes_list_filters_and_json_parses(run, history) -> None:
    res = run("nodes", "list", "--status", "quarantined", "-o", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [n["name"] for n in data] == ["gpu-node-8"]
    assert data[0]["quarantine_reason"].startswith("ladder exhausted")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nodes", "list", "--status", "broken"), "error: unknown node status 'broken' (choose from healthy"),
        (("nodes", "show", "gpu-node-99"), "error: unknown node 'gpu-node-99'"),
        (("remediations", "list", "--status", "nope"), "error: unknown remediation status 'nope'"),
        (("remediations", "show", "9999"), "error: no remediation #9999"),
        (("events", "tail", "--node", "ghost"), "error: unknown node 'ghost'"),
        (("nodes", "list", "-o", "yaml"), "error: unknown output format 'yaml'"),
        (("release", "gpu-node-3", "--reason", "x"), "error: gpu-node-3 is not quarantined"),
        (("cancel", "1", "--reason", "x"), "error: remediation #1 is already succeeded"),
        (("quarantine", "gpu-node-1", "--reason", " "), "error: a reason is required"),
    ],
    ids=["bad-node-status", "unknown-node", "bad-rem-status", "unknown-rem", "tail-unknown-node",
         "bad-output", "release-not-quarantined", "cancel-closed", "blank-reason"],
)
def test_errors_are_one_line_and_non_zero(run, history, args, message) -> None:
    res = run(*args)
    assert res.exit_code == 1
    assert res.stderr.startswith(message)
    assert len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.output


def test_database_down_is_one_line_exit_3(run) -> None:
    res = run("nodes", "list", url="postgresql+psycopg://nobody@127.0.0.1:9/none")
    assert res.exit_code == 3
    assert res.stderr.startswith("error: cannot reach database postgresql+psycopg://nobody@127.0.0.1:9/none")
    assert len(res.stderr.strip().splitlines()) == 1


def test_bad_config_file_is_exit_2(run, tmp_path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("policy:\n  max_concurrent: 0\n")
    res = run("--config", str(bad), "nodes", "list")
    assert res.exit_code == 2
    assert res.stderr.startswith("error: invalid configuration: policy.max_concurrent")
    assert len(res.stderr.strip().splitlines()) == 1


def test_nodes_show_tells_the_whole_story(run, history) -> None:
    res = run("nodes", "show", "gpu-node-8")
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "Status:             quarantined" in out
    for expected in ("slurm unhealthy DOWN", f"remediation #{history.quarantined} opened", "vm_restart (attempt 2)",
                     "escalate by remediation", f"remediation #{history.quarantined} quarantined",
                     "not recovered 120s after restart", "Quarantine history", "remediation_quarantined"):
        assert expected in out, expected
    data = json.loads(run("nodes", "show", "gpu-node-8", "-o", "json").stdout)
    kinds = [t["kind"] for t in data["timeline"]]
    assert {"event", "remediation", "step", "audit"} <= set(kinds)
    verify = [t for t in data["timeline"] if t["title"].endswith("verify")][0]
    assert verify["error"].startswith("not recovered 120s after restart") and verify["duration_s"] > 100


def test_remediations_list_show_and_json(run, history) -> None:
    res = run("remediations", "list", "--status", "open")
    assert res.exit_code == 0, res.output
    body = res.stdout.splitlines()[1:]
    assert len(body) == 1 and body[0].split()[:5] == [str(history.waiting), "gpu-node-4", "waiting", "(base)",
                                                      "slurm_drain"]
    data = json.loads(run("remediations", "list", "--node", "gpu-node-9", "-o", "json").stdout)
    assert [r["status"] for r in data] == ["succeeded", "succeeded"]
    shown = run("remediations", "show", str(history.ok))
    assert shown.exit_code == 0
    for step in ("slurm_drain", "k8s_cordon", "k8s_evict", "vm_restart", "verify", "return"):
        assert step in shown.stdout
    detail = json.loads(run("remediations", "show", str(history.ok), "-o", "json").stdout)
    assert detail["event"]["reason"] == "xid 79" and len(detail["steps"]) == 6


def test_events_tail_and_rejected(run, history) -> None:
    res = run("events", "tail", "-n", "3")
    lines = res.stdout.splitlines()
    assert lines[0].startswith("OBSERVED (UTC)") and len(lines) == 4
    assert "gpu-node-4" in lines[-1] and "ecc errors" in lines[-1]
    data = json.loads(run("events", "tail", "--node", "gpu-node-9", "-o", "json").stdout)
    assert [e["reason"] for e in data if e["kind"] == "unhealthy"] == ["xid 48", "xid 49"]
    rej = json.loads(run("rejected", "list", "-o", "json").stdout)
    assert rej[0]["payload"] == "{not json" and "invalid event" in rej[0]["error"]


def test_stats(run, history) -> None:
    data = json.loads(run("stats", "-o", "json").stdout)
    assert data["total"] == 5
    assert data["by_node"][0] == {"key": "gpu-node-9", "count": 2, "cluster": "default"}
    assert {c["key"]: c["count"] for c in data["by_cause"]} == {"slurm FAIL": 3, "slurm DOWN": 1, "slurm DRAIN": 1}
    assert data["outcomes"]["succeeded"] == 3 and data["mttr_samples"] == 3 and data["mttr_s"] > 0
    assert [o["node"] for o in data["offenders"]] == ["gpu-node-9"]
    table = run("stats").stdout
    assert "Mean time to recovery" in table and "Repeat offenders" in table


def test_levers_write_audit_rows_with_the_actor(run, history, db, dispatch) -> None:
    sessions = db[1]
    res = run("--actor", "alice", "release", "gpu-node-8", "--reason", "GPU swapped, RMA 42")
    assert res.exit_code == 0, res.output
    assert dispatch.released(sessions) == ["gpu-node-8"]
    res = run("quarantine", "gpu-node-2", "--reason", "flaky NVLink")
    assert res.exit_code == 0, res.output
    assert dispatch.steps_called[-1].step == "quarantine"
    assert run("--actor", "bob", "cancel", str(history.waiting), "-r", "jobs are fine").exit_code == 0
    assert run("pause", "--reason", "maintenance window").exit_code == 0
    assert run("resume", "--reason", "maintenance over").exit_code == 0
    res = run("--actor", "carol", "report", "gpu-node-5", "--reason", "NCCL hangs")
    assert res.exit_code == 0 and "remediation #" in res.stdout
    with sessions() as s:
        rows = s.execute(select(AuditLog.actor, AuditLog.action, AuditLog.target, AuditLog.reason)
                         .where(AuditLog.action.in_(("release", "quarantine", "cancel", "pause", "resume", "report")))
                         .order_by(AuditLog.id)).all()
        assert [tuple(r) for r in rows] == [
            ("alice", "release", "gpu-node-8", "GPU swapped, RMA 42"),
            ("oncall-tester", "quarantine", "gpu-node-2", "flaky NVLink"),
            ("bob", "cancel", "gpu-node-4", "jobs are fine"),
            ("oncall-tester", "pause", "", "maintenance window"),
            ("oncall-tester", "resume", "", "maintenance over"),
            ("carol", "report", "gpu-node-5", "NCCL hangs"),
        ]
        assert s.get(Node, ("default", "gpu-node-8")).status == "healthy"
        assert s.get(Remediation, history.waiting).status == "cancelled"
    assert len(dispatch.steps_called) == 2  # the quarantine step and the reported node's first step


def test_release_without_a_dispatcher_says_what_is_left_to_do(run, history) -> None:
    res = run("release", "gpu-node-8", "--reason", "fixed")
    assert res.exit_code == 1
    assert res.stderr.startswith("error: node/gpu-node-8 released in the database, but the release actions")


def test_help_everywhere(run) -> None:
    for args in ([], ["nodes"], ["nodes", "show"], ["events", "tail"], ["stats"], ["release"], ["pause"]):
        res = run(*args, "--help")
        assert res.exit_code == 0 and "Usage" in res.stdout, args


def test_events_tail_follow_prints_new_events_as_they_arrive(db, history) -> None:
    import os
    import queue
    import subprocess
    import sys
    import threading

    from remediation.clock import SystemClock
    from remediation.domain.events import EventKind, NodeEvent, Source
    from remediation.services.ingest import ingest
    from tests.integration.history import engine_settings

    env = {**os.environ, "REMEDIATION_DATABASE__URL": db[0], "REMEDIATION_CONFIG": ""}
    with subprocess.Popen(  # noqa: S603 - our own CLI, fixed argv
        [sys.executable, "-c", "from remediation.cli.oncall import app; app()", "events", "tail", "-f", "-n", "1",
         "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    ) as proc:  # leaving the block closes the pipes, once the reader is done with them
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True)
        reader.start()
        try:
            assert lines.get(timeout=budget(20)).startswith("OBSERVED (UTC)")
            assert "ecc errors" in lines.get(timeout=budget(20))
            ev = NodeEvent(source=Source.KUBERNETES, node="gpu-node-6", kind=EventKind.UNHEALTHY,
                           state="GpuXidError=True", reason="xid 79 on GPU 3", observed_at=SystemClock().now())
            with db[1]() as s, s.begin():
                ingest(s, [ev.to_json()], engine_settings().policy, clock=SystemClock())
            new = lines.get(timeout=budget(20))
            assert "gpu-node-6" in new and "GpuXidError=True" in new and "xid 79 on GPU 3" in new
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            reader.join(timeout=10)


def test_status_names_a_system_pause_its_error_and_who_lifts_it(run, db, history) -> None:
    from remediation.services.holds import PagedError, pause

    res = run("status")
    assert res.exit_code == 0 and "running" in res.stdout
    with db[1]() as s, s.begin():
        rem = s.scalars(select(Remediation).where(Remediation.status.in_(("running", "waiting")))).first()
        assert rem is not None
        pause(s, rem.opened_at, PagedError("CredentialError", "not authenticated: HTTP 401 token expired", True,
                                      False, "cloud"), node=rem.node, rid=rem.id)
    res = run("status")
    assert res.exit_code == 0, res.stdout
    assert "PAUSED by system: CredentialError: not authenticated: HTTP 401 token expired" in res.stdout
    assert "a human must fix it" in res.stdout
    data = json.loads(run("status", "-o", "json").stdout)
    assert data["automation"]["paused"] is True and data["automation"]["error_kind"] == "CredentialError"
    res = run("resume", "-r", "rotated the key")
    assert res.exit_code == 0 and "automation resumed" in res.stdout
    assert json.loads(run("status", "-o", "json").stdout)["automation"]["paused"] is False
