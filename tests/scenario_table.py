"""The reliability table, built from what happened: a pytest plugin (loaded by tests/conftest.py).

A test that measures a row of the table carries ``@pytest.mark.scenario("name")``. Its row is then
made of:

- **runs** and **passed**: the outcomes pytest reported for the scenario's tests (a test that failed in
  setup, call or teardown is a run that did not pass; a skipped test is no run). A test cannot write
  its own verdict into the table.
- **lost events**: every event the test process published on the Redis stream
  (``RedisEventBus.publish``, wrapped while the test runs) or handed to the ingest itself
  (:meth:`Figures.sent`), counted against the dedupe keys Postgres holds (``record(db=...)``, or at
  the end of a test that failed first, ``count_in(db)``).
  "-" when the scenario published nothing.
- **duplicate actions**, **recovery** and the notes: what the test measured and passed to
  :meth:`Figures.record` (duplicate actions come from the endpoints' request logs or the world's call
  journal, never from the code under test). A row with a lost event or a duplicate action fails the session.
- **examples**: the property-based tests count each example their body actually ran
  (:meth:`Figures.example`), not ``max_examples``.

At the end of the session every scenario collected for this run must have a row with at least one
run, and a test that passed must have recorded its figures: otherwise the session fails and says
which. The rows go to ``$REMEDIATION_RELIABILITY_OUT`` (JSON lines) for ``python -m bench.reliability``,
and the security section below, when any bad input was tried, to ``$REMEDIATION_SECURITY_OUT`` (one JSON
document: its lines and its problems), which the same command prints under the table.

**The security section** lists the bad inputs the tests tried (oversize bodies, malformed and huge
events, long and odd node names, secrets in bad config), with what each got and what was lost. Any test
adds a row in a line, through the ``bad_inputs`` fixture, after it has checked the outcome::

    def test_a_huge_body_is_refused(client, bad_inputs):
        r = client.post("/events", content=b"x" * 2_000_000)
        assert r.status_code == 413
        bad_inputs.tried(OVERSIZE, "POST /events, 2 MB body", f"{r.status_code}, nothing recorded", lost=0)

``kind`` is one of :data:`BAD_INPUT_KINDS`; ``got`` says what the input got, in words built from what
the test observed; ``lost`` counts the good inputs sent beside it that were not kept (None: nothing was
sent beside it). A row is shown with its test's outcome; a row that lost anything, or whose test failed,
fails the session. A kind no test tried in this run is listed as such, never left out.

The table is built from test reports, not from the test process's memory: each report of a scenario's
test carries the scenario's name, and its teardown report the test's figures (``user_properties``). So
the same table comes out of one pytest process and of a run split over xdist workers, whose reports
reach the controller: only the process that reports (the controller, or the only process) builds it.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.bus import RedisEventBus
from remediation.db.models import Event
from remediation.domain.events import NodeEvent
from tests.policies import SHIPPED, policy_of

MARK = "scenario"

#: The security section's kinds of bad input, in the order it lists them.
OVERSIZE, MALFORMED, HUGE_EVENT, NODE_NAME, FORGED, IMPOSTOR, CONFIG_SECRET = (
    "oversize bodies", "malformed events", "huge events", "long and odd node names",
    "events a watcher may not report", "jobs and BMCs that pose as ours", "secrets in bad config",
)
BAD_INPUT_KINDS = (OVERSIZE, MALFORMED, HUGE_EVENT, NODE_NAME, FORGED, IMPOSTOR, CONFIG_SECRET)
#: Where the session writes the security section for ``python -m bench.reliability`` (unset: nowhere).
SECURITY_OUT = "REMEDIATION_SECURITY_OUT"


@dataclass
class Figures:
    """What one test measured for its scenario's row."""

    scenario: str
    published: set[str] = field(default_factory=set)
    recorded: bool = False
    lost_events: int | None = None
    duplicate_actions: int | None = None
    recovery_s: float | None = None
    notes: str = ""
    examples: Counter[str] = field(default_factory=Counter)
    extra: dict[str, object] = field(default_factory=dict)
    db: Engine | sessionmaker[Session] | None = None

    def sent(self, events: Iterable[NodeEvent]) -> None:
        """Events this test handed to the ingest itself (the bus's publishes are tracked already)."""
        self.published.update(e.dedupe_key for e in events)

    def count_in(self, db: Engine | sessionmaker[Session]) -> None:
        """Count the lost events in ``db`` when the test ends, even if it fails before :meth:`record`."""
        self.db = db

    def example(self, target: str) -> None:
        """One example of a property-based test ran its body."""
        self.examples[target] += 1

    def summary(self) -> dict[str, Any]:
        """What the report carries to the table: plain values, computed in the test's own process."""
        return {
            "recorded": self.recorded,
            "lost_events": self.lost_events,
            "duplicate_actions": self.duplicate_actions,
            "recovery_s": self.recovery_s,
            "notes": self.notes,
            "examples": dict(self.examples),
        }

    def lost(self, db: Engine | sessionmaker[Session]) -> int:
        """Published dedupe keys that Postgres does not hold."""
        keys = sorted(self.published)
        held: set[str] = set()
        with db() if isinstance(db, sessionmaker) else Session(db) as s:
            for i in range(0, len(keys), 5000):
                chunk = keys[i : i + 5000]
                held.update(s.scalars(select(Event.dedupe_key).where(Event.dedupe_key.in_(chunk))).all())
        return len(self.published - held)

    def record(
        self,
        *,
        db: Engine | sessionmaker[Session] | None = None,
        duplicate_actions: int | None = None,
        recovery_s: float | None = None,
        notes: str = "",
        extra: dict[str, object] | None = None,
    ) -> int | None:
        """Store the test's measurements; with ``db``, count the lost events now. Returns them."""
        if db is not None and self.published:
            self.lost_events = self.lost(db)
        self.duplicate_actions, self.recovery_s, self.notes = duplicate_actions, recovery_s, notes
        self.extra = extra or {}
        self.recorded = True
        return self.lost_events


@dataclass
class BadInputs:
    """The bad inputs one test tried, for the security section (the ``bad_inputs`` fixture)."""

    item: pytest.Item

    def tried(self, kind: str, what: str, got: str, lost: int | None = 0) -> None:
        """One bad input: its ``kind``, what it was, what it got, and the good inputs lost beside it."""
        if kind not in BAD_INPUT_KINDS:
            raise pytest.UsageError(f"unknown kind of bad input {kind!r}; choose from {BAD_INPUT_KINDS}")
        self.item.user_properties.append((BAD_INPUT, {"kind": kind, "what": what, "got": got, "lost": lost}))


@dataclass
class Row:
    scenario: str
    runs: int = 0
    passed: int = 0
    lost_events: int | None = None
    duplicate_actions: int | None = None
    recovery_s: float | None = None
    examples: int = 0
    policies: set[str] = field(default_factory=set)  # the policies its tests ran under (tests/policies.py)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _add(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


#: The ``user_properties`` names a scenario's reports carry, and a bad input's.
SCENARIO, FIGURES, POLICY, BAD_INPUT = "scenario", "scenario_figures", "policy", "bad_input"


class Table:
    """Collects outcomes and figures per scenario over the session, from the tests' reports."""

    def __init__(self) -> None:
        self.scenario_of: dict[str, str] = {}  # nodeid -> scenario
        self.outcome: dict[str, str] = {}  # nodeid -> passed / failed / skipped
        self.figures: dict[str, dict[str, Any]] = {}  # nodeid -> Figures.summary()
        self.policy: dict[str, str] = {}  # nodeid -> the policy it ran under
        self.bad_inputs: list[dict[str, Any]] = []  # BadInputs.tried() rows, with their test's outcome

    def add(self, report: pytest.TestReport) -> None:
        """One phase's report: a failure in setup, call or teardown fails the run; a skip is no run."""
        if report.when == "call":
            self.bad_inputs += [{**value, "test": report.nodeid, "passed": report.passed}
                                for name, value in report.user_properties if name == BAD_INPUT]
        props: dict[str, Any] = dict(report.user_properties)
        scenario = props.get(SCENARIO)
        if scenario is None:
            return
        nodeid = report.nodeid
        self.scenario_of[nodeid] = str(scenario)
        self.policy[nodeid] = str(props.get(POLICY, SHIPPED))
        before = self.outcome.get(nodeid)
        if report.skipped and before is None:
            self.outcome[nodeid] = "skipped"
        elif report.failed:
            self.outcome[nodeid] = "failed"
        elif report.when == "call" and report.passed and before is None:
            self.outcome[nodeid] = "passed"
        if FIGURES in props:
            self.figures[nodeid] = props[FIGURES]

    def rows(self) -> list[Row]:
        rows: dict[str, Row] = {}
        examples_of: dict[str, Counter[str]] = {}  # scenario -> examples per target, over its tests
        for nodeid, scenario in self.scenario_of.items():
            row = rows.setdefault(scenario, Row(scenario))
            row_examples = examples_of.setdefault(scenario, Counter())
            row.policies.add(self.policy.get(nodeid, SHIPPED))
            outcome = self.outcome.get(nodeid)
            if outcome in ("passed", "failed"):
                row.runs += 1
                row.passed += outcome == "passed"
            fig = self.figures.get(nodeid)
            if fig is None:
                if outcome == "passed":
                    row.problems.append(f"{nodeid} passed without measuring anything")
                continue
            examples: dict[str, int] = fig["examples"]
            if outcome == "passed" and not fig["recorded"] and not examples:
                row.problems.append(f"{nodeid} passed without recording its figures")
            row.lost_events = _add(row.lost_events, fig["lost_events"])
            row.duplicate_actions = _add(row.duplicate_actions, fig["duplicate_actions"])
            if fig["recovery_s"] is not None:
                row.recovery_s = max(row.recovery_s or 0.0, fig["recovery_s"])
            row.examples += sum(examples.values())
            row_examples.update(examples)
            if fig["notes"]:
                row.notes.append(fig["notes"])
        for row in rows.values():
            row.notes += [f"{k}: {v} examples" for k, v in examples_of[row.scenario].items()]
            if row.runs == 0:
                row.problems.append("no test of this scenario ran: the row is empty")
            elif row.passed < row.runs:
                row.problems.append(f"{row.runs - row.passed} of {row.runs} runs failed")
            if row.lost_events:
                row.problems.append(f"{row.lost_events} events lost")
            if row.duplicate_actions:
                row.problems.append(f"{row.duplicate_actions} duplicate actions")
        return sorted(rows.values(), key=lambda r: r.scenario)

    def security(self) -> tuple[list[str], list[str]]:
        """The security section's lines, kind by kind, and its problems."""
        lines, problems = [], []
        for kind in BAD_INPUT_KINDS:
            rows = [r for r in self.bad_inputs if r["kind"] == kind]
            lines.append(f"{kind}: {len(rows)} tried" if rows else f"{kind}: none tried in this run")
            for r in rows:
                lost = "-" if r["lost"] is None else r["lost"]
                lines.append(f"    {r['what']}: {r['got']}; lost {lost}{'' if r['passed'] else '; TEST FAILED'}")
                if r["lost"] or not r["passed"]:
                    problems.append(f"{kind}: {r['what']} ({r['test']})")
        return lines, problems


TABLE = pytest.StashKey[Table]()
#: Figures of the tests running in this process, until their teardown report takes them.
LIVE = pytest.StashKey[dict[str, Figures]]()


def _reports(config: pytest.Config) -> bool:
    """Whether this process builds the table: not an xdist worker, whose reports go to the controller."""
    return not hasattr(config, "workerinput")


class _Collector:
    """Feeds every report this process receives to the table."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.table.add(report)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}(name): the reliability-table row this test measures")
    config.stash[TABLE] = Table()
    config.stash[LIVE] = {}
    if _reports(config):
        config.pluginmanager.register(_Collector(config.stash[TABLE]), "scenario-table-collector")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Each phase's report of a scenario's test names the scenario; the teardown's adds the figures
    (the fixture's own teardown, which counts lost events, has run by then)."""
    report = yield
    mark = item.get_closest_marker(MARK)
    if mark is not None:
        props = [*report.user_properties, (SCENARIO, str(mark.args[0])), (POLICY, policy_of(item))]
        figures = item.config.stash[LIVE].pop(item.nodeid, None) if report.when == "teardown" else None
        if figures is not None:
            props.append((FIGURES, figures.summary()))
        report.user_properties = props  # a new list: the item's own must not collect these
    return report


@pytest.fixture
def scenario_figures(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Figures]:
    """This test's figures; every event it publishes on the bus is remembered for the lost count."""
    mark = request.node.get_closest_marker(MARK)
    if mark is None:
        raise pytest.UsageError(f"{request.node.nodeid} uses scenario_figures without @pytest.mark.scenario")
    figures = Figures(str(mark.args[0]))
    request.config.stash[LIVE][request.node.nodeid] = figures
    original = RedisEventBus.publish

    def publish(self: RedisEventBus, events: Iterable[NodeEvent]) -> int:
        batch = list(events)
        sent = original(self, batch)  # raises BusUnavailable: nothing is counted as published
        figures.sent(batch)
        return sent

    monkeypatch.setattr(RedisEventBus, "publish", publish)
    yield figures
    if figures.lost_events is None and figures.db is not None and figures.published:
        figures.lost_events = figures.lost(figures.db)  # the test failed before it recorded


@pytest.fixture
def bad_inputs(request: pytest.FixtureRequest) -> BadInputs:
    """Rows for the security section: ``bad_inputs.tried(kind, what, got, lost)``."""
    return BadInputs(request.node)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    table = session.config.stash[TABLE]
    if not _reports(session.config):
        return
    lines, problems = table.security()
    if problems and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    security_out = os.environ.get(SECURITY_OUT)
    if security_out and table.bad_inputs:
        Path(security_out).write_text(json.dumps({"lines": lines, "problems": problems}))
    if not table.scenario_of:
        return
    rows = table.rows()
    out = os.environ.get("REMEDIATION_RELIABILITY_OUT")
    if out:
        with Path(out).open("w") as fh:
            for row in rows:
                fh.write(json.dumps({**row.__dict__, "policies": sorted(row.policies)}, default=str) + "\n")
    if any(r.problems for r in rows) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    table = config.stash[TABLE]
    if table.bad_inputs:
        terminalreporter.section("security: bad inputs tried")
        lines, problems = table.security()
        for line in lines:
            terminalreporter.line(line)
        terminalreporter.line("; ".join(problems) or "nothing lost")
    if not table.scenario_of:
        return
    terminalreporter.section("reliability table")
    for row in table.rows():
        verdict = "; ".join(row.problems) or "ok"
        terminalreporter.line(
            f"{row.scenario}: {row.passed}/{row.runs} passed, lost "
            f"{'-' if row.lost_events is None else row.lost_events}, policy {'+'.join(sorted(row.policies))}, "
            f"{verdict}"
        )
