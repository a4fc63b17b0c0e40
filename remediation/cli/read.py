"""Read commands: ``nodes``, ``events``, ``remediations``, ``rejected``, ``audit`` and ``stats``.

Each command is a thin shell over the CLI's backend (:mod:`remediation.cli.backend`): the read models
of :mod:`remediation.services.readmodels` in direct database mode, the API (which serves the same
functions) with ``--server``. Every command has the same three outputs: a table, ``-o wide`` with more columns, and ``-o json``.

Why: docs/running.md#the-cli
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime

import typer

from remediation.cli import render as r
from remediation.cli.backend import backend
from remediation.cli.context import CLUSTER, State, cli_errors, state
from remediation.domain.context import RemediationContext
from remediation.services.read_rows import NvlinkRow
from remediation.services.readmodels import (
    EventRow,
    NodeDetail,
    RemediationDetail,
    jsonable,
)
from remediation.validation.rules import last_line
from remediation.vocabulary import DEFAULT_CLUSTER

OUTPUT = typer.Option("table", "-o", "--output", help="Output format: table, wide or json.")
PROFILE = typer.Option(None, "--profile", help="Only what this profile governs.")

nodes = typer.Typer(help="The node inventory and each node's history.", no_args_is_help=True)
events = typer.Typer(help="Observed events (what the watchers saw, and what was decided).",
                     no_args_is_help=True)
remediations = typer.Typer(help="Remediation workflows and their steps.", no_args_is_help=True)
rejected = typer.Typer(help="Payloads the ingest could not parse or apply (kept, never dropped).",
                       no_args_is_help=True)
audit = typer.Typer(help="The audit log: every lever pulled, by a human or by the service.",
                    no_args_is_help=True)


@nodes.command("list")
@cli_errors
def nodes_list(ctx: typer.Context, status: str = typer.Option(
        None, "--status", "-s", help="healthy, unhealthy, remediating or quarantined."), output: str = OUTPUT,
        *, profile: str = PROFILE, cluster: str | None = CLUSTER) -> None:
    """List nodes with their status, profile and open remediation."""
    fmt = r.check_format(output)
    st = state(ctx, cluster)
    rows = backend(st).nodes(status, profile)
    if fmt == "json":
        return r.print_json(rows)
    if not rows:
        return r.empty("nodes")
    now = st.now()
    headers = ["name", "status", "profile", "remediation", "step", "updated", "last event", "lemon", "reason"]
    if fmt == "wide":
        headers += ["waiting on", "quarantined", "lemon score explained"]
    out = []
    for n in rows:
        row = [n.name, r.status(n.status), n.profile or "-", f"#{n.open_remediation}" if n.open_remediation else "-",
               n.step or "-", r.when(n.updated_at, now), r.when(n.last_event_at, now), _lemon(n.lemon_score),
               n.quarantine_reason or n.status_reason or "-"]
        if fmt == "wide":
            row += [n.wait_reason or "-", r.when(n.quarantined_at, now), n.lemon or "-"]
        out.append(row)
    r.show(r.table(*r.clustered(headers, out, [n.cluster for n in rows])))


def _lemon(score: float) -> str:
    return f"{score:.2f}" if score else "-"


@nodes.command("show")
@cli_errors
def nodes_show(ctx: typer.Context, node: str = typer.Argument(..., help="Slurm node name."),
               limit: int = typer.Option(200, "--limit", help="Rows per section."),
               *, output: str = OUTPUT, cluster: str | None = CLUSTER) -> None:
    """A node's status, timeline (events, remediations, steps with durations and errors) and
    quarantine history."""
    fmt = r.check_format(output)
    st = state(ctx, cluster)
    detail = backend(st).node_detail(node, limit)
    if fmt == "json":
        return r.print_json(detail)
    _show_node(detail, st.now(), wide=fmt == "wide")


def _show_node(d: NodeDetail, now: datetime, wide: bool) -> None:
    n = d.node
    head = r.fields([
        ("Node", n.name), *([("Cluster", n.cluster)] if n.cluster != DEFAULT_CLUSTER else []),
        ("Status", r.status(n.status)), ("Profile", n.profile or "(base policy)"),
        ("Reason", n.status_reason),
        ("Remediation", f"#{n.open_remediation} at {n.step}" if n.open_remediation else None),
        ("Waiting on", n.wait_reason), ("Checkpoint", d.checkpoint.text if d.checkpoint else None), ("Quarantined", r.when(n.quarantined_at, now) if n.quarantined_at else None),
        ("Quarantine reason", n.quarantine_reason), ("Last released", r.stamp(n.released_at)),
        ("Last event", r.when(n.last_event_at, now)),
        ("Lemon score", f"{n.lemon_score:.2f}: {n.lemon}" if n.lemon else "0 (no failures counted)"),
        *_nvlink(d.nvlink, now),
    ])
    rows = []
    for t in d.timeline:
        row = [r.stamp(t.at), r.when(t.at, now), t.kind, t.title, r.status(t.status), r.dur(t.duration_s),
               t.detail or "-", t.error or ""]
        rows.append(row)
    timeline = r.table(["time (utc)", "age", "kind", "what", "status", "took", "detail", "error"], rows,
                       title="Timeline")
    episodes = r.table(
        ["episode", "state", "outcome", "first signal", "recovered", "settles", "counted", "signals", "ours",
         "cause"],
        [[f"#{e.remediation_id}", e.state, r.status(e.outcome), r.stamp(e.started_at), r.stamp(e.recovered_at),
          r.stamp(e.settles_at), "yes" if e.counted else "no", str(e.signals), str(e.attributed), e.cause]
         for e in d.episodes],
        title="Fault episodes (what the repeat-offender rule counts; signals: events each explains, "
              "ours: caused by its own actions)")
    history = r.table(["time (utc)", "action", "actor", "reason"],
                      [[r.stamp(a.at), r.status(a.action), a.actor, a.reason] for a in d.quarantine_history],
                      title="Quarantine history")
    parts: list[object] = [head, "", episodes, "", timeline] if d.episodes else [head, "", timeline]
    if d.validations:
        parts += ["", validation_table(d, now, wide)]
    if d.quarantine_history or wide:
        parts += ["", history]
    r.show(*parts)


def _nvlink(v: NvlinkRow | None, now: datetime) -> list[tuple[str, str]]:
    """The node's NVLink domain, each source's word for it, and where they disagree."""
    if v is None:
        return []
    said = [f"Slurm block {v.block}" if v.block else None, f"clique {v.label} (Node label)" if v.label else None,
            f"clique {v.gpus} (its GPUs, checked {r.when(v.checked_at, now)})" if v.gpus and v.checked_at else None]
    shown = [("NVLink domain", "; ".join(x for x in said if x) or "(none named)")]
    shown += [("Partial domain" if v.partial else "Block health", v.health)] if v.health else []
    shown += [("Domain repair", v.repair)] if v.repair else []
    return shown + ([("Sources disagree", "; ".join(v.disagreements))] if v.disagreements else [])


def validation_table(d: NodeDetail, now: datetime, wide: bool) -> object:
    """The validation's latest checks: what ran, how it ended, and the last line of its output (all
    of the kept output with ``-o wide``)."""
    def said(text: str) -> str:
        if wide:
            return text
        return last_line(text)

    return r.table(
        ["time (utc)", "remediation", "backend", "class", "command", "outcome", "exit", "took", "output"],
        [[r.stamp(v.started_at), f"#{v.remediation_id}" if v.remediation_id else f"by {v.actor}", v.backend,
          v.cause_class, v.command, r.status(v.outcome), "-" if v.exit_code is None else str(v.exit_code),
          r.dur(v.duration_s), said(v.output_tail)] for v in d.validations],
        title="GPU checks (the validation, newest first)")


@events.command("tail")
@cli_errors
def events_tail(
    ctx: typer.Context,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new events (Ctrl-C stops)."),
    node: str = typer.Option(None, "--node", help="Only this node's events."),
    *, lines: int = typer.Option(20, "-n", "--lines", help="How many recent events to show first."),
    interval: float = typer.Option(2.0, "--interval", help="Seconds between polls with --follow."),
    output: str = OUTPUT, cluster: str | None = CLUSTER,
) -> None:
    """The latest events, oldest first; with -o json and --follow, one JSON object per line."""
    fmt = r.check_format(output)
    st = state(ctx, cluster)
    source = backend(st)
    if node:
        source.node(node)  # an unknown node is an error, not an empty tail
    batch = source.events(node, None, lines)
    if fmt == "json" and not follow:
        return r.print_json(batch)
    header = fmt != "json"
    many = len({e.cluster for e in batch}) > 1  # a CLUSTER column, as the tables have
    if header:
        sys.stdout.write(_event_line(None, fmt == "wide", many) + "\n")
    last = _emit(batch, fmt, 0, many=many)
    while follow:
        time.sleep(interval)
        last = _emit(source.events(node, last, 1000), fmt, last, many=many)


def _emit(batch: list[EventRow], fmt: str, last: int, *, many: bool = False) -> int:
    for e in batch:
        if fmt == "json":
            sys.stdout.write(json.dumps(jsonable(e)) + "\n")
        else:
            sys.stdout.write(_event_line(e, fmt == "wide", many) + "\n")
        last = max(last, e.id)
    sys.stdout.flush()
    return last


def _event_line(e: EventRow | None, wide: bool, many: bool = False) -> str:
    if e is None:
        cols = ["OBSERVED (UTC)", "NODE", "SOURCE", "KIND", "STATE", "DECISION", "REMEDIATION", "REASON"]
    else:
        cols = [r.stamp(e.observed_at), e.node, e.source, e.kind, e.state, e.decision or "-",
                f"#{e.remediation_id}" if e.remediation_id else "-", e.reason or "-"]
    line = f"{cols[0]:<21}{cols[1]:<20}{cols[2]:<12}{cols[3]:<11}{cols[4]:<18}{cols[5]:<11}{cols[6]:<13}{cols[7]}"
    if wide:
        line += "  " + ("WHY" if e is None else (e.decision_reason or "-"))
    if many:
        line = f"{'CLUSTER' if e is None else e.cluster:<16}" + line
    return line


@remediations.command("list")
@cli_errors
def remediations_list(
    ctx: typer.Context,
    status: str = typer.Option(None, "--status", "-s",
                               help="open, closed, running, waiting, succeeded, quarantined, cancelled, failed."),
    node: str = typer.Option(None, "--node", help="Only this node's remediations."),
    *, limit: int = typer.Option(100, "--limit", help="At most this many, newest first."),
    output: str = OUTPUT,
    profile: str = PROFILE, cluster: str | None = CLUSTER,
) -> None:
    """List remediations, newest first."""
    fmt = r.check_format(output)
    st = state(ctx, cluster)
    if node:
        backend(st).node(node)
    rows = backend(st).remediations(status, node, limit, profile=profile)
    if fmt == "json":
        return r.print_json(rows)
    if not rows:
        return r.empty("remediations")
    now = st.now()
    headers = ["id", "node", "status", "profile", "step", "opened", "took", "class", "action", "cause"]
    if fmt == "wide":
        headers += ["ladder", "source", "waiting on", "outcome", "evidence"]
    out = []
    for x in rows:
        took = x.duration_s if x.closed_at else (now - x.opened_at).total_seconds()
        row = [str(x.id), x.node, r.status(x.status), _profile(x.profile, x.dry_run), x.step, r.when(x.opened_at, now),
               r.dur(took),
               x.fault_class or "-", x.action or "-", x.cause]
        if fmt == "wide":
            row += [str(x.ladder), x.source, x.wait_reason or "-", x.outcome or "-", x.fault_evidence or "-"]
        out.append(row)
    r.show(r.table(*r.clustered(headers, out, [x.cluster for x in rows])))


@remediations.command("show")
@cli_errors
def remediations_show(ctx: typer.Context, remediation_id: int = typer.Argument(..., metavar="ID"),
                      output: str = OUTPUT, *, cluster: str | None = CLUSTER) -> None:
    """One remediation: where it stands, and every step attempt with its duration and error."""
    fmt = r.check_format(output)
    st = state(ctx, cluster)
    d = backend(st).remediation(remediation_id)
    if fmt == "json":
        return r.print_json(d)
    _show_remediation(d, st.now(), fmt == "wide")


@remediations.command("evidence")
@cli_errors
def remediations_evidence(ctx: typer.Context, remediation_id: int = typer.Argument(..., metavar="ID"),
                          *, name: str = typer.Argument(..., metavar="NAME", help="The item: nvidia-smi-q, kernel-log..."),
                          step: int = typer.Option(None, "--step", help="The step row that kept it "
                                                   "(default: the newest that kept one of that name)."),
                          cluster: str | None = CLUSTER) -> None:
    """One item of a remediation's collected evidence, whole, as the node wrote it."""
    text = backend(state(ctx, cluster)).evidence(remediation_id, name, step)
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")


def _profile(profile: str | None, dry_run: bool) -> str:
    return (profile or "(base)") + (" (dry-run: records only)" if dry_run else "")


def _lacks(ctx: RemediationContext) -> str | None:
    """The halves the site lacked, whose steps this remediation skipped (None: it lacked none)."""
    lacked = ["Kubernetes (kube.backend none): nothing cordoned, evicted or tainted"] if ctx.no_kubernetes else []
    if ctx.no_machine:
        lacked.append("a machine action (machine.backend none): nothing restarted, nothing verified")
    return "; ".join(lacked) or None


def _show_remediation(d: RemediationDetail, now: datetime, wide: bool) -> None:
    head = r.fields([
        ("Remediation", f"#{d.id}"), ("Node", d.node), ("Status", r.status(d.status)), ("Step", d.step),
        ("Profile", _profile(d.profile, d.dry_run) + ("; runs under the policy it recorded when it opened (-o json)"
                                                       if d.policy else "")),
        ("Cause", d.cause), ("Class", d.fault_class or "-"), ("Why this class", d.fault_evidence),
        ("Action", d.action or "-"), ("Source", d.source), ("Ladder", d.ladder),
        ("Opened", f"{r.stamp(d.opened_at)} ({r.when(d.opened_at, now)})"),
        ("Closed", f"{r.stamp(d.closed_at)} (took {r.dur(d.duration_s)})" if d.closed_at else None),
        ("Next run", r.when(d.next_run_at, now) if d.next_run_at else None),
        ("Site lacks", _lacks(RemediationContext.load(d.context))), ("Waiting on", d.wait_reason), ("Outcome", d.outcome),
        ("Event", f"#{d.event.id} {d.event.source} {d.event.state}: {d.event.reason}" if d.event else None),
    ])
    headers = ["step", "try", "status", "started (utc)", "took", "checks", "retries", "outcome / error"]
    if wide:
        headers += ["provider op"]
    rows = []
    for x in d.steps:
        row = [x.step, str(x.attempt), r.status(x.status), r.stamp(x.started_at), r.dur(x.duration_s),
               str(x.checks), str(x.retries), (f"{x.error_kind}: {x.error}" if x.error else x.outcome) or "-"]
        if wide:
            row.append(str(x.provider_op or "-"))
        rows.append(row)
    r.show(head, "", r.table(headers, rows, title="Steps"), "", *_collected(d))


def _collected(d: RemediationDetail) -> list[object]:
    """The "Collected evidence" section: each item, and the first lines of one kept in the database;
    with none kept, what its collect_evidence step said."""
    if not d.evidence_items:
        return [r.fields([("Collected evidence", d.evidence_note)])] if d.evidence_note else []
    headers = ["name", "status", "exit", "size", "truncated", "step row", "where"]
    rows = [[x.name, r.status(x.status), "-" if x.exit_code is None else str(x.exit_code), _size(x.size_bytes),
             "yes" if x.truncated else "no", str(x.step_id), x.where] for x in d.evidence_items]
    heads = [r.fields([(f"{x.name} (step row {x.step_id})", "\n".join(x.head))])
             for x in d.evidence_items if x.head]
    hint = f"(whole: remediation remediations evidence {d.id} NAME)"
    return [r.table(headers, rows, title="Collected evidence"), "", *heads, hint]


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.1f} MiB"


@rejected.command("list")
@cli_errors
def rejected_list(ctx: typer.Context, limit: int = typer.Option(50, "--limit"), output: str = OUTPUT, *, cluster: str | None = CLUSTER) -> None:
    """Rejected payloads with the parser's error, newest first."""
    fmt = r.check_format(output)
    st = state(ctx, cluster)
    rows = backend(st).rejected(limit)
    if fmt == "json":
        return r.print_json(rows)
    if not rows:
        return r.empty("rejected events")
    width = None if fmt == "wide" else 80
    r.show(r.table(*r.clustered(["id", "received", "error", "payload"],
                                [[str(x.id), r.when(x.received_at, st.now()), x.error, x.payload[:width]]
                                 for x in rows], [x.cluster for x in rows])))


@audit.command("list")
@cli_errors
def audit_list(ctx: typer.Context, node: str = typer.Option(None, "--node", help="Only this target."),
               action: str = typer.Option(None, "--action", help="e.g. release, quarantine, escalate."),
               *, limit: int = typer.Option(50, "--limit"), output: str = OUTPUT, cluster: str | None = CLUSTER) -> None:
    """Audit log rows, newest first."""
    fmt = r.check_format(output)
    st = state(ctx, cluster)
    rows = backend(st).audit(node, action, limit)
    if fmt == "json":
        return r.print_json(rows)
    if not rows:
        return r.empty("audit rows")
    now = st.now()
    headers = ["time (utc)", "age", "actor", "action", "target", "reason"] + (["detail"] if fmt == "wide" else [])
    r.show(r.table(*r.clustered(headers, [
        [r.stamp(a.at), r.when(a.at, now), a.actor, r.status(a.action), a.target or "-", a.reason or "-"]
        + ([str(a.detail)] if fmt == "wide" else []) for a in rows], [a.cluster for a in rows])))


@cli_errors
def stats(ctx: typer.Context, days: int = typer.Option(30, "--days", help="Window, in days."),
          top: int = typer.Option(10, "--top", help="Rows per ranking."), *, output: str = OUTPUT,
          dry_run: bool = typer.Option(False, "--dry-run/--no-dry-run",
                                       help="Include what dry-run recorded (hidden by default)."),
          lemons: bool = typer.Option(False, "--lemons", help="Nodes by lemon score instead: decayed, "
                                      "class-weighted failures with distinct causes counted."),
          profile: str = PROFILE, cluster: str | None = CLUSTER) -> None:
    """Failures by node, by cause and by day; mean time to recovery; repeat offenders. With --lemons:
    the nodes by lemon score, each with its explanation."""
    fmt = r.check_format(output)
    st = state(ctx, cluster)
    if lemons:
        return _lemons(st, top, fmt)
    result = backend(st).stats(days, top, dry_run, profile=profile)
    if fmt == "json":
        return r.print_json(result)
    outcomes = ", ".join(f"{k} {v}" for k, v in result.outcomes.items() if v) or "none"
    head = r.fields([
        ("Window", f"last {result.days} day(s), since {r.stamp(result.since)} UTC"),
        ("Profile", f"{result.profile} only" if result.profile else None),
        ("Remediations", f"{result.total} ({outcomes})"),
        ("Dry-run", f"{result.dry_run} dry-run remediation(s) " + (
            "included" if result.include_dry_run else "hidden (show them with --dry-run)")),
        ("Mean time to recovery", f"{r.dur(result.mttr_s)} over {result.mttr_samples} succeeded"),
    ])
    counts = [("Failures by node", "node", result.by_node), ("Failures by cause", "cause", result.by_cause),
              ("Failures by day", "day (utc)", result.by_day)]
    parts: list[object] = [head]
    for title, col, rows in counts:
        parts += ["", r.table(*r.clustered([col, "failures"], [[c.key, str(c.count)] for c in rows],
                                           [c.cluster or "" for c in rows]), title=title)]
    w = result.repeat_window_s
    window = f"{w // 86400}d" if w % 86400 == 0 else r.dur(w)
    parts += ["", r.table(*r.clustered(
        ["node", f"failures in {window}", "status", "last failure"],
        [[o.node, str(o.failures), r.status(o.status), r.when(o.last_failure_at, st.now())] for o in result.offenders],
        [o.cluster for o in result.offenders]), title="Repeat offenders")]
    r.show(*parts)



def _lemons(st: State, top: int, fmt: str) -> None:
    rows = backend(st).lemons(top)
    if fmt == "json":
        return r.print_json(rows)
    cfg = backend(st).lemon_policy()
    if cfg is None:  # through the API: the server's policy decides; "over" says who is over its threshold
        policy = "the server's policy.lemon (the column \"over\" says who is at or over its threshold)"
    else:
        state_ = "on" if cfg.enabled else "off (policy.lemon.enabled=false: scored, never quarantined)"
        policy = (f"{state_}; threshold {cfg.threshold:g}, half-life {r.dur(cfg.half_life_s)}, "
                  f"distinct-cause bonus x{1 + cfg.distinct_bonus:g}")
    head = r.fields([("Lemon quarantine", policy)])
    if not rows:
        return r.show(head, "", "no node has a counted failure")
    table = r.table(["node", "status", "score", "failures", "causes", "over", "why"],
                    [[x.node, r.status(x.status), f"{x.score:.2f}", str(x.failures), str(x.distinct_causes),
                      "yes" if x.over_threshold else "no", x.explanation] for x in rows], title="Lemons")
    r.show(head, "", table)
