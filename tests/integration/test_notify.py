"""Webhook notifications through the audit-log outbox, posted to a real local HTTP receiver.

The receiver is a stdlib HTTP server recording every POST; the notifier uses its default httpx
poster, so the payload really crosses a socket. The webhook path carries a fake secret, which must
never show up in the logs, even when the receiver fails.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from remediation.clock import FakeClock
from remediation.db.queries import control_get
from remediation.db.scope import scoped
from remediation.db.session import make_engine, make_session_factory
from remediation.services.audit import audit
from remediation.services.notify import CURSOR, run_pass
from remediation.settings import DatabaseSettings, NotifySettings
from tests.integration.history import build, sessions  # noqa: F401  (fixture)

SECRET = "T000/B000/XXXXsupersecretXXXX"


class Receiver:
    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.status == 200:
                    receiver.posts.append({"path": self.path, **json.loads(body)})
                self.send_response(receiver.status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/{SECRET}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def texts(self) -> list[str]:
        return [p["text"] for p in self.posts]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime.now(UTC))


def cfg(receiver: Receiver | None, **kw: Any) -> NotifySettings:
    return NotifySettings(webhook_url=receiver.url if receiver else None, min_interval_s=300, max_per_pass=5, **kw)


def add(sessions: sessionmaker[Session], clock: FakeClock, action: str, target: str = "", reason: str = "r",
        n: int = 1) -> None:
    with sessions() as s, s.begin():
        for _ in range(n):
            audit(s, clock.now(), "remediation", action=action, target=target, reason=reason,
                  detail={"remediation": 7})


def test_old_history_is_not_paged_and_new_quarantine_is(sessions, receiver, clock) -> None:
    build(sessions)  # two days old: stale, not worth a page
    first = run_pass(sessions, cfg(receiver), clock=clock)
    assert first.sent == 0 and first.stale > 0 and receiver.posts == []
    add(sessions, clock, "remediation_quarantined", "gpu-node-8", "VM ladder exhausted: not healthy")
    add(sessions, clock, "open", "gpu-node-1")  # not notifiable
    res = run_pass(sessions, cfg(receiver, dashboard_url="https://oncall.example/"), clock=clock)
    assert res.sent == 1
    (text,) = receiver.texts
    assert "*Quarantined*" in text and "<https://oncall.example/nodes/gpu-node-8|gpu-node-8>" in text
    assert "> VM ladder exhausted: not healthy" in text and "remediation #7" in text
    assert receiver.posts[0]["path"] == f"/services/{SECRET}"


def test_rate_limit_per_action_and_node(sessions, receiver, clock) -> None:
    add(sessions, clock, "escalate", "gpu-node-1")
    assert run_pass(sessions, cfg(receiver), clock=clock).sent == 1
    clock.advance(60)
    add(sessions, clock, "escalate", "gpu-node-1", n=3)  # the same news again: held back
    add(sessions, clock, "escalate", "gpu-node-2")  # another node: sent
    add(sessions, clock, "remediation_quarantined", "gpu-node-1")  # another action: sent
    res = run_pass(sessions, cfg(receiver), clock=clock)
    assert (res.sent, res.suppressed) == (2, 3)
    clock.advance(301)  # the interval has passed: gpu-node-1's next escalation is news again
    add(sessions, clock, "escalate", "gpu-node-1")
    assert run_pass(sessions, cfg(receiver), clock=clock).sent == 1
    assert len(receiver.posts) == 4


def test_a_storm_is_collapsed_into_one_summary(sessions, receiver, clock) -> None:
    add(sessions, clock, "breaker_open", "", "60/200 nodes failed within the breaker window")
    for i in range(40):
        add(sessions, clock, "escalate", f"gpu-node-{i}", "verify timed out")
    for i in range(10):
        add(sessions, clock, "remediation_quarantined", f"gpu-node-{i}")
    res = run_pass(sessions, cfg(receiver), clock=clock)
    assert (res.sent, res.collapsed) == (6, 46)
    assert "Storm breaker OPEN" in receiver.texts[0]
    summary = receiver.texts[-1]
    assert "and 46 more" in summary
    assert "Escalated: 36 on gpu-node-[4-39]" in summary
    assert "Quarantined: 10 on gpu-node-[0-9]" in summary
    # Collapsed rows count as told: a re-run sends nothing more.
    assert run_pass(sessions, cfg(receiver), clock=clock).sent == 0


def test_cursor_survives_a_restart_and_failed_posts_are_retried_without_leaking_the_url(
    pg_url, sessions, receiver, clock, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    add(sessions, clock, "quarantine", "gpu-node-3", "manual")
    receiver.status = 500
    failed = run_pass(sessions, cfg(receiver), clock=clock)
    assert failed.failed and failed.sent == 0 and receiver.posts == []
    assert "HTTP 500" in caplog.text
    receiver.status = 200
    # A "restarted" process: new engine, new session factory; the cursor lives in the database.
    engine = make_engine(DatabaseSettings(url=pg_url))
    try:
        restarted = make_session_factory(engine)
        assert run_pass(restarted, cfg(receiver), clock=clock).sent == 1  # the failed message, retried
        assert run_pass(restarted, cfg(receiver), clock=clock).sent == 0  # and only once
        with restarted() as s:
            assert control_get(s, CURSOR)["id"] > 0
    finally:
        engine.dispose()
    assert len(receiver.posts) == 1 and "Quarantined by hand" in receiver.texts[0]
    receiver.server.shutdown()  # unreachable receiver: the error names the failure, never the URL
    receiver.server.server_close()
    add(sessions, clock, "release", "gpu-node-3", "fixed")
    assert run_pass(sessions, cfg(receiver, timeout_s=2), clock=clock).failed
    assert "webhook unreachable" in caplog.text
    assert "HTTP Request: POST <webhook>" in caplog.text  # httpx's own log line, redacted
    assert SECRET not in caplog.text and "supersecret" not in caplog.text


def test_without_a_webhook_the_pass_only_advances_the_cursor(sessions, clock) -> None:
    add(sessions, clock, "breaker_open", n=3)
    res = run_pass(sessions, cfg(None), clock=clock)
    assert res.sent == 0 and res.scanned == 3
    with sessions() as s:
        assert control_get(s, CURSOR)["id"] == res.cursor
    assert run_pass(sessions, cfg(None), clock=clock).scanned == 0


def test_a_checkpoint_request_is_posted_naming_the_jobs(sessions, receiver, clock) -> None:
    run_pass(sessions, cfg(receiver), clock=clock)  # past whatever the database already held
    add(sessions, clock, "checkpoint_requested", "gpu-node-3",
        "checkpoint request: signalled USR1 (batch) to 1 job(s) (4242) on gpu-node-3")
    assert run_pass(sessions, cfg(receiver), clock=clock).sent == 1
    (text,) = receiver.texts
    assert "Jobs asked to save their work" in text and "(4242)" in text


def test_text_from_outside_is_escaped_so_it_cannot_ping_or_link(sessions, receiver, clock) -> None:
    """A reason is whatever a human or a node's Slurm reason said: Slack's control sequences in it
    (``<!channel>``, a ``<url|label>`` link, an ``&`` entity) arrive as text, never as markup."""
    run_pass(sessions, cfg(receiver), clock=clock)  # past whatever the database already held
    add(sessions, clock, "quarantine", "gpu<node>&1", "<!channel> see <https://evil.example|the fix> & more")
    assert run_pass(sessions, cfg(receiver, dashboard_url="https://oncall.example"), clock=clock).sent == 1
    (text,) = receiver.texts
    assert "<!channel>" not in text and "<https://evil" not in text
    assert "&lt;!channel&gt; see &lt;https://evil.example|the fix&gt; &amp; more" in text
    assert "<https://oncall.example/nodes/gpu%3Cnode%3E%261|gpu&lt;node&gt;&amp;1>" in text


def test_a_page_names_its_cluster_unless_it_is_the_default(sessions, receiver, clock) -> None:
    """One database, two clusters: east's gpu-node-1 and the default cluster's gpu-node-1 are two nodes
    (two pages, not one held back by the rate limit); east's page says east, and links to its node."""
    add(sessions, clock, "escalate", "gpu-node-1", "verify timed out")
    add(scoped(sessions, "east"), clock, "escalate", "gpu-node-1", "verify timed out")
    res = run_pass(sessions, cfg(receiver, dashboard_url="https://oncall.example/"), clock=clock)
    assert (res.sent, res.suppressed) == (2, 0)
    default, east = receiver.texts
    assert "cluster" not in default and "<https://oncall.example/nodes/gpu-node-1|gpu-node-1>" in default
    assert "<https://oncall.example/nodes/gpu-node-1?cluster=east|gpu-node-1> in cluster *east*" in east
    # A storm's summary says which cluster's nodes it collapsed.
    for i in range(8):
        add(scoped(sessions, "east"), clock, "remediation_quarantined", f"gpu-node-{i}")
    res = run_pass(sessions, cfg(receiver), clock=clock)
    assert (res.sent, res.collapsed) == (6, 3)
    assert "Quarantined: 3 in cluster east on gpu-node-[5-7]" in receiver.texts[-1]
