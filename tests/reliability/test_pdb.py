"""Scenario 9, PDB deadlock: an eviction a PodDisruptionBudget never allows escalates after the timeout,
and nothing is force-deleted. Runs the wire-level test (the real kubernetes client against the local
API server, the real Engine on Postgres) and records its figures for the suite's table."""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import pytest

from remediation.simulator.kube.api import KubeAPIServer
from tests.integration.kube.conftest import kube_api, make_settings  # noqa: F401  (fixtures)
from tests.integration.kube.test_kube_workflow import (  # noqa: F401  (fixtures)
    EVICT_TIMEOUT_S,
    TAINT,
    build,
    by,
    clock,
    settings,
)
from tests.integration.kube.test_kube_workflow import (
    test_a_budget_that_never_allows_quarantines_after_the_timeout_and_forces_nothing as deadlock,
)

TOO_MANY_REQUESTS = HTTPStatus.TOO_MANY_REQUESTS.value  # what a DisruptionBudget answers an eviction


@pytest.mark.scenario("9 PDB deadlock")
def test_pdb_deadlock_escalates_and_forces_nothing(build: Callable[..., Any], kube_api: KubeAPIServer,  # noqa: F811
                                                   scenario_figures: Any) -> None:
    deadlock(build, kube_api)
    refused = [r for r in kube_api.requests if r.path.endswith("/eviction") and r.status == TOO_MANY_REQUESTS]
    deletes = [r for r in kube_api.requests if r.method == "DELETE"]
    patched = {r.path.rsplit("/", 1)[-1] for r in kube_api.requests if r.method == "PATCH" and "/nodes/" in r.path}
    quarantined = sorted(n for n in patched if TAINT in [t["key"] for t in kube_api.node(n)["spec"].get("taints", [])])
    scenario_figures.record(
        notes=f"{len(refused)} evictions refused ({TOO_MANY_REQUESTS} DisruptionBudget) over {EVICT_TIMEOUT_S}s; Nodes with the "
              f"quarantine taint: {len(quarantined)}; DELETE requests: {len(deletes)}")
    assert refused and not deletes and len(quarantined) == 1
