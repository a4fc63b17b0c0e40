"""Property-based test of the JSON API against its own OpenAPI spec: whatever schemathesis generates
(odd node names, huge ids, unicode reasons, missing fields), the API answers without a server error,
and every answer conforms to the spec: a documented status code, the documented content type and a
body that validates against the response schema.

Two runs: each operation on its own, and a stateful run that follows the links schemathesis infers
between operations (a remediation or incident listed, then fetched and acted on by its id). Both
count the examples they executed (a row of the reliability table, scenario 10, with the fuzzers of
tests/reliability/test_fuzz.py).

It runs with an admin token on a database holding a realistic history, so the levers really act
(and refuse) instead of stopping at 401. The app is built once at import (schemathesis reads its
spec at collection time); its session factory is a proxy that the module's fixture points at a fresh
database. Bounded by max_examples so the whole module stays well under a minute.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from remediation.api import create_app
from remediation.db.models import Base
from remediation.db.session import make_engine, make_session_factory
from remediation.settings import DatabaseSettings, Settings
from tests.conftest import _db_url, _drop, _pg_admin
from tests.integration.history import RecordingDispatcher, build
from tests.scenario_table import Figures

ADMIN = "admin-token-schemathesis-0123"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
SCENARIO = pytest.mark.scenario("10 fuzzing (hypothesis; API by schemathesis)")


class SessionsProxy:
    """Looks like a sessionmaker; delegates to the current test's database."""

    target: sessionmaker[Session] | None = None

    def __call__(self) -> Session:
        assert self.target is not None, "the database fixture did not run"
        return self.target()

    @property
    def kw(self) -> dict[str, object]:
        """What the target was made with (a cluster's scoped factory copies it)."""
        assert self.target is not None, "the database fixture did not run"
        return self.target.kw


proxy = SessionsProxy()
app = create_app(Settings(api={"admin_tokens": [ADMIN]}), proxy,  # type: ignore[arg-type]
                 queue_depth=lambda: {"workflow": 0}, dispatcher=RecordingDispatcher())
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module")
def module_pg_url(pg_template: str) -> Iterator[str]:
    """One fresh migrated database for the whole module: the operations share an evolving history,
    which is both faster and closer to a real server than a reset per operation."""
    name = f"remschema_{uuid.uuid4().hex[:10]}"
    with _pg_admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield _db_url(name)
    _drop(name)


def fresh_history(sessions: sessionmaker[Session]) -> None:
    """Empty every table (ids restart at 1) and build the history again: the same state, the same ids."""
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with sessions() as s, s.begin():
        s.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    build(sessions)


@pytest.fixture(scope="module", autouse=True)
def database(module_pg_url: str) -> Iterator[None]:
    engine = make_engine(DatabaseSettings(url=module_pg_url))
    proxy.target = make_session_factory(engine)
    build(proxy.target)
    yield
    proxy.target = None
    engine.dispose()


@SCENARIO
@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_answer_conforms_to_the_spec(scenario_figures: Figures, case: schemathesis.Case) -> None:
    scenario_figures.example("API operations (schemathesis)")
    case.call_and_validate(headers=AUTH, checks=CHECKS)


@SCENARIO
def test_stateful_sequences_conform_to_the_spec(scenario_figures: Figures) -> None:
    """Sequences of calls along the inferred links; every call's answer is checked as above."""

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            # Every sequence starts from the same database: Hypothesis replays a sequence's draws and
            # requires the same answers (ids taken from them) to draw the same way again.
            assert proxy.target is not None
            fresh_history(proxy.target)

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, object]:
            return {"headers": AUTH}

        def validate_response(self, response: object, case: schemathesis.Case, **kwargs: object) -> None:
            scenario_figures.example("API call sequences (schemathesis, stateful)")
            case.validate_response(response, checks=CHECKS)  # type: ignore[arg-type]

    Workflow.run(settings=settings(max_examples=15, stateful_step_count=5, deadline=None,
                                   suppress_health_check=list(HealthCheck)))
    assert scenario_figures.examples["API call sequences (schemathesis, stateful)"] > 0
