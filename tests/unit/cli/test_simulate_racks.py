"""`remediation rehearse --racks N`: a fleet of NVL72 racks reports node-hours lost per NVLink domain
fault under the domain ladder against per-tray remediation, figures counted from the run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from remediation.adapters import logs
from remediation.cli import main
from remediation.domain.events import EventKind, NodeEvent, Source
from tests.unit.rehearsal.test_racks import T0

LINE = re.compile(r"NVLink domain faults: (\d+); node-hours lost per domain fault: domain ladder ([\d.]+), "
                  r"per-tray ([\d.]+) \(ratio ([\d.]+)\)")


@pytest.fixture
def trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One node fault: the racks' domain faults come from the outcome model, not from the trace."""
    monkeypatch.setattr(logs, "configure_from", lambda settings: None)
    path = tmp_path / "one.jsonl"
    path.write_text(NodeEvent(source=Source.SLURM, node="gpu-node-3", kind=EventKind.UNHEALTHY, state="FAIL",
                              reason="xid 79", observed_at=T0, dedupe_key="case:1").to_json() + "\n")
    return path


def rehearse(*argv: str) -> str:
    result = CliRunner().invoke(main.app, ["rehearse", *argv])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_a_rack_fleet_reports_the_domain_ladder_against_per_tray_from_the_run(trace: Path) -> None:
    args = ["--trace", str(trace), "--racks", "4", "--days", "365", "--site", "bare-metal", "--seed", "2"]
    doc = json.loads(rehearse(*args, "-o", "json"))["nvlink_domains"]
    ladder, alone = doc["domain_ladder"], doc["per_tray"]
    assert doc["racks"] == 4 and doc["faults"] == sum(doc["by_kind"].values()) > 0
    # Every figure is the run's: hours over faults, and the ratio of the two.
    assert ladder["node_hours_lost_per_fault"] == pytest.approx(ladder["node_hours_lost"] / doc["faults"], abs=0.01)
    assert alone["node_hours_lost_per_fault"] == pytest.approx(alone["node_hours_lost"] / doc["faults"], abs=0.01)
    assert doc["ratio"] == pytest.approx(ladder["node_hours_lost"] / alone["node_hours_lost"], abs=0.001)
    assert ladder["node_hours_lost"] < alone["node_hours_lost"]
    # One repair per rack against every tray on its own: a fabric restart on all 18 trays per fault,
    # one page per quarantined domain against one per tray handed over.
    assert ladder["actions"]["fabric-restart"] == 18 * doc["faults"]
    assert ladder["pages"] == ladder["quarantined_trays"] // 18 < alone["pages"]
    line = LINE.search(rehearse(*args))
    assert line is not None
    assert int(line[1]) == doc["faults"]
    assert float(line[2]) == pytest.approx(ladder["node_hours_lost_per_fault"], abs=0.05)
    assert float(line[3]) == pytest.approx(alone["node_hours_lost_per_fault"], abs=0.05)
    assert float(line[4]) == pytest.approx(doc["ratio"], abs=0.005)


def test_a_fleet_without_racks_reports_as_before(trace: Path) -> None:
    out = rehearse("--trace", str(trace), "--days", "365")
    assert "NVLink domain faults" not in out
    assert "nvlink_domains" not in json.loads(rehearse("--trace", str(trace), "-o", "json"))


def test_racks_need_an_outcome_model_with_racks(trace: Path) -> None:
    truth = Path(__file__).resolve().parents[3] / "remediation" / "data" / "truth-hardware-heavy.yaml"
    result = CliRunner().invoke(main.app, ["rehearse", "--trace", str(trace), "--racks", "1", "--truth", str(truth)])
    assert result.exit_code == 2 and "has no racks section" in result.output
