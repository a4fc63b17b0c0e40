"""Hardware identity across clusters (real Postgres): a GPU (or a BMC) that failed in ``west`` and shows
up under a node of ``east`` is flagged on that node, and its failures count in the node's lemon score;
hardware that never failed anywhere else is not flagged. Rows are written through sessions scoped to
each cluster, as each cluster's workers write them; the reads are on-call's (unscoped) and the node
detail's (any scope: hardware lookups see every cluster)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from remediation.db.models import HardwareSighting, Node, Remediation
from remediation.db.scope import scoped
from remediation.domain.events import Source
from remediation.domain.lemon import Failure, score
from remediation.domain.statemachine import RemediationStatus, Step
from remediation.services.hardware import hardware_flag, hardware_flags
from remediation.services.lemons import lemons
from remediation.services.reliability import reliability
from remediation.settings import LemonSettings

T0 = datetime(2026, 11, 1, tzinfo=UTC)
NOW = T0 + timedelta(days=3)
CFG = LemonSettings()


def node(s: Session, name: str) -> None:
    s.add(Node(name=name, first_seen_at=T0 - timedelta(days=30), updated_at=T0))


def failed(s: Session, name: str, at: datetime, fault_class: str, *, status: RemediationStatus) -> int:
    rem = Remediation(node=name, cause="xid 79", source=Source.SLURM, status=status, step=Step.DONE,
                      opened_at=at, updated_at=at, closed_at=at + timedelta(hours=1), fault_class=fault_class)
    s.add(rem)
    s.flush()
    return rem.id


def seen(s: Session, name: str, at: datetime, rid: int | None, *, gpus: tuple[str, ...] = (),
         bmc_serial: str | None = None) -> None:
    s.add(HardwareSighting(node=name, at=at, remediation_id=rid, step=Step.VALIDATE if gpus else Step.QUARANTINE,
                           bmc_serial=bmc_serial, gpus=[{"uuid": f"GPU-{sn}", "serial": sn} for sn in gpus]))


@pytest.fixture
def fleet(sessions: sessionmaker[Session]) -> dict[str, int]:
    """west: gpu-node-0 failed and was quarantined on GPU SN-BAD; gpu-node-7 failed on BMC BMC-9;
    gpu-node-5's GPU SN-OK was read without any failure. east (the same names): gpu-node-0 now carries
    SN-BAD and failed once itself; gpu-node-3 stands on BMC-9; gpu-node-1 carries SN-OK; gpu-node-2 its own."""
    ids = {}
    with scoped(sessions, "west")() as s, s.begin():
        for n in ("gpu-node-0", "gpu-node-5", "gpu-node-7"):
            node(s, n)
        ids["west0"] = failed(s, "gpu-node-0", T0, "gpu-hardware", status=RemediationStatus.QUARANTINED)
        seen(s, "gpu-node-0", T0 + timedelta(minutes=30), ids["west0"], gpus=("SN-BAD", "SN-W1"))
        ids["west7"] = failed(s, "gpu-node-7", T0, "host", status=RemediationStatus.QUARANTINED)
        seen(s, "gpu-node-7", T0 + timedelta(minutes=30), ids["west7"], bmc_serial="BMC-9")
        seen(s, "gpu-node-5", T0, None, gpus=("SN-OK",))
    with scoped(sessions, "east")() as s, s.begin():
        for n in ("gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3"):
            node(s, n)
        ids["east0"] = failed(s, "gpu-node-0", T0 + timedelta(days=1), "gpu-memory",
                              status=RemediationStatus.SUCCEEDED)
        seen(s, "gpu-node-0", T0 + timedelta(days=1, minutes=30), ids["east0"], gpus=("SN-BAD", "SN-E1"))
        seen(s, "gpu-node-1", T0 + timedelta(days=1), None, gpus=("SN-OK", "SN-E2"))
        seen(s, "gpu-node-2", T0 + timedelta(days=1), None, gpus=("SN-E3",))
        seen(s, "gpu-node-3", T0 + timedelta(days=1), None, bmc_serial="BMC-9")
    return ids


def test_hardware_that_failed_in_one_cluster_is_flagged_in_another(fleet, sessions) -> None:
    with sessions() as s:
        flags = hardware_flags(s, NOW)
    assert sorted(flags) == [("east", "gpu-node-0"), ("east", "gpu-node-3")]
    (gpu,) = flags["east", "gpu-node-0"].failures
    assert (gpu.identity, gpu.cluster, gpu.node, gpu.remediation_id) == ("gpu:SN-BAD", "west", "gpu-node-0",
                                                                         fleet["west0"])
    (bmc,) = flags["east", "gpu-node-3"].failures
    assert (bmc.identity, bmc.cluster, bmc.node) == ("serial:BMC-9", "west", "gpu-node-7")
    assert "gpu:SN-BAD failed in west as gpu-node-0" in flags["east", "gpu-node-0"].summary
    # west's gpu-node-0 is not flagged for east's later failure on SN-BAD: it failed here first.


def test_hardware_that_never_failed_elsewhere_is_not_flagged(fleet, sessions) -> None:
    """SN-OK was read in west without a failure; gpu-node-2's GPUs were never seen in west at all."""
    with sessions() as s:
        assert hardware_flag(s, "east", "gpu-node-1", until=NOW) is None
        assert hardware_flag(s, "east", "gpu-node-2", until=NOW) is None
        assert hardware_flag(s, "west", "gpu-node-5", until=NOW) is None


def test_the_node_detail_flag_sees_every_cluster_from_a_scoped_session(fleet, sessions) -> None:
    with scoped(sessions, "east")() as s:
        flag = hardware_flag(s, "east", "gpu-node-0", until=NOW)
    assert flag is not None and [f.remediation_id for f in flag.failures] == [fleet["west0"]]


def test_the_lemon_score_follows_the_hardware(fleet, sessions) -> None:
    """east's gpu-node-0 failed once itself; its GPU SN-BAD failed in west: both count, and it says why."""
    own = score([Failure(T0 + timedelta(days=1), "gpu-memory")], NOW, CFG)
    carried = score([Failure(T0, "gpu-hardware"), Failure(T0 + timedelta(days=1), "gpu-memory")], NOW, CFG)
    assert carried.score > own.score
    with sessions() as s:
        fleet_rows = {r.node: r for r in lemons(s, NOW, CFG)}
        east_rows = {r.node: r for r in lemons(s, NOW, CFG, cluster="east")}
    row = fleet_rows["east/gpu-node-0"]
    assert (row.cluster, row.score, row.failures) == ("east", carried.score, 2)
    assert row.hardware.startswith("gpu:SN-BAD failed in west as gpu-node-0")
    assert f"counted with its hardware's failures elsewhere: {row.hardware}" in row.explanation  # stats --lemons
    # west's own gpu-node-0 keeps its own score: the same name in another cluster is another node.
    assert fleet_rows["west/gpu-node-0"].score == score([Failure(T0, "gpu-hardware")], NOW, CFG).score
    assert fleet_rows["west/gpu-node-0"].hardware == ""
    # One cluster's ranking names nodes as before clusters, and still carries the flag.
    assert set(east_rows) == {"gpu-node-0", "gpu-node-3"} and east_rows["gpu-node-0"].score == carried.score
    assert east_rows["gpu-node-3"].hardware.startswith("serial:BMC-9 failed in west as gpu-node-7")
    with scoped(sessions, "east")() as s:  # a session scoped to east ranks east's nodes only, flags and all
        scoped_rows = {r.node: (r.score, r.hardware) for r in lemons(s, NOW, CFG)}
    assert scoped_rows == {n: (r.score, r.hardware) for n, r in east_rows.items()}


def test_the_reliability_report_lists_the_flags(fleet, sessions) -> None:
    with sessions() as s:
        rep = reliability(s, T0, NOW, lemon=CFG, cluster="east")
        west = reliability(s, T0, NOW, lemon=CFG, cluster="west")
    assert [(f.cluster, f.node) for f in rep.flags] == [("east", "gpu-node-0"), ("east", "gpu-node-3")]
    assert west.flags == []
