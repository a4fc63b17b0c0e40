"""`remediation rehearse` reports the jobs' ETTR for the policy and beside it for the baseline, with the
job model's options, in its table and in `-o json`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from remediation.adapters import logs
from remediation.cli import main

MIX = "remediation/data/llama3-405b-interruptions.csv"
#: 64 nodes over 30 days, seed 2: a leaf's fabric fault takes 16 of the 64 nodes out at once.
ARGS = ["--trace", MIX, "--nodes", "64", "--days", "30", "--seed", "2", "--job-nodes", "8",
        "--baseline", "deploy/policies/naive-ladder.yaml"]


@pytest.fixture(autouse=True)
def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "configure_from", lambda settings: None)


def rehearse(*argv: str) -> str:
    result = CliRunner().invoke(main.app, ["rehearse", *argv])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_json_carries_ettr_for_the_policy_and_the_baseline() -> None:
    doc = json.loads(rehearse(*ARGS, "--checkpoint-minutes", "30", "--restart-minutes", "5", "-o", "json"))
    mine, base = doc["policy"]["goodput"], doc["baseline"]["goodput"]
    for g in (mine, base):
        assert g["jobs"] == 7 and g["job_nodes"] == 8 and g["spare_nodes"] == 8
        assert 0 < g["ettr"] < 1
        assert g["ettr"] == pytest.approx(1 - g["lost_hours"] / g["job_hours"], abs=1e-3)
    # The naive ladder's storm breaker latches on the leaf fault and holds its nodes until a human
    # closes it: the jobs wait for nodes, which the default policy's incident does not make them do.
    assert base["lost_hours_by_cause"]["waiting"] > 10 * mine["lost_hours_by_cause"]["waiting"]
    assert mine["ettr"] > base["ettr"]


def test_the_checkpoint_interval_moves_the_work_lost() -> None:
    hourly = json.loads(rehearse(*ARGS, "-o", "json"))["policy"]["goodput"]
    often = json.loads(rehearse(*ARGS, "--checkpoint-minutes", "10", "-o", "json"))["policy"]["goodput"]
    assert often["lost_hours_by_cause"]["lost_work"] < hourly["lost_hours_by_cause"]["lost_work"]
    assert often["interruptions"] == hourly["interruptions"]


def test_the_table_shows_ettr_beside_the_baseline() -> None:
    out = rehearse(*ARGS)
    row = next(line for line in out.splitlines() if line.startswith("ETTR"))
    assert row.count("(7 · 8 · 8)") == 2


def test_a_job_of_no_nodes_is_refused() -> None:
    result = CliRunner().invoke(main.app, ["rehearse", "--trace", MIX, "--job-nodes", "0"])
    assert result.exit_code == 2 and "--job-nodes" in result.output
