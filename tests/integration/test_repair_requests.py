"""Repair requests on real Postgres, a real HTTP receiver and the API: a hardware quarantine posts one
request; the repair system's "done" runs the GPU check through the engine and returns the node (or
quarantines it again with a request that follows the first); every refusal is clear."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.adapters.repair_system import DirectoryRepairSystem, NoopRepairSystem, WebhookRepairSystem
from remediation.api import create_app
from remediation.clock import FakeClock, aware
from remediation.db.models import AuditLog, Node, Remediation, RepairRequest
from remediation.domain.events import EventKind
from remediation.domain.step_bodies import Adapters
from remediation.ports.dispatch import FollowUp
from remediation.repair_requests.service import deliver_due
from remediation.services.workflow import Workflow
from remediation.settings import Settings
from remediation.validation.port import ValidationResult
from tests.integration.history import RecordingDispatcher, drive, engine_settings, publish, sessions  # noqa: F401
from tests.integration.test_reliability import gpu_lines
from tests.scripted_validator import ScriptedValidator

NODES = ["gpu-node-0", "gpu-node-1", "gpu-node-2"]
NODE = "gpu-node-1"
ADMIN, READ, REPAIR = "admin-token-0123456789", "read-token-0123456789", "repair-token-0123456789"
WEBHOOK_TOKEN = "webhook-bearer-0123456789"
AS = {role: {"Authorization": f"Bearer {tok}"} for role, tok in (("admin", ADMIN), ("read", READ),
                                                                   ("repair", REPAIR))}
BEFORE = ("1650000000001", "1650000000002")  # the GPUs the failing check named before the quarantine
AFTER = ("1650000000001", "1650000000099")  # after the repair: GPU 2 replaced


@dataclass
class Receiver:
    """A repair system's webhook: a threaded HTTP server on port 0 that records each POST and answers
    503 to the first ``failures`` of them."""

    failures: int = 0
    posts: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    answered: list[int] = field(default_factory=list)

    def serve(self) -> tuple[ThreadingHTTPServer, str]:
        me = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                code = 503 if len(me.answered) < me.failures else 202
                me.answered.append(code)
                if code == 202:
                    me.posts.append(json.loads(body))
                    me.headers.append(dict(self.headers))
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server, f"http://127.0.0.1:{server.server_address[1]}/repair/hook?key=s3cret-in-url"


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    rec = Receiver()
    server, url = rec.serve()
    yield rec, url
    server.shutdown()
    server.server_close()


@dataclass
class Site:
    sessions: sessionmaker[Session]
    settings: Settings
    clock: FakeClock
    world: MemoryWorld
    checks: ScriptedValidator
    engine: Workflow
    url: str
    receiver: Receiver

    def webhook(self) -> WebhookRepairSystem:
        return WebhookRepairSystem(self.url, 5.0, WEBHOOK_TOKEN)

    def deliver(self) -> tuple[list[int], list[int]]:
        done = deliver_due(self.sessions, self.webhook(), self.settings.repair, clock=self.clock,
                           noop=NoopRepairSystem())
        return done.delivered, done.failed

    def request(self, rid: int | None = None) -> RepairRequest:
        with self.sessions() as s:
            q = select(RepairRequest).order_by(RepairRequest.id.desc())
            row = s.get(RepairRequest, rid) if rid is not None else s.scalars(q).first()
            assert row is not None
            return row

    def node(self) -> Node:
        with self.sessions() as s:
            node = s.get(Node, ("default", NODE))
            assert node is not None
            return node


def check(*serials: str, passed: bool) -> ValidationResult:
    return ValidationResult(done=True, exit_code=0 if passed else 1, state="COMPLETED" if passed else "FAILED",
                            output=f"{'PASS' if passed else 'FAIL: dcgmi diag level 3'}\n{gpu_lines(*serials)}")


def site_settings(url: str, *, validation: dict[str, object] | None = None, **repair: object) -> Settings:
    base = engine_settings(
        evidence={"enabled": False}, validation=validation or {},
        repair={"enabled": True, "webhook_url": url, "backoff_base_s": 60, "backoff_max_s": 600, **repair},
        api={"tokens": [{"name": "oncall", "role": "admin", "token": ADMIN},
                        {"name": "viewer", "role": "read", "token": READ},
                        {"name": "rma-desk", "role": "repair", "token": REPAIR}]})
    faults = base.policy.faults.model_copy(update={"classify": True, "ladders": {"gpu-memory": ["move-host", "quarantine"]}})
    return base.model_copy(update={"policy": base.policy.model_copy(update={"faults": faults})})


@pytest.fixture
def site(sessions: sessionmaker[Session], receiver: tuple[Receiver, str]) -> Site:  # noqa: F811
    """gpu-node-1's xid 48: moved to a new host, its GPU check fails, and it is quarantined for an RMA."""
    rec, url = receiver
    settings = site_settings(url)
    clock = FakeClock(datetime(2026, 11, 20, 8, tzinfo=UTC))
    world = MemoryWorld(nodes=NODES)
    checks = ScriptedValidator([check(*BEFORE, passed=False)])
    engine = Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world), checks),
                      settings, clock=clock)
    for node in NODES:
        publish(sessions, settings, clock, node, state="IDLE", reason="", kind=EventKind.INVENTORY)
    drive(engine, clock, publish(sessions, settings, clock, NODE, reason="xid 48", world=world))
    return Site(sessions, settings, clock, world, checks, engine, url, rec)


def api(site: Site, dispatch: RecordingDispatcher) -> TestClient:
    return TestClient(create_app(site.settings, site.sessions, clock=site.clock, dispatcher=dispatch))


def dashboard(client: TestClient, path: str) -> str:
    """A dashboard page as a logged-in reader sees it."""
    login = client.post("/login", data={"token": READ, "next": path}, follow_redirects=False)
    assert login.status_code == 303, login.text
    page = client.get(path)
    assert page.status_code == 200, page.text
    return page.text


def callback(client: TestClient, rid: int, role: str = "repair", **body: object) -> Any:
    return client.post(f"/api/v1/repair-requests/{rid}/callback", headers=AS[role],
                       json={"status": "done", "ticket": "RMA-20931", **body})


def test_quarantine_posts_one_request_and_done_rechecks_and_returns_the_node(site: Site) -> None:
    with site.sessions() as s:
        first = s.scalars(select(Remediation).where(Remediation.node == NODE)).one()
    assert first.status == "quarantined" and "RMA" in first.outcome
    assert site.node().status == "with-repair"
    req = site.request()
    assert (req.status, req.delivery, req.remediation_id, req.follows_id) == ("open", "pending", first.id, None)

    assert site.deliver() == ([req.id], [])
    assert site.deliver() == ([], [])  # delivered once: nothing is due any more
    assert len(site.receiver.posts) == 1
    body, headers = site.receiver.posts[0], site.receiver.headers[0]
    assert headers["Authorization"] == f"Bearer {WEBHOOK_TOKEN}"
    assert headers["Idempotency-Key"] == f"repair-request-default-{req.id}"
    assert body["schema_version"] == 1 and body["node"] == NODE and body["cluster"] == "default"
    assert body["request"] == {"id": req.id, "follows": None, "opened_at": aware(req.opened_at).isoformat(),
                               "dry_run": False, "callback": f"/api/v1/repair-requests/{req.id}/callback"}
    assert body["fault"]["class"] == "gpu-memory" and body["fault"]["remediation"] == first.id
    assert "RMA" in body["fault"]["reason"] and body["fault"]["evidence"].startswith("xid 48")
    assert sorted(g["serial"] for g in body["hardware"]["gpus"]) == list(BEFORE)
    assert all(g["uuid"].startswith("GPU-") for g in body["hardware"]["gpus"])
    assert body["hardware"]["instance_id"] or body["hardware"]["host"]  # the quarantine read the machine
    # Its history: the fault that opened the remediation and the GPU check that failed after the move.
    assert [h["fault_class"] for h in body["history"]] == ["gpu-memory", "gpu-memory"]
    assert body["lemon"]["failures"] == 2 and body["lemon"]["score"] > 0
    assert site.request().delivery == "delivered"

    site.checks.results.append(check(*AFTER, passed=True))
    dispatch = RecordingDispatcher()
    with api(site, dispatch) as client:
        res = callback(client, req.id, note="GPU 2 replaced")
        assert res.status_code == 200, res.text
        recheck = res.json()["recheck_id"]
        assert dispatch.steps_called == [FollowUp(recheck, "validate")]
        assert site.node().status == "remediating" and site.request().status == "rechecking"
        drive(site.engine, site.clock, dispatch.steps_called)
        again = callback(client, req.id)
        assert again.status_code == 409 and "already returned" in again.json()["detail"]
    with site.sessions() as s:
        rem = s.get(Remediation, recheck)
        steps = [st.step for st in rem.steps]
    assert rem.status == "succeeded" and steps == ["validate", "return"]
    assert [c for c, _ in site.checks.calls].count("start") == 2  # the failing check, then the re-check's
    assert site.node().status == "healthy"
    assert site.world.node(NODE)["slurm"]["state"] == "IDLE"  # our drain given back
    done = site.request()
    assert (done.status, done.ticket, done.closed_by, done.recheck_id) == ("returned", "RMA-20931", "rma-desk", recheck)
    assert done.new_hardware == "GPU serials changed (1 of 2 replaced)"
    assert "new hardware after repair request" in rem.outcome


def test_a_failing_recheck_quarantines_again_with_a_request_that_follows_the_first(site: Site) -> None:
    first = site.request()
    site.checks.results.append(check(*BEFORE, passed=False))
    dispatch = RecordingDispatcher()
    with api(site, dispatch) as client:
        assert callback(client, first.id, role="admin").status_code == 200  # an admin may answer too
    drive(site.engine, site.clock, dispatch.steps_called)
    with site.sessions() as s:
        rem = s.get(Remediation, dispatch.steps_called[0].remediation_id)
    assert rem.status == "quarantined" and f"re-check after repair request #{first.id} failed" in rem.outcome
    assert [st.step for st in rem.steps] == ["validate", "quarantine"]  # no ladder climbed
    assert site.request(first.id).status == "failed-check"
    second = site.request()
    assert second.id != first.id and second.follows_id == first.id and second.status == "open"
    assert site.node().status == "with-repair"
    assert site.deliver() == ([second.id], [])
    assert site.receiver.posts[-1]["request"]["follows"] == first.id


def test_a_failing_webhook_is_retried_with_backoff_and_the_quarantine_stands(
    sessions: sessionmaker[Session], receiver: tuple[Receiver, str],  # noqa: F811
) -> None:
    rec, url = receiver
    rec.failures = 2
    settings = site_settings(url)
    clock = FakeClock(datetime(2026, 11, 20, 8, tzinfo=UTC))
    world = MemoryWorld(nodes=NODES)
    engine = Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world),
                                         ScriptedValidator([check(*BEFORE, passed=False)])), settings, clock=clock)
    site = Site(sessions, settings, clock, world, ScriptedValidator([]), engine, url, rec)
    for node in NODES:
        publish(sessions, settings, clock, node, state="IDLE", reason="", kind=EventKind.INVENTORY)
    drive(engine, clock, publish(sessions, settings, clock, NODE, reason="xid 48", world=world))
    assert site.node().status == "with-repair"  # the quarantine completed before any delivery
    req = site.request()
    assert site.deliver() == ([], [req.id])
    failed = site.request()
    assert failed.attempts == 1 and failed.last_error == "repair webhook answered HTTP 503"
    assert aware(failed.next_attempt_at) == clock.now() + timedelta(seconds=60)
    assert "s3cret" not in (failed.last_error or "")
    assert site.deliver() == ([], [])  # not due before its backoff
    clock.advance(60)
    assert site.deliver() == ([], [req.id])
    assert aware(site.request().next_attempt_at) == clock.now() + timedelta(seconds=120)  # twice the wait
    with api(site, RecordingDispatcher()) as client:  # the dashboard shows the failing delivery
        page = dashboard(client, "/")
        node_page = dashboard(client, f"/nodes/{NODE}")
    assert "Repair requests failing delivery" in page and "repair webhook answered HTTP 503" in page
    assert f"#{req.id} open" in node_page and "delivery failing</strong> (2 attempts" in node_page
    assert "s3cret" not in page + node_page
    clock.advance(120)
    assert site.deliver() == ([req.id], [])
    assert rec.answered == [503, 503, 202] and len(rec.posts) == 1
    with sessions() as s:
        paged = s.scalars(select(AuditLog).where(AuditLog.action == "repair_delivery_failed")).all()
    assert len(paged) == 1 and "s3cret" not in paged[0].reason  # paged once, never with the URL
    with api(site, RecordingDispatcher()) as client:
        assert "Repair requests failing delivery" not in dashboard(client, "/")  # delivered: gone


def test_unknown_requests_and_other_roles_are_refused_clearly(site: Site) -> None:
    req = site.request()
    with api(site, RecordingDispatcher()) as client:
        res = callback(client, req.id + 1000)
        assert res.status_code == 404 and f"no repair request #{req.id + 1000}" in res.json()["detail"]
        res = callback(client, req.id, role="read")
        assert res.status_code == 403 and "repair or admin token" in res.json()["detail"]
        res = client.get("/api/v1/repair-requests", headers=AS["repair"])  # the repair role reads nothing
        assert res.status_code == 403 and "repair" in res.json()["detail"]
        assert client.get("/api/v1/nodes", headers=AS["repair"]).status_code == 403
        assert client.post("/login", data={"token": REPAIR, "next": "/"}, follow_redirects=False).status_code == 401
        bad = client.post(f"/api/v1/repair-requests/{req.id}/callback", headers=AS["repair"],
                          json={"status": "fixed", "ticket": "RMA-1"})
        assert bad.status_code == 422
        bad = callback(client, req.id, ticket="RMA 1\nrm -rf")
        assert bad.status_code == 422
        bad = callback(client, req.id, extra="x")
        assert bad.status_code == 422
        huge = client.post(f"/api/v1/repair-requests/{req.id}/callback", headers=AS["repair"],
                           content=b'{"status": "done", "ticket": "' + b"x" * 70000 + b'"}',
                           )
        assert huge.status_code == 413
        listed = client.get("/api/v1/repair-requests", headers=AS["read"]).json()
        assert [r["id"] for r in listed] == [req.id]
        shown = client.get(f"/api/v1/repair-requests/{req.id}", headers=AS["read"]).json()
        assert shown["payload"]["node"] == NODE
        assert client.get(f"/api/v1/repair-requests/{req.id + 1000}", headers=AS["read"]).status_code == 404
        abandoned = callback(client, req.id, status="abandoned", note="no spare boards")
        assert abandoned.status_code == 200
    assert site.request().status == "abandoned" and site.node().status == "quarantined"
    with site.sessions() as s:
        assert s.scalars(select(Remediation).where(Remediation.node == NODE)).all()[-1].status == "quarantined"


def test_file_delivery_writes_one_file(site: Site, tmp_path: Path) -> None:
    req = site.request()
    box = DirectoryRepairSystem(tmp_path / "requests")
    first = deliver_due(site.sessions, box, site.settings.repair, clock=site.clock)
    assert first.delivered == [req.id]
    assert deliver_due(site.sessions, box, site.settings.repair, clock=site.clock).delivered == []
    files = list((tmp_path / "requests").iterdir())
    assert [f.name for f in files] == [f"repair-request-default-{req.id}.json"]
    assert json.loads(files[0].read_text())["request"]["id"] == req.id


def test_release_still_works_on_a_node_with_repair(site: Site) -> None:
    dispatch = RecordingDispatcher()
    with api(site, dispatch) as client:
        res = client.post(f"/api/v1/nodes/{NODE}/release", headers=AS["admin"], json={"reason": "fixed by hand"})
    assert res.status_code == 200, res.text
    assert site.node().status == "healthy" and dispatch.released(site.sessions) == [NODE]
    req = site.request()
    assert (req.status, req.delivery, req.closed_by) == ("released", "stopped", "oncall")
    assert site.deliver() == ([], [])  # a released request is never sent


def test_the_cli_lists_shows_and_answers_a_request(site: Site, pg_url: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from remediation.cli.oncall import app

    monkeypatch.setenv("REMEDIATION_CONFIG", "")
    dispatch = RecordingDispatcher()
    env = {"REMEDIATION_DATABASE__URL": pg_url, "USER": "oncall-tester", "COLUMNS": "250"}

    def run(*args: str) -> Any:
        return CliRunner().invoke(app, list(args), env=env, obj=lambda _settings: dispatch)

    req = site.request()
    listed = run("repair", "list", "-o", "json")
    assert listed.exit_code == 0, listed.output
    assert [(r["id"], r["node"], r["status"]) for r in json.loads(listed.stdout)] == [(req.id, NODE, "open")]
    shown = run("repair", "show", str(req.id))
    assert shown.exit_code == 0 and '"schema_version": 1' in shown.stdout
    bad = run("repair", "done", NODE, "--ticket", "two words")
    assert bad.exit_code != 0 and "a ticket is" in bad.output
    unknown = run("repair", "done", "gpu-node-0", "--ticket", "RMA-1")
    assert unknown.exit_code != 0 and "gpu-node-0 has no open repair request" in unknown.output
    done = run("repair", "done", NODE, "--ticket", "RMA-77", "--note", "board swapped")
    assert done.exit_code == 0, done.output
    recheck = dispatch.steps_called[0].remediation_id
    assert f"re-check #{recheck}" in done.stdout
    assert (site.request().status, site.request().closed_by) == ("rechecking", "oncall-tester")
    again = run("repair", "abandon", NODE, "--ticket", "RMA-77")
    assert again.exit_code != 0 and "no open repair request" in again.output


def test_repair_time_per_hardware_item_is_in_the_reliability_report(site: Site, pg_url: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from remediation.cli.main import app as cli
    from remediation.reports.reliability import standalone_html
    from remediation.services.reliability import reliability

    req = site.request()
    machine = next(v for k, v in sorted(req.payload["hardware"].items()) if k in ("host", "instance_id") and v)
    site.clock.advance(30 * 3600)  # the repair system takes 30 hours
    site.checks.results.append(check(*BEFORE, passed=True))
    dispatch = RecordingDispatcher()
    with api(site, dispatch) as client:
        assert callback(client, req.id).status_code == 200
    drive(site.engine, site.clock, dispatch.steps_called)
    assert site.request(req.id).status == "returned" and site.request(req.id).new_hardware is None
    with site.sessions() as s:
        rep = reliability(s, site.clock.now() - timedelta(days=7), site.clock.now() + timedelta(hours=1),
                          lemon=site.settings.policy.lemon)
    done_h = (aware(site.request(req.id).done_at) - aware(req.opened_at)).total_seconds() / 3600
    assert done_h == pytest.approx(30, abs=0.1)
    by_item = {x.hardware: x for x in rep.repairs}
    assert set(by_item) == {f"{'host' if machine == req.payload['hardware']['host'] else 'instance'}:{machine}",
                            *(f"gpu:{sn}" for sn in BEFORE)}
    assert all(x.repairs == 1 and x.median_h == pytest.approx(done_h) and x.nodes == (NODE,) for x in by_item.values())
    assert "Repair time per hardware item" in standalone_html(rep, site.clock.now())
    monkeypatch.setenv("REMEDIATION_CONFIG", "")
    out = CliRunner().invoke(cli, ["reliability", "-o", "csv", "-f", "-", "--since", "3650d"],
                             env={"REMEDIATION_DATABASE__URL": pg_url, "COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert f"repair_time,hardware,gpu:{BEFORE[0]},repairs,1" in out.stdout


def test_a_new_host_after_the_repair_is_recorded_as_new_hardware(site: Site) -> None:
    from remediation.services.hardware import node_eras

    req = site.request()
    asked = req.payload["hardware"]["host"]
    with site.world.mutate() as st:
        st["nodes"][NODE]["vm"]["host"] = 7  # the repair system put the node's name on another machine
    site.checks.results.append(check(*BEFORE, passed=True))  # the same GPUs (moved with their board)
    dispatch = RecordingDispatcher()
    with api(site, dispatch) as client:
        assert callback(client, req.id).status_code == 200
    drive(site.engine, site.clock, dispatch.steps_called)
    done = site.request(req.id)
    assert done.status == "returned"
    assert done.new_hardware == f"host changed ({asked} -> {NODE}-host7)"
    with site.sessions() as s:
        eras = node_eras(s, [NODE])[NODE]
        audited = s.scalars(select(AuditLog.reason).where(AuditLog.action == "repair_new_hardware")).all()
    assert eras[-1].host == f"{NODE}-host7" and eras[-1].why.startswith("host changed")
    assert eras[-1].since == aware(done.closed_at)  # the re-check's return read it
    assert audited == [done.new_hardware]


def test_the_request_names_the_collected_evidence_and_sends_small_items_inline(site: Site) -> None:
    from remediation.db.models import EvidenceItem, RemediationStep
    from remediation.repair_requests.service import evidence_of

    rid = site.request().remediation_id
    small, large = "gpu,remapped\n0,2\n", "x" * 9000
    with site.sessions() as s, s.begin():
        step = s.scalars(select(RemediationStep.id).where(RemediationStep.remediation_id == rid)).first()
        for name, content, location in (("remapped-rows", small, None), ("kernel-log", large, None),
                                        ("nvidia-bug-report", None, "dir:nvidia-bug-report-41")):
            s.add(EvidenceItem(remediation_id=rid, step_id=step, node=NODE, name=name, status="collected",
                               exit_code=0, size_bytes=len(content or "") or 4_000_000, truncated=False,
                               sha256="0" * 64, content=content, location=location, collected_at=site.clock.now()))
    with site.sessions() as s:
        items = {e.name: e for e in evidence_of(s, rid)}
    assert items["remapped-rows"].content == small and items["remapped-rows"].size_bytes == len(small)
    assert items["kernel-log"].content is None  # kept in the database, but over 8 KiB: named, not sent
    assert items["nvidia-bug-report"].content is None and items["nvidia-bug-report"].location == "dir:nvidia-bug-report-41"
    assert items["nvidia-bug-report"].sha256 == "0" * 64 and items["nvidia-bug-report"].status == "collected"


def test_cancelling_a_recheck_ends_its_request_so_the_node_can_have_another(site: Site) -> None:
    req = site.request()
    dispatch = RecordingDispatcher()
    with api(site, dispatch) as client:
        recheck = callback(client, req.id).json()["recheck_id"]
        res = client.post(f"/api/v1/remediations/{recheck}/cancel", headers=AS["admin"],
                          json={"reason": "the board is not back yet"})
        assert res.status_code == 200, res.text
    ended = site.request(req.id)
    assert ended.status == "abandoned" and f"re-check #{recheck} cancelled" in (ended.note or "")


def test_done_on_a_tray_of_an_nvlink_domain_ends_with_the_domain_check(
    sessions: sessionmaker[Session], receiver: tuple[Receiver, str],  # noqa: F811
) -> None:
    """With ``validation.domain_check_on_return``, the re-check's return hands the tray to a repair of
    its domain, whose one check over every tray decides: the tray's own check, then the domain's."""
    from remediation.db.models import DomainRepair
    from remediation.domain_repair.rules import DomainRepairStatus
    from remediation.domain_repair.service import DomainRepairs
    from tests.integration.test_domain_repair_ingest import _blocks

    rec, url = receiver
    clock = FakeClock(datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5))
    _blocks(sessions, clock)
    settings = site_settings(url, validation={"backend": "slurm", "domain_check_on_return": True})
    world = MemoryWorld([f"gpu-node-{i}" for i in range(8)])
    checks = ScriptedValidator([check(*BEFORE, passed=False)])
    engine = Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world), checks), settings,
                      clock=clock)
    site = Site(sessions, settings, clock, world, checks, engine, url, rec)
    drive(engine, clock, publish(sessions, settings, clock, NODE, reason="xid 48", world=world))
    req = site.request()
    assert site.node().status == "with-repair"
    checks.results += [check(*BEFORE, passed=True), check(passed=True)]  # the tray's check, the domain's
    dispatch = RecordingDispatcher()
    with api(site, dispatch) as client:
        assert callback(client, req.id).status_code == 200
    drive(engine, clock, dispatch.steps_called)
    with sessions() as s:
        recheck = s.get(Remediation, dispatch.steps_called[0].remediation_id)
        handed = recheck.ctx.domain_repair
    assert handed is not None and "DRAIN" in world.node(NODE)["slurm"]["flags"]  # the domain decides
    repairs = DomainRepairs(sessions, Adapters(MemorySlurm(world), MemoryKube(world), None, checks), settings,
                            clock=clock)
    for _ in range(20):
        if repairs.advance(handed) is None:
            break
    with sessions() as s:
        assert s.get(DomainRepair, handed).status is DomainRepairStatus.RETURNED
    (domain_check,) = [c for name, c in checks.calls if name == "start" and c.nodes]
    assert NODE in domain_check.nodes and len(domain_check.nodes) == 4
    assert "DRAIN" not in world.node(NODE)["slurm"]["flags"]
    done = site.request(req.id)
    assert done.status == "returned" and f"handed to domain repair #{handed}" in (done.note or "")


def test_a_worker_with_beat_delivers_the_request_and_retries_a_failure(
    site: Site, pg_url: str, redis_prefix: str, tmp_path: Path,
) -> None:
    """The real processes: a Celery worker with embedded beat sends the open request; the receiver
    refuses the first POST, and the next pass, after its backoff, delivers it once."""
    from tests.conftest import REDIS_URL
    from tests.integration.workerproc import Worker, wait_for, worker_env

    site.receiver.failures = 1
    req = site.request()
    env = worker_env(pg_url, REDIS_URL, redis_prefix, tmp_path, REMEDIATION_REPAIR__ENABLED="true",
                     REMEDIATION_REPAIR__WEBHOOK_URL=site.url, REMEDIATION_REPAIR__BACKOFF_BASE_S="1",
                     REMEDIATION_REPAIR__BACKOFF_MAX_S="2")
    worker = Worker(env, tmp_path)
    try:
        # The barrier is the worker's own record of the delivery, not the receiver's: the POST lands
        # before the worker commits what it was answered.
        wait_for(lambda: site.request(req.id).delivery == "delivered", 60,
                 "the repair request delivered and recorded by the worker", worker)
    finally:
        worker.stop()
    assert site.receiver.answered == [503, 202] and site.receiver.posts[0]["request"]["id"] == req.id
    done = site.request(req.id)
    assert (done.delivery, done.attempts, done.last_error) == ("delivered", 1, "repair webhook answered HTTP 503")
    assert "s3cret" not in worker.output()  # the URL is a credential: in no log line
