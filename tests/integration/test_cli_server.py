"""The on-call CLI in API mode against a running API process (`remediation api`) on real Postgres.

Tokens are named in config (``api.tokens``): ``alice`` (admin) and ``bob`` (read), each from a token
file, plus one token from the old unnamed ``admin_tokens`` list. The CLI runs as its own process
(`python -m remediation.cli --server URL --token-file ...`), as on an on-call laptop.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.db.models import AuditLog
from tests.integration.apiproc import ROOT, ApiProcess, base_env
from tests.integration.history import History, history, sessions  # noqa: F401  (fixtures)
from tests.integration.two_clusters import EAST, SHARED, seed

ALICE, BOB, LEGACY = (
    "alice-admin-token-0123456789",
    "bob-read-token-0123456789",
    "legacy-admin-token-0123456789",
)


@pytest.fixture
def tokens(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, secret in (("alice", ALICE), ("bob", BOB), ("legacy", LEGACY)):
        out[name] = tmp_path / f"{name}.token"
        out[name].write_text(secret + "\n")
        out[name].chmod(0o600)
    return out


@pytest.fixture
def api(
    pg_url: str, history: History, tokens: dict[str, Path], tmp_path: Path, redis_prefix: str
) -> Iterator[ApiProcess]:
    config = tmp_path / "api.json"
    config.write_text(
        json.dumps(
            [
                {"name": "alice", "role": "admin", "token_file": str(tokens["alice"])},
                {"name": "bob", "role": "read", "token_file": str(tokens["bob"])},
            ]
        )
    )
    env = base_env(
        pg_url,
        REMEDIATION_API__TOKENS=config.read_text(),
        REMEDIATION_API__ADMIN_TOKENS=json.dumps([LEGACY]),
        REMEDIATION_BROKER__KEY_PREFIX=redis_prefix,
    )
    proc = ApiProcess(env, tmp_path / "api.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def cli(pg_url: str | None, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The console script as its own process; ``pg_url`` None: this machine has no database URL."""
    full = base_env(
        pg_url or "postgresql+psycopg://nobody@127.0.0.1:1/none", USER="laptop-user", COLUMNS="250", **env
    )
    return subprocess.run(
        [sys.executable, "-m", "remediation.cli", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


def audit_rows(sessions: sessionmaker[Session], action: str) -> list[tuple[str, str | None]]:
    with sessions() as s:
        return [(a.actor, a.via) for a in s.scalars(select(AuditLog).where(AuditLog.action == action))]


def test_a_read_token_cannot_pull_a_lever(
    api: ApiProcess, tokens: dict[str, Path], sessions: sessionmaker[Session]
) -> None:
    out = cli(
        None,
        "--server",
        api.url,
        "--token-file",
        str(tokens["bob"]),
        "quarantine",
        "gpu-node-1",
        "-r",
        "looks bad",
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr.strip().startswith("error: refused by")
    assert "read-only" in out.stderr and out.stderr.count("\n") == 1
    assert audit_rows(sessions, "quarantine") == []


def test_an_admin_token_named_alice_is_the_audit_actor(
    api: ApiProcess, tokens: dict[str, Path], sessions: sessionmaker[Session]
) -> None:
    out = cli(
        None,
        "quarantine",
        "gpu-node-1",
        "-r",
        "xid 79 again",
        REMEDIATION_SERVER=api.url,
        REMEDIATION_TOKEN_FILE=str(tokens["alice"]),
    )
    assert out.returncode == 0, out.stderr
    assert "gpu-node-1 is being quarantined" in out.stdout
    assert audit_rows(sessions, "quarantine") == [("alice", "api")]
    # The token from the environment works the same way; whoami says whom the server takes it for.
    out = cli(None, "--server", api.url, "whoami", REMEDIATION_TOKEN=ALICE)
    assert out.returncode == 0 and "alice (admin, named token)" in out.stdout, out.stderr
    # A self-asserted name is not accepted in API mode.
    out = cli(None, "--server", api.url, "--actor", "mallory", "pause", "-r", "x", REMEDIATION_TOKEN=ALICE)
    assert out.returncode == 2 and "--actor is for direct database mode" in out.stderr
    assert audit_rows(sessions, "pause") == []


def test_a_direct_database_lever_is_marked_via_db(
    pg_url: str, history: History, sessions: sessionmaker[Session]
) -> None:
    out = cli(pg_url, "--actor", "carol", "pause", "-r", "maintenance window")
    assert out.returncode == 0, out.stderr
    assert audit_rows(sessions, "pause") == [("carol", "db")]
    out = cli(pg_url, "audit", "list", "--action", "pause", "-o", "json")
    assert [(a["actor"], a["via"]) for a in json.loads(out.stdout)] == [("carol", "db")]


def test_an_unnamed_legacy_token_still_works(
    api: ApiProcess, tokens: dict[str, Path], sessions: sessionmaker[Session]
) -> None:
    out = cli(None, "--server", api.url, "--token-file", str(tokens["legacy"]), "pause", "-r", "storm")
    assert out.returncode == 0, out.stderr
    ((actor, via),) = audit_rows(sessions, "pause")
    assert via == "api" and actor.startswith("api (token ")


READS = [
    ["nodes", "list", "-o", "json"],
    ["nodes", "show", "gpu-node-8", "-o", "json"],
    ["remediations", "list", "-o", "json"],
    ["remediations", "list", "--status", "open", "-o", "json"],
    ["events", "tail", "-n", "5", "-o", "json"],
    ["rejected", "list", "-o", "json"],
    ["audit", "list", "-o", "json"],
    ["status", "-o", "json"],
    ["stats", "-o", "json"],
    ["stats", "--lemons", "-o", "json"],
    ["incidents", "list", "-o", "json"],
    ["breaker", "status"],
]


def test_every_read_answers_the_same_through_the_api(
    api: ApiProcess, tokens: dict[str, Path], pg_url: str
) -> None:
    """One API process for every read command (each runs twice: direct, then through the API)."""
    for args in READS:
        direct = cli(pg_url, *args)
        remote = cli(None, "--server", api.url, "--token-file", str(tokens["bob"]), *args)
        assert direct.returncode == 0 and remote.returncode == 0, (args, direct.stderr + remote.stderr)
        assert remote.stdout.strip(), args
        if args[0] == "stats" and "--lemons" not in args:  # its window starts at "now", which moved on
            mine, theirs = json.loads(direct.stdout), json.loads(remote.stdout)
            assert mine.pop("since") <= theirs.pop("since")
            assert mine == theirs
        elif args[0] == "stats":  # a lemon's score decays with age, and "now" moved on between the reads
            mine, theirs = json.loads(direct.stdout), json.loads(remote.stdout)
            for before, after in zip(mine, theirs, strict=True):
                assert 0 <= before.pop("score") - after.pop("score") < 0.01, (before, after)
            assert mine == theirs
        elif args[:2] == ["nodes", "list"]:  # each row's lemon score decays between the reads too
            mine, theirs = json.loads(direct.stdout), json.loads(remote.stdout)
            for before, after in zip(mine, theirs, strict=True):
                assert 0 <= before.pop("lemon_score") - after.pop("lemon_score") < 0.01, (before, after)
            assert mine == theirs
        else:
            assert remote.stdout == direct.stdout, args


def test_token_and_server_errors_are_one_line(api: ApiProcess, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-a-token-of-this-server")
    out = cli(None, "--server", api.url, "--token-file", str(wrong), "nodes", "list")
    assert out.returncode == 2 and out.stderr.startswith("error:") and "refused the token" in out.stderr
    out = cli(None, "--server", api.url, "nodes", "list")
    assert out.returncode == 2 and "needs a token" in out.stderr
    out = cli(None, "--server", api.url, "--token-file", str(tmp_path / "missing"), "nodes", "list")
    assert out.returncode == 2 and "--token-file" in out.stderr
    out = cli(None, "--server", "http://127.0.0.1:1", "nodes", "list", REMEDIATION_TOKEN=BOB)
    assert out.returncode == 3 and "cannot reach" in out.stderr
    out = cli(None, "--server", api.url, "nodes", "show", "no-such-node", REMEDIATION_TOKEN=BOB)
    assert out.returncode == 1 and "no-such-node" in out.stderr
    out = cli(None, "--server", api.url, "validate", "gpu-node-1", REMEDIATION_TOKEN=ALICE)
    assert out.returncode == 2 and "without --server" in out.stderr


def test_plain_http_carries_the_token_only_to_loopback() -> None:
    # 0.0.0.0 is no loopback address, yet a connection to it reaches this machine: refused at once.
    for server in ("http://0.0.0.0:1", "http://remediation.example:8080", "HTTP://10.0.0.7"):
        out = cli(None, "--server", server, "nodes", "list", REMEDIATION_TOKEN=BOB)
        assert out.returncode == 2 and "in clear" in out.stderr and "--insecure" in out.stderr, out.stderr
        assert BOB not in out.stdout + out.stderr
    out = cli(None, "--server", "http://0.0.0.0:1", "--insecure", "nodes", "list", REMEDIATION_TOKEN=BOB)
    assert out.returncode == 3 and "cannot reach" in out.stderr, out.stderr
    for server in ("http://localhost:1", "http://[::1]:1", "http://127.0.0.2:1"):
        out = cli(None, "--server", server, "nodes", "list", REMEDIATION_TOKEN=BOB)
        assert out.returncode == 3 and "cannot reach" in out.stderr, (server, out.stderr)


def test_help_labels_the_two_modes_and_completion_completes() -> None:
    out = cli(None, "--help")
    assert (
        "Direct database mode" in out.stdout
        and "--server" in out.stdout
        and "REMEDIATION_SERVER" in out.stdout
    )
    script = cli(None, "completion", "bash")
    assert script.returncode == 0 and "_REMEDIATION_COMPLETE=complete_bash" in script.stdout
    assert "complete -o default -F" in script.stdout and script.stdout.rstrip().endswith("remediation")
    # What the script runs on <TAB>: the shell's words in, the candidates out.
    done = cli(None, _REMEDIATION_COMPLETE="complete_bash", COMP_WORDS="remediation no", COMP_CWORD="1")
    assert done.stdout.split() == ["nodes"], done.stdout + done.stderr
    done = cli(None, _REMEDIATION_COMPLETE="complete_bash", COMP_WORDS="remediation breaker ", COMP_CWORD="2")
    assert set(done.stdout.split()) == {"status", "close"}, done.stdout + done.stderr
    assert cli(None, "completion", "tcsh").returncode == 2


def _login_cookie(url: str) -> str:
    res = httpx.post(f"{url}/login", data={"token": ALICE, "next": "/"},
                     headers={"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.9"})
    assert res.status_code == 303, res.text
    return res.headers["set-cookie"]


def test_the_session_cookie_is_secure_behind_a_trusted_tls_proxy_only(
    api: ApiProcess, pg_url: str, tokens: dict[str, Path], tmp_path: Path
) -> None:
    """uvicorn believes X-Forwarded-Proto only from api.forwarded_allow_ips: from a trusted proxy
    (here loopback, the default) the cookie keeps its Secure flag behind TLS; from any other peer the
    header is ignored, so a client cannot claim https for itself."""
    assert "; secure" in _login_cookie(api.url).lower()
    env = base_env(pg_url, REMEDIATION_API__TOKENS=json.dumps(
        [{"name": "alice", "role": "admin", "token_file": str(tokens["alice"])}]),
        REMEDIATION_API__FORWARDED_ALLOW_IPS="192.0.2.1")
    untrusted = ApiProcess(env, tmp_path / "untrusted.log")
    try:
        untrusted.wait_ready()
        assert "; secure" not in _login_cookie(untrusted.url).lower()
    finally:
        untrusted.stop()


def test_cluster_reaches_the_server_and_an_ambiguous_name_is_refused(
    api: ApiProcess, tokens: dict[str, Path], sessions: sessionmaker[Session]
) -> None:
    """Two more clusters beside the history's (tests/integration/two_clusters.py): gpu-node-0 is in all
    three, so a lever naming it needs --cluster, which the CLI sends as ?cluster=."""
    seed(sessions)
    server = ("--server", api.url, "--token-file", str(tokens["alice"]))
    out = cli(None, *server, "quarantine", SHARED, "-r", "bad GPU")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "default, east, west" in out.stderr and "--cluster" in out.stderr
    out = cli(None, *server, "quarantine", SHARED, "--cluster", EAST, "-r", "bad GPU")
    assert out.returncode == 0, out.stderr
    with sessions() as s:
        rows = [(a.cluster, a.target, a.actor) for a in s.scalars(select(AuditLog).where(AuditLog.action == "quarantine"))]
    assert rows == [(EAST, SHARED, "alice")]
    listed = cli(None, *server, "nodes", "list", "--cluster", EAST, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert {n["cluster"] for n in json.loads(listed.stdout)} == {EAST}
    table = cli(None, *server, "nodes", "list")
    assert table.stdout.splitlines()[0].split()[:2] == ["CLUSTER", "NAME"]


def test_repair_done_through_the_server_opens_the_recheck_as_the_tokens_name(
    api: ApiProcess, tokens: dict[str, Path], sessions: sessionmaker[Session], history: History,  # noqa: F811
) -> None:
    """gpu-node-8 (quarantined by the history) handed to the repair system; on-call's laptop says done."""
    from datetime import UTC, datetime

    from remediation.db.models import Node, RepairRequest

    with sessions() as s, s.begin():
        now = datetime.now(UTC)
        req = RepairRequest(node="gpu-node-8", remediation_id=history.quarantined, status="open", delivery="delivered",
                            attempts=0, payload={"schema_version": 1}, opened_at=now, delivered_at=now)
        s.add(req)
        node = s.get(Node, ("default", "gpu-node-8"))
        assert node is not None
        node.status = "with-repair"
        s.flush()
        rid = req.id
    server = ("--server", api.url, "--token-file")
    listed = cli(None, *server, str(tokens["bob"]), "repair", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert [(r["id"], r["status"]) for r in json.loads(listed.stdout)] == [(rid, "open")]
    refused = cli(None, *server, str(tokens["bob"]), "repair", "done", "gpu-node-8", "--ticket", "RMA-5")
    assert refused.returncode == 1 and "repair or admin token" in refused.stderr
    done = cli(None, *server, str(tokens["alice"]), "repair", "done", "gpu-node-8", "--ticket", "RMA-5")
    assert done.returncode == 0, done.stderr
    with sessions() as s:
        row = s.get(RepairRequest, rid)
        assert row is not None and (row.status, row.ticket, row.closed_by) == ("rechecking", "RMA-5", "alice")
        assert f"re-check #{row.recheck_id} runs the GPU check" in done.stdout
    assert audit_rows(sessions, "repair_done") == [("alice", "api")]
