"""Two partitions of a real slurmctld under two profiles, one acting and one in shadow.

The partitions are made on the session cluster (``scontrol create partition``) and removed after. The
real Slurm watcher reports each node's partitions in its inventory; the real ingest resolves each
node's profile from them; the same fault (FAIL, "xid 79") on a node of each partition is remediated
for real in the acting one (drained in Slurm, the machine action issued, returned IDLE) and only
recorded, marked dry-run with "would ..." rows, in the shadow one, whose node Slurm still shows as the
researcher left it. ``policy explain`` says why each was treated as it was.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryWorld
from remediation.db.models import AuditLog, Node
from remediation.ports.dispatch import FollowUp
from remediation.profiles.service import governance
from remediation.services import policy_views
from remediation.services.ingest import IngestRules, ingest
from remediation.settings import ProfileSettings
from tests.integration.slurm.conftest import SlurmCluster
from tests.integration.slurm.test_slurm_workflow import (
    PREFIX,
    Pipeline,
    SlurmdRestartVM,
    make_settings,
    rems_of,
    steps_of,
    wait_idle,
)

pytestmark = [pytest.mark.slurm]

PROFILES = [
    {"name": "training", "select": {"partitions": ["train"]}, "mode": "act"},
    {"name": "inference", "select": {"partitions": ["serve"]}, "mode": "shadow"},
]


@dataclass
class ProfiledPipeline(Pipeline):
    """The pipeline with the ingest the workers run: each node under its profile."""

    def _handle(self, payloads: Sequence[bytes]) -> None:
        with self.sessions() as s, s.begin():
            result = ingest(s, payloads, self.settings.policy, clock=self.clock,
                            rules=IngestRules(governance=governance(self.settings)))
        self.handled += len(payloads)
        self.opened += [FollowUp(rid, step) for rid, step in result.opened]


@pytest.fixture
def partitions(slurm: SlurmCluster) -> Iterator[None]:
    slurm.scontrol("create", "partitionname=train", "nodes=gpu-node-[0-1]", "state=up")
    slurm.scontrol("create", "partitionname=serve", "nodes=gpu-node-[2-3]", "state=up")
    try:
        yield
    finally:
        for name in ("train", "serve"):
            slurm.scontrol("delete", f"partitionname={name}", check=False)


@pytest.fixture
def pipeline(
    slurm: SlurmCluster,
    partitions: None,
    redis_client: redis.Redis,
    redis_prefix: str,
    sessions: sessionmaker[Session],
) -> Iterator[ProfiledPipeline]:
    world = MemoryWorld(nodes=slurm.nodes)
    vm = SlurmdRestartVM(world, slurm)
    settings = make_settings(slurm, redis_prefix).model_copy(
        update={"profiles": [ProfileSettings(**p) for p in PROFILES]}
    )
    yield ProfiledPipeline(slurm, settings, redis_client, sessions, world, vm)
    vm.close()


def test_the_same_fault_acts_in_one_partition_and_is_only_recorded_in_the_other(
    slurm: SlurmCluster, pipeline: ProfiledPipeline
) -> None:
    p = pipeline
    with p.watching():
        p.wait_until(
            lambda: (
                profiles_of(p.sessions)
                == {
                    "gpu-node-0": "training",
                    "gpu-node-1": "training",
                    "gpu-node-2": "inference",
                    "gpu-node-3": "inference",
                }
            ),
            10,
            "every node in its partition's profile",
        )
        for node in ("gpu-node-1", "gpu-node-3"):
            slurm.scontrol("update", f"nodename={node}", "state=fail", "reason=xid 79")
        p.wait_event("gpu-node-1", 5.0)
        p.wait_event("gpu-node-3", 5.0)
        opened = p.take_opened()
        assert len(opened) == 2
        p.settle(opened)
        (acted,) = rems_of(p.sessions, "gpu-node-1")
        (shadow,) = rems_of(p.sessions, "gpu-node-3")

        # The acting partition: drained for real, restarted, returned to service.
        assert (acted.profile, acted.dry_run, acted.status) == ("training", False, "succeeded")
        assert not any(r.dry_run for r in steps_of(p.sessions, acted.id))
        assert any(key.startswith(f"r{acted.id}:") for key in p.vm.by_key)  # type: ignore[attr-defined]
        wait_idle(slurm, "gpu-node-1")

        # The shadow partition: every row says what would have been done, and Slurm was never touched.
        assert (shadow.profile, shadow.dry_run, shadow.status) == ("inference", True, "succeeded")
        assert all(r.dry_run for r in steps_of(p.sessions, shadow.id))
        assert not any(key.startswith(f"r{shadow.id}:") for key in p.vm.by_key)  # type: ignore[attr-defined]
        state, flags, reason = slurm.nodes_now()["gpu-node-3"]
        assert "FAIL" in flags | {state} and reason == "xid 79" and not reason.startswith(PREFIX)
        with p.sessions() as s:
            rows = audit_of(s, "gpu-node-3")
        assert rows and all(a["dry_run"] and a["reason"].startswith("would ") for a in rows)
        assert any(a["action"] == "open" for a in rows)

        # explain tells why.
        with p.sessions() as s:
            acting = policy_views.explain_node(s, p.settings, "gpu-node-1")
            recording = policy_views.explain_node(s, p.settings, "gpu-node-3")
        assert (acting["profile"], acting["mode"], acting["facts"]["partitions"]) == (
            "training",
            "act",
            sorted(["gpu", "train"]),
        )
        assert (recording["profile"], recording["mode"]) == ("inference", "shadow")
        assert recording["why"] == "profile inference is the only one that selects it"
        assert {f["field"]: f["layer"] for f in recording["fields"]}["mode"] == "profile"


def profiles_of(sessions: sessionmaker[Session]) -> dict[str, Any]:
    with sessions() as s:
        return dict(s.execute(select(Node.name, Node.profile)).all())


def audit_of(s: Session, node: str) -> list[dict[str, Any]]:
    return [
        {"action": a.action, "reason": a.reason, "dry_run": a.dry_run}
        for a in s.scalars(select(AuditLog).where(AuditLog.target == node).order_by(AuditLog.id))
    ]
