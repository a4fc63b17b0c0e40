"""Scenario 10: fuzzing every input the service parses. 0 crashes; every rejection is a clear error.

Targets: event payloads (parsed and ingested into Postgres in batches: a bad payload lands in
rejected_events with its error, the good ones around it are recorded), `sinfo --json` documents,
`scontrol show node -o` lines, hostlists, providerIDs and settings. The API's inputs are fuzzed by
schemathesis in tests/integration/test_api_schemathesis.py (the same row of the table). Each target
counts the examples its body actually ran (``scenario_figures.example``), so the table says how much
was tried, not how much was allowed; runs and passed are the five tests' own outcomes.
"""

from __future__ import annotations

import json
import string
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from remediation.adapters.slurm.parse import SlurmFormatError, parse_nodes_json, parse_scontrol_line
from remediation.clock import FakeClock
from remediation.db.models import Event, RejectedEvent
from remediation.domain.events import InvalidEvent, NodeEvent
from remediation.domain.providerid import InvalidProviderID, parse_provider_id
from remediation.hostlist import HostlistError, expand
from remediation.services.ingest import ingest
from remediation.settings import Settings, SettingsError, load_settings
from tests.scenario_table import Figures

EXAMPLES = 300
SCENARIO = pytest.mark.scenario("10 fuzzing (hypothesis; API by schemathesis)")
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                             HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
VALID = {"source": "slurm", "node": "gpu-node-1", "kind": "unhealthy", "state": "FAIL", "reason": "xid",
         "observed_at": "2026-01-01T00:00:00+00:00"}


@st.composite
def payloads(draw: Any) -> str:
    """Mostly near-valid events with one field broken, some random JSON, some garbage text."""
    choice = draw(st.integers(0, 3))
    if choice == 0:
        doc = dict(VALID)
        doc[draw(st.sampled_from(sorted(VALID) + ["extra"]))] = draw(json_values)
        return json.dumps(doc)
    if choice == 1:
        return json.dumps(draw(json_values))
    if choice == 2:
        return draw(st.text(max_size=80))
    doc = dict(VALID, node=draw(st.text(alphabet=string.printable, min_size=1, max_size=20)),
               reason=draw(st.text(max_size=200)))
    return json.dumps(doc)


@SCENARIO
@FUZZ
@given(st.lists(payloads(), min_size=1, max_size=8))
def test_event_payloads_never_crash_the_ingest(scenario_figures: Figures, pg_url_module: str, batch: list[str]) -> None:
    scenario_figures.example("event payloads (ingested into Postgres)")
    expected_ok = 0
    keys = set()
    for raw in batch:
        try:
            ev = NodeEvent.parse(raw)
            if ev.dedupe_key not in keys:
                keys.add(ev.dedupe_key)
                expected_ok += 1
        except InvalidEvent as exc:
            assert str(exc).startswith("invalid event: ") and ":" in str(exc)[15:]
    engine = create_engine(pg_url_module, poolclass=NullPool)
    with engine.connect() as conn:
        tx = conn.begin()
        session = Session(bind=conn, join_transaction_mode="create_savepoint")
        result = ingest(session, batch, Settings().policy, clock=FakeClock(datetime(2026, 1, 2, tzinfo=UTC)))
        session.flush()
        rejected = session.scalar(select(func.count()).select_from(RejectedEvent))
        recorded = session.scalar(select(func.count()).select_from(Event))
        tx.rollback()
    engine.dispose()
    assert result.rejected == rejected == len(batch) - sum(1 for r in batch if _parses(r))
    assert recorded == result.recorded == expected_ok


def _parses(raw: str) -> bool:
    try:
        NodeEvent.parse(raw)
        return True
    except InvalidEvent:
        return False


@pytest.fixture(scope="module")
def pg_url_module(pg_session_db: str) -> str:
    return pg_session_db


@SCENARIO
@FUZZ
@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_slurm_readers_reject_garbage_clearly(scenario_figures: Figures, text: str) -> None:
    scenario_figures.example("sinfo --json documents and scontrol lines")
    for parse in (parse_nodes_json, parse_scontrol_line):
        try:
            parse(text)
        except SlurmFormatError as exc:
            assert str(exc)


@SCENARIO
@FUZZ
@given(st.text(alphabet="gpu-node[]0123456789,-_.x ", max_size=40))
def test_hostlists_expand_or_reject_clearly(scenario_figures: Figures, expr: str) -> None:
    scenario_figures.example("hostlist expressions")
    try:
        names = expand(expr)
    except HostlistError as exc:
        assert str(exc)
    else:
        assert all(n and "[" not in n and "]" not in n for n in names)


@SCENARIO
@FUZZ
@given(st.one_of(st.text(max_size=120), st.sampled_from(["gce://", "azure:///", "aws:///"]).flatmap(
    lambda p: st.text(alphabet=string.ascii_letters + string.digits + "/-_.", max_size=120).map(lambda t: p + t))))
def test_provider_ids_parse_or_reject_clearly(scenario_figures: Figures, raw: str) -> None:
    scenario_figures.example("providerIDs")
    try:
        vm = parse_provider_id(raw)
    except InvalidProviderID as exc:
        assert "providerID" in str(exc)
    else:
        assert vm.name and vm.provider in ("gce", "azure", "aws", "memory")


SETTINGS_FIELDS = [
    "REMEDIATION_POLICY__MAX_CONCURRENT", "REMEDIATION_POLICY__BREAKER_MAX_FRACTION",
    "REMEDIATION_POLICY__IGNORE_REASONS", "REMEDIATION_POLICY__KUBE_CONDITIONS", "REMEDIATION_WORKFLOW__LADDER",
    "REMEDIATION_SLURM__BACKEND", "REMEDIATION_KUBE__MIN_CONDITION_S", "REMEDIATION_DRY_RUN",
    "REMEDIATION_API__ADMIN_TOKENS", "REMEDIATION_MACHINE__AZURE_TEST_TOKEN", "REMEDIATION_WORKFLOW__MAX_WAIT_S",
]


@SCENARIO
@FUZZ
@given(st.dictionaries(st.sampled_from(SETTINGS_FIELDS), st.text(max_size=40) | json_values.map(json.dumps),
                       min_size=1, max_size=4))
def test_settings_load_or_name_the_bad_field(scenario_figures: Figures, env: dict[str, str]) -> None:
    scenario_figures.example("settings (environment values)")
    with pytest.MonkeyPatch.context() as mp:
        for key in list(__import__("os").environ):
            if key.startswith("REMEDIATION_"):
                mp.delenv(key)
        for key, value in env.items():
            mp.setenv(key, value.replace("\x00", ""))
        try:
            load_settings()
        except SettingsError as exc:
            message = str(exc)
            named = [k.removeprefix("REMEDIATION_").lower().replace("__", ".") for k in env]
            assert any(n in message or n.split(".")[-1] in message for n in named), message

