"""Collected evidence kept, shown and pruned on real Postgres, in a real directory and a real S3 server.

The items are those a collect_evidence step brings back (:class:`remediation.evidence_collection.rules.Item`),
kept with :func:`remediation.evidence_collection.service.keep` as the step keeps them; then read through
the CLI, the API and the dashboard, and pruned by `remediation db prune` run as a real process.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
from fastapi.testclient import TestClient
from moto.server import ThreadedMotoServer
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from remediation.adapters.evidence_store import DirectoryStore, S3Store
from remediation.api import create_app
from remediation.cli.context import CliError
from remediation.cli.oncall import app as cli
from remediation.cli.remote import Remote
from remediation.db.models import EvidenceItem, Node, Remediation, RemediationStep
from remediation.db.session import make_engine, make_session_factory
from remediation.domain.statemachine import RemediationStatus, Step
from remediation.domain.states import StepStatus
from remediation.evidence_collection import service as collected
from remediation.evidence_collection.rules import EvidenceStatus, Item
from remediation.ports.errors import ConfigError, NotFound, PermanentError
from remediation.ports.evidence import EvidenceStorage
from remediation.settings import DatabaseSettings, Settings

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime.now(UTC).replace(microsecond=0)
INLINE = 1024
READ = "read-token-0123456789"
SECRET = "s3cr3t-never-in-an-error"

SMI = b"==============NVSMI LOG==============\nDriver Version : 550.54\nGPU 00000000:07:00.0\n" + b"x" * 3000
ROWS = b"gpu_bus_id, remapped_rows.uncorrectable\n00000000:07:00.0, 3\n"
KLOG = b"Xid (PCI:0000:07:00): 79, GPU has fallen off the bus\n\xff\xfe not utf-8\n"


def _items() -> list[Item]:
    return [
        Item("nvidia-smi-q", EvidenceStatus.COLLECTED, SMI, total_bytes=len(SMI), exit_code=0, duration_s=1.5),
        Item("remapped-rows", EvidenceStatus.COLLECTED, ROWS, total_bytes=len(ROWS), exit_code=0, duration_s=0.2),
        Item("kernel-log", EvidenceStatus.FAILED, KLOG, total_bytes=len(KLOG) + 500, exit_code=1, duration_s=0.4),
    ]


@pytest.fixture
def sessions(pg_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(DatabaseSettings(url=pg_url))
    yield make_session_factory(engine)
    engine.dispose()


@dataclass
class Kept:
    remediation: int
    step: int


def _remediation(sessions: sessionmaker[Session], node: str, *, closed_at: datetime | None,
                 outcome: str = "kept 3 item(s)") -> Kept:
    """A remediation of ``node`` with one collect_evidence step row (closed at ``closed_at``, else open)."""
    opened = (closed_at or NOW) - timedelta(hours=1)
    with sessions() as s, s.begin():
        if s.get(Node, ("default", node)) is None:
            s.add(Node(name=node, first_seen_at=opened, updated_at=opened))
            s.flush()
        rem = Remediation(node=node, cause="xid 79", source="slurm",
                          status=RemediationStatus.SUCCEEDED if closed_at else RemediationStatus.RUNNING,
                          step=Step.DONE if closed_at else Step.VM_RESTART, ladder=0, opened_at=opened,
                          updated_at=opened, closed_at=closed_at, context={})
        s.add(rem)
        s.flush()
        row = RemediationStep(remediation_id=rem.id, step=Step.COLLECT_EVIDENCE, attempt=1,
                              idempotency_key=f"{rem.id}:collect_evidence:1", status=StepStatus.DONE,
                              started_at=opened, finished_at=opened, outcome=outcome)
        s.add(row)
        s.flush()
        return Kept(rem.id, row.id)


def _keep(sessions: sessionmaker[Session], kept: Kept, storage: EvidenceStorage,
          items: list[Item] | None = None) -> int:
    with sessions() as s, s.begin():
        rem, row = s.get(Remediation, kept.remediation), s.get(RemediationStep, kept.step)
        assert rem is not None and row is not None
        return collected.keep(s, rem, row, items=_items() if items is None else items, store=storage, now=NOW)


def _rows(sessions: sessionmaker[Session], remediation_id: int) -> dict[str, EvidenceItem]:
    with sessions() as s:
        return {x.name: x for x in s.scalars(select(EvidenceItem).where(EvidenceItem.remediation_id == remediation_id))}


# ------------------------------------------------------------------------------------------- keep


def test_keep_puts_large_items_in_the_directory_and_small_ones_in_the_row(
        sessions: sessionmaker[Session], tmp_path: Path) -> None:
    storage = EvidenceStorage(INLINE, DirectoryStore(tmp_path))
    kept = _remediation(sessions, "gpu-node-1", closed_at=None)
    assert _keep(sessions, kept, storage) == 3
    rows = _rows(sessions, kept.remediation)
    smi, klog = rows["nvidia-smi-q"], rows["kernel-log"]
    assert smi.content is None and smi.location == f"dir:default/gpu-node-1/r{kept.remediation}/s{kept.step}/nvidia-smi-q"
    assert (tmp_path / smi.location.removeprefix("dir:")).read_bytes() == SMI
    assert (smi.size_bytes, smi.sha256, smi.truncated) == (len(SMI), hashlib.sha256(SMI).hexdigest(), False)
    assert klog.location is None and klog.content == KLOG.decode("utf-8", errors="replace")
    assert (klog.status, klog.exit_code, klog.truncated) == (EvidenceStatus.FAILED, 1, True)  # the job cut it
    assert rows["remapped-rows"].content == ROWS.decode()


def test_keep_twice_writes_nothing_twice_even_after_a_crash_before_the_commit(
        sessions: sessionmaker[Session], tmp_path: Path) -> None:
    """A worker killed after the store write and before its commit: the file is there, no row. The
    rerun writes each row once and the file again, identically."""
    storage = EvidenceStorage(INLINE, DirectoryStore(tmp_path))
    kept = _remediation(sessions, "gpu-node-2", closed_at=None)
    with pytest.raises(RuntimeError), sessions() as s, s.begin():
        rem, row = s.get(Remediation, kept.remediation), s.get(RemediationStep, kept.step)
        assert rem is not None and row is not None
        collected.keep(s, rem, row, items=_items(), store=storage, now=NOW)
        raise RuntimeError("killed before the commit")
    assert _rows(sessions, kept.remediation) == {}
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert [p.name for p in files] == ["nvidia-smi-q"]
    assert _keep(sessions, kept, storage) == 3
    assert _keep(sessions, kept, storage) == 0  # the redelivered task
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(EvidenceItem)
                        .where(EvidenceItem.step_id == kept.step)) == 3
    assert [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()] == [SMI]


def test_backend_database_cuts_a_large_item_to_fit_its_row(sessions: sessionmaker[Session]) -> None:
    kept = _remediation(sessions, "gpu-node-3", closed_at=None)
    _keep(sessions, kept, EvidenceStorage(INLINE))
    smi = _rows(sessions, kept.remediation)["nvidia-smi-q"]
    assert smi.location is None and smi.content == SMI[:INLINE].decode()
    assert (smi.size_bytes, smi.truncated, smi.sha256) == (INLINE, True, hashlib.sha256(SMI[:INLINE]).hexdigest())


# ------------------------------------------------------------------------------------------- S3


@pytest.fixture(scope="module")
def s3_url() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A bucket of the S3 server; the store finds its credentials in the environment, as deployed."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    name = f"evidence-{os.getpid()}-{id(tmp_path) % 10**6}"
    boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1").create_bucket(Bucket=name)
    return name


def test_s3_store_round_trips_through_a_real_s3_server(s3_url: str, bucket: str) -> None:
    store = S3Store(bucket, "site/evidence/", endpoint_url=s3_url, region="us-east-1")
    location = store.put("default/gpu-node-7/r1/s2/nvidia-smi-q", SMI)
    assert location == f"s3://{bucket}/site/evidence/default/gpu-node-7/r1/s2/nvidia-smi-q"
    raw = boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1")
    assert raw.get_object(Bucket=bucket, Key="site/evidence/default/gpu-node-7/r1/s2/nvidia-smi-q")["Body"].read() == SMI
    assert store.put("default/gpu-node-7/r1/s2/nvidia-smi-q", SMI) == location  # overwrites identically
    assert store.get(location) == SMI
    store.delete(location)
    store.delete(location)  # already gone: fine
    with pytest.raises(NotFound) as gone:
        store.get(location)
    assert "NoSuchKey" in gone.value.message
    for foreign in (f"s3://other-bucket/site/evidence/{bucket}", f"s3://{bucket}/elsewhere/key",
                    f"s3://{bucket}/site/evidence/../../x", "dir:a/b"):
        with pytest.raises(PermanentError):
            store.get(foreign)


def test_s3_errors_are_typed_and_name_no_secret(s3_url: str, bucket: str) -> None:
    missing = S3Store(bucket + "-missing", endpoint_url=s3_url, region="us-east-1")
    with pytest.raises(ConfigError) as got:
        missing.put("a/b", b"x")
    assert "NoSuchBucket" in got.value.message and SECRET not in str(got.value)
    assert SECRET not in repr(got.value.args)


# ----------------------------------------------------------------------------------------- prune


def _prune_cli(pg_url: str, store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")}
    env.update({"REMEDIATION_DATABASE__URL": pg_url, "PYTHONPATH": str(ROOT),
                "REMEDIATION_EVIDENCE__STORE__BACKEND": "directory", "REMEDIATION_EVIDENCE__STORE__PATH": str(store),
                "REMEDIATION_EVIDENCE__STORE__INLINE_BYTES": str(INLINE),
                "REMEDIATION_RETENTION__EVIDENCE_OLDER_THAN": "30d", "REMEDIATION_RETENTION__BATCH": "2"})
    return subprocess.run([sys.executable, "-m", "remediation.cli", "db", "prune", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_db_prune_removes_old_closed_remediations_evidence_files_first_and_keeps_the_rest(
        pg_url: str, sessions: sessionmaker[Session], tmp_path: Path) -> None:
    storage = EvidenceStorage(INLINE, DirectoryStore(tmp_path))
    old = [_remediation(sessions, f"gpu-node-{i}", closed_at=NOW - timedelta(days=40 + i)) for i in (1, 2)]
    recent = _remediation(sessions, "gpu-node-3", closed_at=NOW - timedelta(days=5))
    still_open = _remediation(sessions, "gpu-node-4", closed_at=None)
    for kept in (*old, recent, still_open):
        _keep(sessions, kept, storage)
    with sessions() as s, s.begin():  # an open remediation's evidence stays, however old it is
        s.get(Remediation, still_open.remediation).opened_at = NOW - timedelta(days=400)  # type: ignore[union-attr]
    files = {k.remediation: tmp_path / _rows(sessions, k.remediation)["nvidia-smi-q"].location.removeprefix("dir:")  # type: ignore[union-attr]
             for k in (*old, recent, still_open)}
    files[old[1].remediation].unlink()  # a file someone already removed: fine

    dry = _prune_cli(pg_url, tmp_path, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would delete 6 collected evidence item(s)" in dry.stdout and "2 file(s) or object(s)" in dry.stdout
    assert all(_rows(sessions, k.remediation) for k in old) and files[old[0].remediation].exists()

    out = _prune_cli(pg_url, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "deleted 6 collected evidence item(s)" in out.stdout and "2 file(s) or object(s)" in out.stdout
    assert [_rows(sessions, k.remediation) for k in old] == [{}, {}]
    assert not files[old[0].remediation].exists()
    for kept in (recent, still_open):
        assert set(_rows(sessions, kept.remediation)) == {"nvidia-smi-q", "remapped-rows", "kernel-log"}
        assert files[kept.remediation].read_bytes() == SMI


def test_prune_removes_objects_from_the_bucket(sessions: sessionmaker[Session], s3_url: str, bucket: str) -> None:
    storage = EvidenceStorage(INLINE, S3Store(bucket, "p/", endpoint_url=s3_url, region="us-east-1"))
    old = _remediation(sessions, "gpu-node-5", closed_at=NOW - timedelta(days=60))
    kept = _remediation(sessions, "gpu-node-6", closed_at=None)
    for k in (old, kept):
        _keep(sessions, k, storage)
    raw = boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1")

    def keys() -> set[str]:
        return {o["Key"] for o in raw.list_objects_v2(Bucket=bucket).get("Contents", [])}

    assert keys() == {f"p/default/gpu-node-5/r{old.remediation}/s{old.step}/nvidia-smi-q",
                      f"p/default/gpu-node-6/r{kept.remediation}/s{kept.step}/nvidia-smi-q"}
    result = collected.prune(sessions, retention=collected.EvidenceRetention(timedelta(days=30), storage), now=NOW)
    assert (result.items, result.blobs, result.left) == (3, 1, 0)
    assert keys() == {f"p/default/gpu-node-6/r{kept.remediation}/s{kept.step}/nvidia-smi-q"}
    assert _rows(sessions, old.remediation) == {} and len(_rows(sessions, kept.remediation)) == 3


# ------------------------------------------------------------------------------------------ views


@pytest.fixture
def shown(sessions: sessionmaker[Session], tmp_path: Path) -> tuple[Kept, Kept]:
    """One remediation with its three items (the large one in the directory), and one whose step
    collected nothing."""
    kept = _remediation(sessions, "gpu-node-7", closed_at=None)
    _keep(sessions, kept, EvidenceStorage(INLINE, DirectoryStore(tmp_path)))
    none = _remediation(sessions, "gpu-node-8", closed_at=None, outcome="no evidence: no validation backend")
    return kept, none


def _settings_env(pg_url: str, store: Path) -> dict[str, str]:
    return {"REMEDIATION_DATABASE__URL": pg_url, "REMEDIATION_EVIDENCE__STORE__BACKEND": "directory",
            "REMEDIATION_EVIDENCE__STORE__PATH": str(store), "REMEDIATION_EVIDENCE__STORE__INLINE_BYTES": str(INLINE),
            "USER": "oncall-tester", "COLUMNS": "250"}


def test_cli_show_lists_the_items_and_evidence_prints_one_whole(
        pg_url: str, shown: tuple[Kept, Kept], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REMEDIATION_CONFIG", "")
    runner, env = CliRunner(), _settings_env(pg_url, tmp_path)
    kept, none = shown
    res = runner.invoke(cli, ["remediations", "show", str(kept.remediation)], env=env)
    assert res.exit_code == 0, res.output
    section = res.stdout[res.stdout.index("Collected evidence"):]
    lines = {line.split()[0]: line.split() for line in section.splitlines()[2:5]}  # the table's three rows
    assert lines["nvidia-smi-q"][1:5] == ["collected", "0", f"{len(SMI) / 1024:.1f}", "KiB"]
    assert lines["nvidia-smi-q"][-1] == f"dir:default/gpu-node-7/r{kept.remediation}/s{kept.step}/nvidia-smi-q"
    assert lines["kernel-log"][1:3] == ["failed", "1"] and lines["kernel-log"][5] == "yes"
    assert lines["remapped-rows"][-1] == "database"
    assert "00000000:07:00.0, 3" in section  # a small item's first lines
    assert "Driver Version" not in section  # a large one is only listed
    whole = runner.invoke(cli, ["remediations", "evidence", str(kept.remediation), "nvidia-smi-q"], env=env)
    assert whole.exit_code == 0, whole.output
    assert whole.stdout == SMI.decode() + "\n"
    res = runner.invoke(cli, ["remediations", "show", str(none.remediation)], env=env)
    assert res.exit_code == 0 and "Collected evidence:  no evidence: no validation backend" in res.stdout, res.output
    gone = runner.invoke(cli, ["remediations", "evidence", str(kept.remediation), "dmesg"], env=env)
    assert gone.exit_code != 0 and "kept no collected evidence named 'dmesg'" in gone.output


@pytest.fixture
def client(pg_url: str, sessions: sessionmaker[Session], tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(database={"url": pg_url}, api={"read_tokens": [READ]},
                        evidence={"store": {"backend": "directory", "path": str(tmp_path), "inline_bytes": INLINE}})
    with TestClient(create_app(settings, sessions)) as c:
        yield c


def test_api_lists_the_items_and_serves_one_as_plain_text(client: TestClient, shown: tuple[Kept, Kept]) -> None:
    kept, none = shown
    auth = {"Authorization": f"Bearer {READ}"}
    d = client.get(f"/api/v1/remediations/{kept.remediation}", headers=auth).json()
    assert [(x["name"], x["status"], x["where"] == "database") for x in d["evidence_items"]] == [
        ("nvidia-smi-q", "collected", False), ("remapped-rows", "collected", True), ("kernel-log", "failed", True)]
    assert d["evidence_items"][1]["head"] == ROWS.decode().splitlines() and d["evidence_note"] is None
    res = client.get(f"/api/v1/remediations/{kept.remediation}/evidence/nvidia-smi-q", headers=auth)
    assert res.status_code == 200 and res.text == SMI.decode()
    assert res.headers["content-type"].startswith("text/plain") and res.headers["x-content-type-options"] == "nosniff"
    step = client.get(f"/api/v1/remediations/{kept.remediation}/evidence/kernel-log?step={kept.step}", headers=auth)
    assert step.text == KLOG.decode("utf-8", errors="replace")
    assert client.get(f"/api/v1/remediations/{kept.remediation}/evidence/nvidia-smi-q").status_code == 401
    for path, status in ((f"{kept.remediation}/evidence/dmesg", 404), ("424242/evidence/kernel-log", 404),
                         (f"{kept.remediation}/evidence/kernel-log?step={kept.step + 1000}", 404),
                         (f"{kept.remediation}/evidence/Bad..Name", 422)):
        res = client.get(f"/api/v1/remediations/{path}", headers=auth)
        assert res.status_code == status, path
        assert res.json()["detail"]
    assert client.get(f"/api/v1/remediations/{none.remediation}", headers=auth).json()["evidence_note"] == \
        "no evidence: no validation backend"


def test_cli_through_the_api_reads_the_same_items(client: TestClient, shown: tuple[Kept, Kept]) -> None:
    """`--server`: the CLI's remote backend over the same routes, detail and item alike."""
    kept, _ = shown
    remote = Remote("http://testserver", READ, client=client)
    assert [x.name for x in remote.remediation(kept.remediation).evidence_items] == [
        "nvidia-smi-q", "remapped-rows", "kernel-log"]
    assert remote.evidence(kept.remediation, "nvidia-smi-q") == SMI.decode()
    assert remote.evidence(kept.remediation, "remapped-rows", kept.step) == ROWS.decode()
    with pytest.raises(CliError) as missing:
        remote.evidence(kept.remediation, "dmesg")
    assert "kept no collected evidence named 'dmesg'" in str(missing.value)


def test_dashboard_page_shows_the_items_with_links_to_their_content(
        client: TestClient, shown: tuple[Kept, Kept], tmp_path: Path) -> None:
    kept, none = shown
    res = client.post("/login", data={"token": READ, "name": "dana", "next": "/"}, follow_redirects=False)
    assert res.status_code == 303
    page = client.get(f"/remediations/{kept.remediation}").text
    section = page[page.index('id="collected-evidence"'):]
    link = f'href="/remediations/{kept.remediation}/evidence/nvidia-smi-q?step={kept.step}"'
    assert link in section and "remapped-rows" in section and "kernel-log" in section
    assert "00000000:07:00.0, 3" in section and "Driver Version" not in section
    item = client.get(f"/remediations/{kept.remediation}/evidence/nvidia-smi-q?step={kept.step}")
    assert item.status_code == 200 and item.text == SMI.decode()
    assert item.headers["content-type"].startswith("text/plain")
    (tmp_path / f"default/gpu-node-7/r{kept.remediation}/s{kept.step}/nvidia-smi-q").unlink()
    assert client.get(f"/remediations/{kept.remediation}/evidence/nvidia-smi-q").status_code == 404
    other = client.get(f"/remediations/{none.remediation}").text
    assert "no evidence: no validation backend" in other[other.index('id="collected-evidence"'):]
