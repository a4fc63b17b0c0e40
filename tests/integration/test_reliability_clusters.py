"""Reliability over two clusters in one database that share node names (real Postgres): the same known
history (:func:`tests.integration.test_reliability.build_known`) recorded once in ``west`` and once in
``east``, each through its own workflow over sessions scoped to it, as a worker serves a cluster.

Each cluster's figures must be the one-cluster report's, the fleet's their sum, and no figure may
merge west's ``gpu-node-1`` with east's."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.db.models import HardwareSighting
from remediation.db.scope import scoped
from remediation.reports import reliability as report
from remediation.services.reliability import Reliability, reliability
from tests.integration.history import sessions  # noqa: F401
from tests.integration.test_reliability import build_known

CLUSTERS = ("west", "east")


def own_hardware(sessions: sessionmaker[Session], cluster: str) -> None:
    """The in-memory machines name hosts and GPUs alike in every world; real clusters' hardware differs:
    prefix this cluster's hosts and GPU serials with its name."""
    with scoped(sessions, cluster)() as s, s.begin():
        for row in s.scalars(select(HardwareSighting)):
            row.host = f"{cluster}-{row.host}" if row.host else None
            row.gpus = [{**g, "serial": f"{cluster}-{g['serial']}"} for g in row.gpus]


@pytest.fixture
def both(sessions: sessionmaker[Session]) -> dict[str, tuple[Reliability, dict[str, Any]]]:  # noqa: F811
    """Each cluster's history, and its report read through its own scoped session (as before clusters)."""
    out = {}
    for c in CLUSTERS:
        _, facts = build_known(scoped(sessions, c))
        own_hardware(sessions, c)
        out[c] = facts
    reports = {}
    for c, facts in out.items():
        with scoped(sessions, c)() as s:
            reports[c] = (reliability(s, facts["start"], facts["until"], lemon=facts["settings"].policy.lemon), facts)
    return reports


def test_each_cluster_alone_is_the_one_cluster_report(both, sessions) -> None:  # noqa: F811
    for c in CLUSTERS:
        alone, facts = both[c]  # read through the cluster's scoped session: as before clusters
        with sessions() as s:  # unscoped, with --cluster
            rep = reliability(s, facts["start"], facts["until"], lemon=facts["settings"].policy.lemon, cluster=c)
        assert rep.clusters == (c,) and rep.fleet is None and "cluster" not in rep.trends
        assert rep.trends == alone.trends
        assert rep.hardware == alone.hardware and rep.moves == alone.moves
        assert [(r.node, r.score) for r in rep.lemons] == [(r.node, r.score) for r in alone.lemons]
        assert {m.name for m in rep.trends["pool"].nodes} == {f"gpu-node-{i}" for i in range(4)}


def test_the_fleet_report_keeps_two_clusters_nodes_apart(both, sessions) -> None:  # noqa: F811
    west, facts = both["west"]
    with sessions() as s:
        rep = reliability(s, facts["start"], facts["until"], lemon=facts["settings"].policy.lemon)
    assert rep.clusters == CLUSTERS[::-1]  # sorted: east, west
    # Per cluster: each is exactly the one-cluster figures of its nodes.
    per = {g.name: g for g in rep.trends["cluster"].groups}
    assert set(per) == set(CLUSTERS)
    ones = {g.name: g for g in west.trends["pool"].groups}
    for c in CLUSTERS:
        g = per[c]
        assert (g.nodes, g.faults, g.repairs) == (4, 4, 3)
        assert g.out_h == pytest.approx(sum(x.out_h for x in ones.values()))
        assert g.by_class == {"gpu-hardware": 2, "gpu-memory": 1, "host": 1}
    # The fleet: 8 nodes, every fault of both, its MTBF over both clusters' hours.
    f = rep.fleet
    assert f is not None and (f.nodes, f.faults, f.repairs) == (8, 8, 6)
    assert f.out_h == pytest.approx(2 * per["west"].out_h)
    assert f.mtbf_h == pytest.approx(per["west"].mtbf_h)
    # Per node: west/gpu-node-1 and east/gpu-node-1 are two nodes with two faults each, not one with four.
    nodes = {m.name: m for m in rep.trends["pool"].nodes}
    assert len(nodes) == 8 and nodes["west/gpu-node-1"].faults == nodes["east/gpu-node-1"].faults == 2
    alone = {m.name: m for m in west.trends["pool"].nodes}
    assert nodes["west/gpu-node-1"].mtbf_h == pytest.approx(alone["gpu-node-1"].mtbf_h)
    # Pools are per cluster: a pool named a3 in both holds 4 nodes, 2 of each.
    pools = {g.name: g for g in rep.trends["pool"].groups}
    assert (pools["a3"].nodes, pools["a3"].faults) == (4, 4)
    # Hardware eras and moves are per (cluster, node): each cluster's moves, labelled with it.
    assert sorted(m.node for m in rep.moves) == sorted(
        f"{c}/{m.node}" for c in CLUSTERS for m in both[c][0].moves)
    # Lemons rank both clusters' nodes, each scored on its own history.
    lemon = {r.node: r for r in rep.lemons}
    one = {r.node: r for r in west.lemons}
    for c in CLUSTERS:
        assert lemon[f"{c}/gpu-node-1"].cluster == c
        assert lemon[f"{c}/gpu-node-1"].failures == one["gpu-node-1"].failures


def test_a_window_from_before_the_nodes_existed_counts_them_from_when_they_were_seen(both, sessions) -> None:  # noqa: F811
    _, facts = both["west"]
    with sessions() as s:
        rep = reliability(s, facts["start"], facts["until"], lemon=facts["settings"].policy.lemon)
        early = reliability(s, facts["start"] - timedelta(days=1), facts["until"], lemon=facts["settings"].policy.lemon)
    nodes = early.trends["pool"].nodes
    assert early.fleet is not None and rep.fleet is not None and early.fleet.faults == 8
    assert early.fleet.mtbf_h == sum(m.hours for m in nodes) / 8
    assert early.fleet.mtbf_h == pytest.approx(rep.fleet.mtbf_h)  # no node existed in the extra day
    for g in early.trends["cluster"].groups:  # each cluster: its nodes' hours over its faults
        mine = [m for m in nodes if m.name.startswith(f"{g.name}/")]
        assert g.mtbf_h == sum(m.hours for m in mine) / g.faults


def test_the_fleet_report_renders_per_cluster_and_fleet(both, sessions) -> None:  # noqa: F811
    _, facts = both["west"]
    with sessions() as s:
        rep = reliability(s, facts["start"], facts["until"], lemon=facts["settings"].policy.lemon)
    text = report.to_csv(rep)
    assert "fleet,,fleet,faults,8\n" in text and "window,,,clusters,east west\n" in text
    assert "group,cluster,west,faults,4\n" in text and "group,cluster,east,faults,4\n" in text
    assert "node,,west/gpu-node-1,faults,2\n" in text and "node,,east/gpu-node-1,faults,2\n" in text
    html = report.standalone_html(rep, facts["until"])
    assert "The fleet: 2 clusters" in html and "By cluster" in html and "east/gpu-node-2" in html
    with sessions() as s:  # one cluster: no fleet, no cluster grouping, names as before clusters
        one = report.to_csv(reliability(s, facts["start"], facts["until"], lemon=facts["settings"].policy.lemon,
                                        cluster="east"))
    assert "fleet" not in one and "group,cluster" not in one and "node,,gpu-node-1,faults,2\n" in one
