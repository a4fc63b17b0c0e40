"""A node's NVLink domain as each source names it, on real Postgres, read through the on-call CLI.

The watchers' DOMAINS events (Slurm's block, the Node's ``nvidia.com/gpu.clique`` label) go through
the real ingest; the GPUs' own clique comes from a GPU check's ``nvidia-smi -q`` output, kept the way a
validate step keeps it. Two racks of four trays, whose smallest block (Slurm's BlockSizes) is 3;
gpu-node-3 was re-cabled into rack B, and Slurm's topology still has it in block b1.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from remediation.cli.oncall import app
from remediation.clock import FakeClock
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.states import ValidationOutcome
from remediation.domain.step_records import JobRecord
from remediation.ports.dispatch import SweeperOnly
from remediation.services.ingest import ingest
from remediation.services.metrics import make_registry
from remediation.settings import Settings
from remediation.validation.service import add_row
from tests.integration.history import sessions  # noqa: F401  (the committed database's sessions)

RACK_A, RACK_B = "7a1e0000-0000-4000-8000-0000000000aa.0", "7a1e0000-0000-4000-8000-0000000000bb.0"
BLOCKS = {f"gpu-node-{i}": "b1" if i < 4 else "b2" for i in range(8)}
WIRED = {node: RACK_A if block == "b1" else RACK_B for node, block in BLOCKS.items()} | {"gpu-node-3": RACK_B}


def smi_q(node: str, clique: str) -> str:
    """What a GPU check's ``nvidia-smi -q`` prints for two of the tray's GPUs: each in ``clique``."""
    cluster, clique_id = clique.rsplit(".", 1)
    return "".join(f"""GPU 0000000{g}:01:00.0
    Serial Number                         : 16543{node[-1]}{g}
    GPU UUID                              : GPU-{node[-1]}{g}aaaaaaa-1111-2222-3333-444444444444
    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : {clique_id}
        ClusterUUID                       : {cluster}
""" for g in range(2))


@pytest.fixture
def racks(sessions: sessionmaker[Session]) -> datetime:
    """The watchers' domains, then one GPU check per tray (gpu-node-7 not checked yet); when they ended."""
    clock = FakeClock(datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30))
    events = [NodeEvent(source=Source.SLURM, node=n, kind=EventKind.DOMAINS, state="topology",
                        domains={"block": b}, domain_sizes={"block": 3}, observed_at=clock.now())
              for n, b in BLOCKS.items()]
    events += [NodeEvent(source=Source.KUBERNETES, node=n, kind=EventKind.DOMAINS, state="labels",
                         domains={"nvidia.com/gpu.clique": WIRED[n]}, observed_at=clock.now()) for n in BLOCKS]
    with sessions() as s, s.begin():
        ingest(s, [e.to_json() for e in events], Settings().policy, clock=clock)
        for node in sorted(BLOCKS)[:-1]:
            rec = JobRecord(clock.now(), clock.now(), ValidationOutcome.PASSED, backend="slurm", name="check",
                            node=node, output=smi_q(node, WIRED[node]))
            add_row(s, rec, None, actor="test", dry_run=False)
    return clock.now()


def show(pg_url: str, *args: str) -> str:
    env = {"REMEDIATION_DATABASE__URL": pg_url, "USER": "oncall-tester", "COLUMNS": "250", "REMEDIATION_CONFIG": ""}
    res = CliRunner().invoke(app, ["nodes", "show", *args], env=env, obj=lambda settings: SweeperOnly())
    assert res.exit_code == 0, res.output
    return res.stdout


def test_the_recabled_tray_and_its_old_block_say_the_sources_disagree(pg_url: str, racks: datetime) -> None:
    out = " ".join(show(pg_url, "gpu-node-3").split())
    assert f"NVLink domain: Slurm block b1; clique {RACK_B} (Node label); clique {RACK_B} (its GPUs, checked" in out
    assert ("Sources disagree: Slurm block b1 holds it and gpu-node-[0-2], whose GPUs are in another NVLink "
            "domain; Slurm actions follow the block; its NVLink domain "
            f"{RACK_B} also holds gpu-node-[4-7], which Slurm puts in another block") in out
    one = json.loads(show(pg_url, "gpu-node-0", "-o", "json"))["nvlink"]
    assert one["block"] == "b1" and one["gpus"] == RACK_A and one["disagreements"] == [
        "Slurm block b1 holds it and gpu-node-3, whose GPUs are in another NVLink domain; "
        "Slurm actions follow the block"]


def test_the_rack_it_joined_names_it_too_and_an_unchecked_tray_goes_by_its_label(pg_url: str,
                                                                                racks: datetime) -> None:
    """gpu-node-5 of rack B: its block's other trays share its clique, and the domain also holds
    gpu-node-3 of block b1. gpu-node-7 has had no GPU check: its Node label speaks for its hardware."""
    five = json.loads(show(pg_url, "gpu-node-5", "-o", "json"))["nvlink"]
    assert (five["block"], five["label"], five["gpus"]) == ("b2", RACK_B, RACK_B)
    assert five["disagreements"] == [f"its NVLink domain {RACK_B} also holds gpu-node-3, which Slurm puts in "
                                     "another block; Slurm actions follow the block"]
    seven = json.loads(show(pg_url, "gpu-node-7", "-o", "json"))["nvlink"]
    assert (seven["block"], seven["label"], seven["gpus"], seven["checked_at"]) == ("b2", RACK_B, None, None)
    table = " ".join(show(pg_url, "gpu-node-7").split())
    assert (f"NVLink domain: Slurm block b2; clique {RACK_B} (Node label) Block health: 4 of block b2's 4 nodes "
            "healthy; its smallest block is 3 Sources disagree:") in table


def test_a_block_with_fewer_healthy_trays_than_its_smallest_block_is_a_partial_domain(
        pg_url: str, racks: datetime, sessions: sessionmaker[Session]) -> None:
    """Two of block b1's trays fail (through the real ingest, under the shipped policy): 2 healthy of 4,
    fewer than 3. The node's page says so, and so do the metrics; block b2 is whole."""
    clock = FakeClock(racks + timedelta(minutes=1))
    faults = [NodeEvent(source=Source.SLURM, node=n, kind=EventKind.UNHEALTHY, state="DOWN", reason="Not responding",
                        observed_at=clock.now()) for n in ("gpu-node-0", "gpu-node-1")]
    with sessions() as s, s.begin():
        assert len(ingest(s, [e.to_json() for e in faults], Settings().policy, clock=clock).opened) == 2
    two = json.loads(show(pg_url, "gpu-node-2", "-o", "json"))["nvlink"]
    assert (two["block_size"], two["block_healthy"], two["partial"]) == (3, 2, True)
    table = " ".join(show(pg_url, "gpu-node-2").split())
    assert ("Partial domain: 2 of block b1's 4 nodes healthy, fewer than its smallest block (3): a partial "
            "domain; the rest still serve smaller jobs") in table
    five = json.loads(show(pg_url, "gpu-node-5", "-o", "json"))["nvlink"]
    assert (five["block_size"], five["block_healthy"], five["partial"]) == (3, 4, False)
    registry = make_registry(sessions)
    for block, healthy, partial in (("b1", 2, 1), ("b2", 4, 0)):
        where = {"cluster": "default", "block": block}
        assert registry.get_sample_value("remediation_block_healthy_nodes", where) == healthy
        assert registry.get_sample_value("remediation_block_min_size", where) == 3
        assert registry.get_sample_value("remediation_block_partial", where) == partial
