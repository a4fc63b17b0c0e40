"""The job model on hand-built span histories with known answers: what an interruption costs a job, by
cause, and the ETTR that follows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path

import pytest
import yaml

from remediation.rehearsal.goodput import JobModel, PolicyFacts, Span, replay
from remediation.rehearsal.run import Layout, Pace, rehearse
from remediation.rehearsal.trace import Scale, load
from remediation.rehearsal.truth import parse_model
from remediation.settings import Settings

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DAY = (T0, T0 + timedelta(days=1))
#: One job of 4 nodes, a checkpoint every hour, 10 minutes to restart; spares as the fleet allows.
JOB = JobModel(job_nodes=4, checkpoint_s=3600, restart_s=600, spare_fraction=0.0)
NO_DETECT = PolicyFacts({}, lambda fault_class: False)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def nodes(n: int) -> list[str]:
    return [f"gpu-node-{i}" for i in range(n)]


def lost(g: object) -> dict[str, float]:
    return {k: v for k, v in g.lost_hours.items() if v}  # type: ignore[attr-defined]


def test_a_fault_30_minutes_after_a_checkpoint_loses_30_minutes_and_the_restart() -> None:
    # 6 nodes: one job of 4 and 2 spares (spare_fraction 0 still keeps one, and 6 - 4 leaves two).
    g = replay([Span("gpu-node-1", at(90), at(300))], nodes(6), model=JOB, facts=NO_DETECT, window=DAY)
    assert g.jobs == 1 and g.spare_nodes == 2
    assert lost(g) == {"lost_work": pytest.approx(0.5), "restart": pytest.approx(10 / 60)}
    assert g.ettr == pytest.approx(1 - (0.5 + 10 / 60) / 24)
    assert g.interruptions == 1 and g.checkpoint_saves == 0


def test_a_checkpoint_request_saves_the_work() -> None:
    saves = PolicyFacts({}, lambda fault_class: fault_class == "gpu-memory")
    g = replay([Span("gpu-node-1", at(90), at(300), "gpu-memory")], nodes(6), model=JOB, facts=saves, window=DAY)
    assert lost(g) == {"restart": pytest.approx(10 / 60)}
    assert g.checkpoint_saves == 1


def test_an_urgent_class_gets_no_request_and_loses_the_work() -> None:
    saves = PolicyFacts({}, lambda fault_class: fault_class == "gpu-memory")
    g = replay([Span("gpu-node-1", at(90), at(300), "gpu-rma")], nodes(6), model=JOB, facts=saves, window=DAY)
    assert lost(g)["lost_work"] == pytest.approx(0.5) and g.checkpoint_saves == 0


def test_the_job_stalls_until_the_policy_notices() -> None:
    facts = PolicyFacts({"kubernetes": 300.0, "slurm": 0.125}, lambda fault_class: False)
    g = replay([Span("gpu-node-1", at(90), at(300), source="kubernetes")], nodes(6), model=JOB, facts=facts,
               window=DAY)
    assert lost(g) == {"detection": pytest.approx(5 / 60), "lost_work": pytest.approx(0.5),
                       "restart": pytest.approx(10 / 60)}


def test_a_false_positive_costs_what_a_fault_costs_and_is_counted_as_one() -> None:
    fault = replay([Span("gpu-node-1", at(90), at(300))], nodes(6), model=JOB, facts=NO_DETECT, window=DAY)
    ours = replay([Span("gpu-node-1", at(90), at(300), broken=False)], nodes(6), model=JOB, facts=NO_DETECT,
                  window=DAY)
    assert sum(ours.lost_hours.values()) == pytest.approx(sum(fault.lost_hours.values()))
    assert lost(ours) == {"false_positive": pytest.approx(0.5 + 10 / 60)}
    assert ours.false_positives == 1 and fault.false_positives == 0


def test_without_a_spare_the_job_waits_for_the_repair() -> None:
    # 4 nodes: the job holds them all; spare_fraction keeps one, so no job fits at all.
    assert replay([], nodes(4), model=JOB, facts=NO_DETECT, window=DAY).jobs == 0
    # 5 nodes: one job and one spare, which a fault takes first; the job's own fault then waits.
    spans = [Span("gpu-node-4", at(10), at(600)), Span("gpu-node-1", at(90), at(300))]
    g = replay(spans, nodes(5), model=JOB, facts=NO_DETECT, window=DAY)
    assert g.spare_nodes == 1 and g.fewest_free == 0
    assert lost(g) == {"lost_work": pytest.approx(0.5), "waiting": pytest.approx(3.5),
                       "restart": pytest.approx(10 / 60)}


def test_a_spare_takes_the_broken_nodes_place_at_once() -> None:
    g = replay([Span("gpu-node-1", at(90), at(600))], nodes(5), model=JOB, facts=NO_DETECT, window=DAY)
    assert "waiting" not in lost(g)


def test_a_fault_during_the_restart_loses_the_restart_so_far_and_no_work() -> None:
    spans = [Span("gpu-node-1", at(90), at(300)), Span("gpu-node-2", at(95), at(300))]
    g = replay(spans, nodes(8), model=JOB, facts=NO_DETECT, window=DAY)
    # 30 min of work; 5 min of the first restart; then a whole restart.
    assert lost(g) == {"lost_work": pytest.approx(0.5), "restart": pytest.approx(15 / 60)}
    assert g.interruptions == 2


def test_a_fault_on_a_spare_costs_no_job_anything() -> None:
    g = replay([Span("gpu-node-5", at(90), at(300))], nodes(6), model=JOB, facts=NO_DETECT, window=DAY)
    assert g.ettr == 1.0 and g.interruptions == 0 and g.fewest_free == 1


def test_the_shares_add_up_and_ettr_counts_every_job() -> None:
    two = JobModel(job_nodes=2, checkpoint_s=3600, restart_s=600, spare_fraction=0.0)
    spans = [Span("gpu-node-0", at(30), at(40)), Span("gpu-node-3", at(200), at(260), broken=False)]
    g = replay(spans, nodes(5), model=two, facts=NO_DETECT, window=DAY)
    assert g.jobs == 2 and g.job_hours == pytest.approx(48)
    d = g.as_dict()
    assert sum(d["lost_share_by_cause"].values()) == pytest.approx(1.0, abs=1e-3)
    # Job 0: 30 min of work and a restart (the spare); job 1, at 200 min: 20 min and a restart, on the
    # node job 0 gave back, all of it the false positive's.
    assert d["lost_hours_by_cause"] == {"detection": 0.0, "lost_work": 0.5, "waiting": 0.0, "restart": 0.17,
                                        "false_positive": 0.5}
    assert d["ettr"] == pytest.approx(1 - (40 + 30) / 60 / 48, abs=1e-4)


def test_a_rehearsal_reports_an_ettr_whose_lost_time_adds_up() -> None:
    model = parse_model("truth", yaml.safe_load(resources.files("remediation.data").joinpath("truth-llama3.yaml")
                                                .read_text()))
    mix = resources.files("remediation.data").joinpath("llama3-405b-interruptions.csv")
    faults = load(Path(str(mix)), Scale(nodes=64, days=30, start=T0, seed=2), model=model)
    report = rehearse(faults, Settings(), nodes(64), pace=Pace(settle=timedelta(hours=1)),
                      layout=Layout(leaf_size=16, jobs=JobModel(job_nodes=8)))
    g = report.as_dict()["goodput"]
    assert g["jobs"] == 7 and g["spare_nodes"] == 8
    assert len(faults) > 10 and g["interruptions"] > 0 and 0 < g["ettr"] < 1
    assert sum(g["lost_share_by_cause"].values()) == pytest.approx(1.0, abs=1e-3)
    assert sum(g["lost_hours_by_cause"].values()) == pytest.approx(g["lost_hours"], abs=0.05)
    assert g["ettr"] == pytest.approx(1 - g["lost_hours"] / g["job_hours"], abs=1e-3)
    # The spans the job model read are the node-hours out of service the rehearsal reports.
    assert report.node_hours_out > 0
