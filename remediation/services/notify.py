"""Slack-compatible webhook notifications, with the audit log as a durable outbox.

One periodic pass reads audit rows after a cursor (``notify_cursor``) in three phases: **plan** (one
short transaction: pick, rate-limit and summarise rows, take a lease), **post** (no transaction open),
**record** (advance the cursor, give back the lease). Delivery is at-least-once. Dry-run rows are
marked, outside text is escaped, and the webhook URL, a secret, is never logged. A row of a cluster other
than ``default`` names its cluster (one database serves several).

Why: docs/architecture.md#notifications-the-audit-log-is-the-outbox
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.webhook import NotifyError, Post
from remediation.clock import SystemClock, aware
from remediation.db.models import AuditLog, Control
from remediation.db.queries import control_set
from remediation.db.scope import cluster_of
from remediation.domain.policy import Clock
from remediation.domain.states import AuditAction
from remediation.hostlist import compress
from remediation.settings import NotifySettings
from remediation.vocabulary import DEFAULT_CLUSTER

log = logging.getLogger(__name__)

CURSOR = "notify_cursor"
LEASE_MARGIN_S = 30.0  # beyond the posts' own timeouts, before a crashed pass's rows are taken over

# action -> (emoji, headline)
NOTIFIABLE: dict[AuditAction, tuple[str, str]] = {
    AuditAction.BREAKER_OPEN: (":rotating_light:", "Storm breaker OPEN: machine actions are held"),
    AuditAction.BREAKER_CLOSED: (":white_check_mark:", "Storm breaker closed: machine actions resume"),
    AuditAction.INCIDENT_OPENED: (":zap:", "Correlated INCIDENT: one failure domain, many nodes; no machine actions"),
    AuditAction.INCIDENT_RECOVERED: (":white_check_mark:", "Incident closed: its nodes answer again"),
    AuditAction.INCIDENT_RESOLVED: (":white_check_mark:", "Incident resolved by a human: its nodes go on on their own"),
    AuditAction.DOMAIN_REPAIR_OPENED: (":link:", "Domain repair opened: one ladder for the whole NVLink domain, none per tray"),
    AuditAction.DOMAIN_REPAIR_RETURNED: (":white_check_mark:", "Domain repair done: the domain check passed, its trays are back"),
    AuditAction.DOMAIN_REPAIR_QUARANTINED: (":no_entry:", "NVLink domain QUARANTINED for a human and an RMA"),
    AuditAction.ESCALATE: (":arrow_double_up:", "Escalated"),
    AuditAction.REMEDIATION_QUARANTINED: (":no_entry:", "Quarantined"),
    AuditAction.REMEDIATION_FAILED: (":x:", "Remediation FAILED"),
    AuditAction.QUARANTINE: (":no_entry:", "Quarantined by hand"),
    AuditAction.RELEASE: (":unlock:", "Released from quarantine"),
    AuditAction.PAUSE: (":double_vertical_bar:", "Automation PAUSED"),
    AuditAction.RESUME: (":arrow_forward:", "Automation resumed"),
    AuditAction.HOLD: (":warning:", "Remediation HELD on an error nobody mapped"),
    AuditAction.FAULT_HOLD: (":construction:", "Held for a human: the cause takes no machine action (drained, nothing restarted)"),
    AuditAction.UNPROVEN_HOLD: (":construction:", "Held for a human: nothing at this site can prove the node healthy "
                      "(no machine action, no GPU check; drained, never resumed by the service)"),
    AuditAction.JOBS_TIMEOUT: (":hourglass:", "Jobs still on a drained node past drain_timeout_s or checkpoint_wait_s: held for a human"),
    AuditAction.CHECKPOINT_REQUESTED: (":floppy_disk:", "Jobs asked to save their work before their node is taken"),
    AuditAction.JOBS_REQUEUED: (":recycle:", "Jobs requeued off a drained node (on_jobs_timeout=requeue)"),
    AuditAction.JOBS_CANCELLED: (":x:", "Jobs cancelled on a drained node (on_jobs_timeout=cancel)"),
    AuditAction.VALIDATION_HELD: (":stopwatch:", "GPU check gave no verdict (timeout, no result, cannot run): node HELD for a human"),
    AuditAction.REPAIR_REQUESTED: (":wrench:", "Repair request opened: the hardware is handed to the repair system"),
    AuditAction.REPAIR_DELIVERY_FAILED: (":mailbox_with_no_mail:", "Repair request NOT delivered: retried with backoff "
                                         "(the node stays quarantined)"),
}


@dataclass
class PassResult:
    scanned: int = 0
    sent: int = 0
    suppressed: int = 0  # repeats within min_interval_s
    collapsed: int = 0  # folded into a summary message
    stale: int = 0
    failed: bool = False
    cursor: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Msg:
    first_id: int
    last_id: int
    payload: dict[str, Any]
    keys: list[str]


def run_pass(sessions: sessionmaker[Session], cfg: NotifySettings, post: Post | None = None,
             *, clock: Clock | None = None, batch: int = 1000) -> PassResult:
    now = (clock or SystemClock()).now()
    url = cfg.webhook_url.get_secret_value() if cfg.webhook_url else None
    if post is None:
        from remediation.adapters.webhook import httpx_post

        post = httpx_post(cfg.timeout_s)
    with sessions() as s, s.begin():
        state = _lock_cursor(s, now)
        cursor = int(state.get("id", 0))
        result = PassResult(cursor=cursor)
        if _leased(state, now):  # another pass is posting these rows right now
            return result
        rows = s.scalars(select(AuditLog).where(AuditLog.id > cursor).order_by(AuditLog.id).limit(batch)).all()
        result.scanned = len(rows)
        if not rows:
            return result
        if url is None:  # notifications off: just keep up, so enabling them later does not replay history
            result.cursor = rows[-1].id
            control_set(s, CURSOR, {**state, "id": result.cursor}, now=now)
            return result
        sent = _fresh_sent(state.get("sent", {}), now, cfg.min_interval_s)
        messages = _plan(rows, sent, now, cfg=cfg, result=result)
        result.cursor = rows[-1].id
        # The lease outlives every post's timeout; the posts run after this commit, with no row locked.
        lease = now + timedelta(seconds=(len(messages) + 1) * cfg.timeout_s + LEASE_MARGIN_S)
        control_set(s, CURSOR, {**state, "lease_until": lease.isoformat()}, now=now)
    for msg in messages:
        try:
            post(url, msg.payload)
        except Exception as exc:  # includes NotifyError; str(exc) of other clients may carry the URL
            detail = str(exc) if isinstance(exc, NotifyError) else type(exc).__name__
            log.warning("notify: post failed (%s); will retry from audit row %d", detail, msg.first_id)
            result.failed, result.cursor = True, msg.first_id - 1
            break
        result.sent += 1
        result.messages.append(msg.payload)
        for key in msg.keys:
            sent[key] = now.isoformat()
    with sessions() as s, s.begin():
        _lock_cursor(s, now)
        control_set(s, CURSOR, {"id": result.cursor, "sent": sent}, now=now)  # and the lease is given back
    return result


def _leased(state: dict[str, Any], now: datetime) -> bool:
    until = state.get("lease_until")
    return until is not None and datetime.fromisoformat(until) > now


def _lock_cursor(s: Session, now: datetime) -> dict[str, Any]:
    key = (cluster_of(s), CURSOR)
    row = s.get(Control, key, with_for_update=True)
    if row is None:
        control_set(s, CURSOR, {"id": 0, "sent": {}}, now=now)
        s.flush()
        row = s.get(Control, key, with_for_update=True)
    return dict(row.value) if row is not None else {}


def _fresh_sent(sent: dict[str, str], now: datetime, interval: float) -> dict[str, str]:
    horizon = now - timedelta(seconds=interval)
    return {k: v for k, v in sent.items() if datetime.fromisoformat(v) > horizon}


def _plan(rows: Sequence[AuditLog], sent: dict[str, str], now: datetime, *, cfg: NotifySettings,
          result: PassResult) -> list[_Msg]:
    horizon = now - timedelta(seconds=cfg.max_age_s)
    keep: list[AuditLog] = []
    seen: set[str] = set(sent)
    for row in rows:
        if row.action not in NOTIFIABLE:
            continue
        if aware(row.at) < horizon:
            result.stale += 1
            continue
        key = _key(row)
        if key in seen:
            result.suppressed += 1
            continue
        seen.add(key)
        keep.append(row)
    direct, rest = keep[: cfg.max_per_pass], keep[cfg.max_per_pass:]
    msgs = [_Msg(r.id, r.id, {"text": _format(r, cfg)}, [_key(r)]) for r in direct]
    if rest:
        result.collapsed = len(rest)
        msgs.append(_Msg(rest[0].id, rest[-1].id, {"text": _summary(rest)}, [_key(r) for r in rest]))
    return msgs


def _key(row: AuditLog) -> str:
    """What one page is about, for the rate limit: two clusters' gpu-node-0 are two nodes."""
    key = f"{row.action}|{row.target}"
    return key if row.cluster == DEFAULT_CLUSTER else f"{key}|{row.cluster}"


def _where(row: AuditLog) -> str:
    """`` in cluster NAME`` for a row of a cluster other than ``default``; nothing for ``default``'s."""
    return "" if row.cluster == DEFAULT_CLUSTER else f" in cluster *{slack_escape(row.cluster)}*"


def slack_escape(text: str) -> str:
    """``text`` as Slack mrkdwn shows it literally: ``&``, ``<`` and ``>`` become entities (Slack's
    own rule), so a reason, a node name or an actor cannot ping ``<!channel>``, mention someone or
    smuggle a link into a page; everything else is left as written."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _format(row: AuditLog, cfg: NotifySettings) -> str:
    emoji, headline = NOTIFIABLE[row.action]
    if row.dry_run:  # nothing was done: the page must not read like it was
        emoji, headline = ":test_tube:", f"[DRY-RUN] {headline} (nothing was changed)"
    target = slack_escape(row.target or "")
    if target and cfg.dashboard_url:
        page = "/nodes/" + quote(row.target, safe="")
        page += "" if row.cluster == DEFAULT_CLUSTER else "?cluster=" + quote(row.cluster, safe="")
        link = slack_escape(cfg.dashboard_url.rstrip("/") + page)
        target = f"<{link.replace('|', '%7C')}|{target}>"
    parts = [f"{emoji} *{headline}*" + (f" `{target}`" if target and not cfg.dashboard_url else
                                         f" {target}" if target else "") + _where(row)]
    if row.reason:
        parts.append(f"> {slack_escape(row.reason[:500])}")
    remediation = (row.detail or {}).get("remediation")
    tail = f"by {slack_escape(row.actor)} at {aware(row.at):%Y-%m-%d %H:%M:%S} UTC"
    parts.append(tail + (f" · remediation #{remediation}" if remediation else ""))
    return "\n".join(parts)


def _summary(rows: list[AuditLog]) -> str:
    by_action = Counter(r.action for r in rows)
    lines = [f":bell: *…and {len(rows)} more* (collapsed to avoid a page storm)"]
    for action, n in by_action.most_common():
        nodes = sorted({r.target for r in rows if r.action == action and r.target and r.cluster == DEFAULT_CLUSTER})
        where = f" on {slack_escape(compress(nodes))}" if nodes else ""
        for cluster in sorted({r.cluster for r in rows if r.action == action and r.cluster != DEFAULT_CLUSTER}):
            theirs = sorted({r.target for r in rows if r.action == action and r.target and r.cluster == cluster})
            where += f"{';' if where else ''} in cluster {slack_escape(cluster)}" + (
                f" on {slack_escape(compress(theirs))}" if theirs else "")
        dry = sum(1 for r in rows if r.action == action and r.dry_run)
        mark = f" ({dry} DRY-RUN, nothing changed)" if dry else ""
        lines.append(f"• {NOTIFIABLE[action][1]}: {n}{mark}{where}"[:400])
    lines.append("See `remediation audit list` or the dashboard's audit log.")
    return "\n".join(lines)
