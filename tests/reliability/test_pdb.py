"""Scenario 9, PDB deadlock: an eviction a PodDisruptionBudget never allows escalates after the timeout,
and nothing is force-deleted. Runs the wire-level test (the real kubernetes client against the local
API server, the real Engine on Postgres) and records its figures for the suite's table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from simulator.kube_api import KubeAPIServer
from tests.integration.kube.conftest import kube_api, make_settings  # noqa: F401  (fixtures)
from tests.integration.kube.test_kube_workflow import (  # noqa: F401  (fixtures)
    EVICT_TIMEOUT_S,
    build,
    by,
    clock,
    settings,
)
from tests.integration.kube.test_kube_workflow import (
    test_a_budget_that_never_allows_quarantines_after_the_timeout_and_forces_nothing as deadlock,
)


@pytest.mark.scenario("9 PDB deadlock")
def test_pdb_deadlock_escalates_and_forces_nothing(build: Callable[..., Any], kube_api: KubeAPIServer,  # noqa: F811
                                                   scenario_figures: Any) -> None:
    deadlock(build, kube_api)
    refused = [r for r in kube_api.requests if r.path.endswith("/eviction") and r.status == 429]
    deletes = [r for r in kube_api.requests if r.method == "DELETE"]
    scenario_figures.record(
        notes=f"{len(refused)} evictions refused (429 DisruptionBudget) over {EVICT_TIMEOUT_S}s, then "
              f"quarantined; DELETE requests: {len(deletes)}")
    assert refused and not deletes
