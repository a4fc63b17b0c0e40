"""A Slurm-only site with no machine action, on the real slurmctld 22.05, run by real worker processes.

``kube.backend: none`` and ``machine.backend: none``: the workers drain the node with the real
``scontrol``, take no cordon, eviction, machine or verify step (none is recorded, not one faked), and
with ``validation.backend: slurm`` run the real check job in a maintenance reservation on the node:

- a researcher's FAIL "xid 79" whose check passes is returned to service (resumed by ``return``);
- one whose check fails is quarantined, drained with our quarantine reason, never resumed;
- with no check at all, the node is held drained with one page and never resumed: the barrier before
  "never" is the return step's own count of looks at it, not a sleep; a human's resume ends it.

The events are what the Slurm watcher would publish, appended to the Redis stream; the workers' kick
relay starts the ingest. The verdicts are read through the CLI (``remediations show``). One worker
process serves the two checked nodes; the unchecked site needs settings of its own, hence a second.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool
from typer.testing import CliRunner

from remediation.adapters.bus import RedisEventBus
from remediation.cli.oncall import app
from remediation.db.models import AuditLog, Remediation, RemediationStep, Validation
from remediation.domain.events import EventKind, NodeEvent, Source
from tests.conftest import REDIS_URL
from tests.integration.slurm.conftest import SlurmCluster, slurm, slurm_cluster  # noqa: F401  (fixtures)
from tests.integration.workerproc import Worker, wait_for, worker_env

pytestmark = pytest.mark.slurm

PREFIX = "remediation:"
#: The "GPU check": waits for its node's cue file under the directory it is given and exits with the code
#: written there. Its output names the node and the reservation it ran in.
CHECK = """#!/bin/sh
echo "check on $SLURMD_NODENAME in reservation $SLURM_JOB_RESERVATION"
cue="$1/$SLURMD_NODENAME"
while [ ! -f "$cue" ]; do sleep 0.1; done
code=$(cat "$cue")
echo "result: exit $code"
exit "$code"
"""


def site_env(cluster: SlurmCluster, pg_url: str, prefix: str, tmp: Path, check_dir: Path | None,
             machine: str = "none") -> dict[str, str]:
    """A Slurm-only site with the ``machine`` backend (none: no machine action); ``check_dir``: the GPU
    check through Slurm, else none."""
    checks = {"unknown": ["/bin/sh", str(check_dir / "check.sh"), str(check_dir)]} if check_dir else None
    env = worker_env(pg_url, REDIS_URL, prefix, tmp, **{
        "REMEDIATION_SLURM__BACKEND": "cli",
        "REMEDIATION_SLURM__SLURM_CONF": str(cluster.conf),
        "REMEDIATION_KUBE__BACKEND": "none",
        "REMEDIATION_MACHINE__BACKEND": machine,
        "REMEDIATION_VALIDATION__BACKEND": "slurm" if check_dir else "none",
    })
    if check_dir is not None:
        env.update({"REMEDIATION_VALIDATION__SLURM_WORKDIR": str(check_dir),
                    "REMEDIATION_VALIDATION__CHECKS": json.dumps(checks),
                    "REMEDIATION_VALIDATION__POLL_INTERVAL_S": "0.2",
                    "REMEDIATION_VALIDATION__TIMEOUT_S": '{"default": 60}'})
    return {k: v for k, v in env.items() if not k.startswith("REMEDIATION_MEMORY__")}


class SlurmOnlySite:
    """One site's worker, its database and its stream."""

    def __init__(self, cluster: SlurmCluster, pg_url: str, tmp: Path, check_dir: Path | None,
                 machine: str = "none") -> None:
        self.prefix = f"test-{uuid.uuid4().hex[:12]}"
        self.url = pg_url
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.db = create_engine(pg_url, poolclass=NullPool)
        self.worker = Worker(site_env(cluster, pg_url, self.prefix, tmp, check_dir, machine), tmp)
        wait_for(self.worker.ready, 90, "the worker", self.worker)

    def fail(self, cluster: SlurmCluster, node: str, reason: str) -> int:
        """A researcher sets the node FAIL; the event the Slurm watcher publishes lands on the stream."""
        cluster.scontrol("update", f"nodename={node}", "state=fail", f"reason={reason}")
        event = NodeEvent(source=Source.SLURM, node=node, kind=EventKind.UNHEALTHY, state="IDLE+FAIL", reason=reason,
                          observed_at=datetime.now(UTC))
        RedisEventBus(self.redis, self.prefix).publish([event])
        rid: int = wait_for(lambda: self.scalar(select(Remediation.id).where(Remediation.node == node)), 30,
                            f"a remediation of {node}", self.worker)
        return rid

    def scalar(self, query: Any) -> Any:
        with Session(self.db) as s:
            return s.scalar(query)

    def show(self, rid: int, *options: str) -> Any:
        """``remediation remediations show ID``: JSON with ``-o json``, else the text on-call reads."""
        out = CliRunner().invoke(app, ["remediations", "show", str(rid), *options],
                                 env={"REMEDIATION_DATABASE__URL": self.url, "REMEDIATION_CONFIG": "", "COLUMNS": "250"})
        assert out.exit_code == 0, out.output
        return json.loads(out.output) if options else out.output

    def close(self) -> None:
        self.worker.kill()  # what it did is in the database already; a graceful stop costs seconds
        for key in self.redis.scan_iter(match=f"{self.prefix}*", count=1000):
            self.redis.delete(key)
        self.redis.close()
        self.db.dispose()


@pytest.fixture(scope="module")
def check_dir(slurm_cluster: SlurmCluster) -> Iterator[Path]:  # noqa: F811
    """Where the check and its cues live: a directory slurmd and the workers both see, ours only."""
    path = slurm_cluster.workdir / f"absence-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o755)
    (path / "check.sh").write_text(CHECK)
    yield path
    slurm_cluster.run("scancel", "--quiet", "--name", "nr-gate", check=False)


@pytest.fixture(scope="module")
def checked(slurm_cluster: SlurmCluster, pg_module_db: str, check_dir: Path,  # noqa: F811
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmOnlySite]:
    """A Slurm-only site without a machine action whose GPU check runs through Slurm: one worker."""
    site = SlurmOnlySite(slurm_cluster, pg_module_db, tmp_path_factory.mktemp("checked"), check_dir)
    yield site
    site.close()


def rows(site: SlurmOnlySite, rid: int) -> list[tuple[str, str, str, bool]]:
    """Each step row: step, status, what it says happened (a failed row's error), dry_run."""
    with Session(site.db) as s:
        return [(r.step, r.status, (r.error if r.status == "failed" else r.outcome) or "", r.dry_run) for r in s.scalars(
            select(RemediationStep).where(RemediationStep.remediation_id == rid).order_by(RemediationStep.id))]


def ended(site: SlurmOnlySite, rid: int) -> str | None:
    status = site.scalar(select(Remediation.status).where(Remediation.id == rid))
    return status if status not in ("running", "waiting") else None


def checked_to_the_end(site: SlurmOnlySite, cluster: SlurmCluster, check_dir: Path, node: str,
                       exit_code: int) -> tuple[int, str, list[tuple[str, str, str, bool]]]:
    """A FAIL "xid 79" whose GPU check will exit with ``exit_code``, run until its remediation ends."""
    (check_dir / node).write_text(str(exit_code))
    rid = site.fail(cluster, node, "xid 79")
    try:
        status = wait_for(lambda: ended(site, rid), 90, "the remediation to end", site.worker)
    except AssertionError as exc:
        raise AssertionError(f"{rows(site, rid)}; slurm: {cluster.nodes_now()[node]}") from exc
    return rid, status, rows(site, rid)


def test_a_passed_check_returns_the_drained_node(slurm: SlurmCluster, checked: SlurmOnlySite, check_dir: Path) -> None:  # noqa: F811
    node = slurm.nodes[1]
    rid, status, steps = checked_to_the_end(checked, slurm, check_dir, node, 0)
    assert status == "succeeded"
    assert [s[:2] for s in steps] == [("slurm_drain", "done"), ("validate", "done"), ("return", "done")]
    drained, validated, returned = (s[2] for s in steps)
    assert drained == "drained; no jobs running"  # our drain replaced the researcher's FAIL
    assert validated.startswith(f"GPU check passed: `/bin/sh {check_dir}/check.sh {check_dir}` on {node}")
    assert returned == "resumed in Slurm" and not any(s[3] for s in steps)  # real, not a dry run
    with Session(checked.db) as s:
        check = s.scalars(select(Validation).where(Validation.remediation_id == rid)).one()
    assert (check.backend, check.outcome, check.exit_code) == ("slurm", "passed", 0)
    assert f"check on {node} in reservation nr-gate-r{rid}-a1" in check.output_tail  # the real job, on the node
    state, flags, _ = slurm.nodes_now()[node]
    assert not flags & {"DRAIN", "FAIL"}, (state, flags)

    shown = checked.show(rid, "-o", "json")
    assert (shown["status"], shown["fault_class"], shown["action"]) == ("succeeded", "gpu-hardware", None)
    assert shown["context"]["no_kubernetes"] is True and shown["context"]["no_machine"] is True
    text = checked.show(rid)
    assert "Kubernetes (kube.backend none): nothing cordoned, evicted or tainted" in text
    assert "a machine action (machine.backend none): nothing restarted, nothing verified" in text


def test_a_failed_check_quarantines_the_node_it_cannot_repair(slurm: SlurmCluster, checked: SlurmOnlySite,  # noqa: F811
                                                             check_dir: Path) -> None:
    node = slurm.nodes[2]
    rid, status, steps = checked_to_the_end(checked, slurm, check_dir, node, 1)
    assert status == "quarantined"
    assert [s[:2] for s in steps] == [("slurm_drain", "done"), ("validate", "failed"), ("collect_evidence", "done"),
                                      ("quarantine", "done")]
    assert steps[1][2].startswith("GPU check failed:") and "exit 1" in steps[1][2]
    # xid 79's state is kept before its quarantine, by a job like the check (no GPU tools on this machine:
    # each command is recorded missing, and the quarantine goes on).
    assert steps[2][2].startswith(f"collected from {node}: nvidia-smi-q missing")
    assert steps[3][2] == "kept out of the Slurm pool; no Kubernetes: no Node to taint"
    shown = checked.show(rid, "-o", "json")
    assert (shown["status"], shown["action"]) == ("quarantined", "quarantine")
    why = shown["context"]["quarantine_reason"]
    assert why.startswith("no machine action at this site: GPU check failed") and "RMA" in why
    _, flags, reason = slurm.nodes_now()[node]
    assert "DRAIN" in flags and reason.startswith(f"{PREFIX} quarantined: no machine action at this site")


def test_with_no_check_the_node_is_held_with_one_page_and_never_resumed(
        slurm: SlurmCluster, pg_url: str, tmp_path: Path) -> None:  # noqa: F811
    site = SlurmOnlySite(slurm, pg_url, tmp_path, None)
    node = slurm.nodes[3]
    try:
        rid = site.fail(slurm, node, "xid 79")
        # The barrier: the return step has looked at the held node again and again.
        looks = select(RemediationStep.checks).where(RemediationStep.remediation_id == rid,
                                                    RemediationStep.step == "return")
        wait_for(lambda: (site.scalar(looks) or 0) >= 5, 60, "five looks at the held node", site.worker)
        steps = rows(site, rid)
        assert [s[:2] for s in steps] == [("slurm_drain", "done"), ("return", "waiting")]
        assert steps[1][2].startswith(f"held for a human: no machine action and no GPU check at this site, so "
                                      f"nothing can prove {node} healthy")
        _, flags, reason = slurm.nodes_now()[node]
        cause = site.scalar(select(Remediation.cause).where(Remediation.id == rid))
        assert "DRAIN" in flags and reason == f"{PREFIX} {cause}"  # still out, with our drain
        pages = select(AuditLog.reason).where(AuditLog.action == "unproven_hold")
        with Session(site.db) as s:
            assert [p.split(":")[0] for p in s.scalars(pages)] == [node]  # one page
        # Between two looks it is waiting; during a look (longer on a slow machine) it is running.
        shown = wait_for(lambda: (j := site.show(rid, "-o", "json"))["status"] == "waiting" and j, 30,
                         "the held remediation between two looks", site.worker)
        assert (shown["status"], shown["step"], shown["action"]) == ("waiting", "return", "hold")

        slurm.scontrol("update", f"nodename={node}", "state=resume")  # a human fixed it and takes it back
        assert wait_for(lambda: ended(site, rid), 30, "the hold to end", site.worker) == "cancelled"
        outcome = site.scalar(select(Remediation.outcome).where(Remediation.id == rid))
        assert outcome.startswith(f"a human took {node} back while it was held")
        assert [s[:2] for s in rows(site, rid)] == [("slurm_drain", "done"), ("return", "done")]
    finally:
        site.close()
