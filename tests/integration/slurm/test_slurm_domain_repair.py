"""The domain ladder on the real slurmctld of 24.11 and 26.05 (topology/block, 4 blocks of 4, BlockSizes=4),
no Kubernetes, the validation through Slurm and the rack's BMC the sushy-tools emulator (HTTPS, a login).

b1's four trays run a slurmd each (conftest's ``b1``). The watcher's domains are
read from ``scontrol show topology``; an SXID on two trays of b1 reaches the real ingest on Postgres,
and the engine is driven look by look as the worker's task does:

- one domain repair opens and no tray has a remediation of its own;
- the fabric restart runs as one job on each of the 4 trays (a stand-in on the jobs' PATH notes where it
  ran), then the domain check as one 4-node job (a stand-in ``all_reduce_perf`` notes each rank's job
  and node);
- with the check passing, all 4 trays return to service, and the BMC got no reset;
- with the check failing on one tray, the rack is power-cycled through its chassis (the emulator's
  chassis offers no ``#Chassis.Reset``, so its one system, the rack's power, gets ForceOff then On: one
  POST each in its own access log), the check fails again, and the block is quarantined: every tray
  keeps a quarantine reason in Slurm, and one audit row pages with the RMA note.

The fabric restart's command is a site setting; it is the test's stand-in here (``validation.fabric_restart``).
The policy is the shipped one but for ``breaker_max_fraction`` (see ``settings_for``).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.redfish import make_rack_power
from remediation.adapters.slurm.cli import CliSlurm
from remediation.adapters.slurm.validator import SlurmValidator
from remediation.clock import SystemClock
from remediation.db.intents import StepIntents
from remediation.db.models import AuditLog, DomainRepair, DomainRepairStep, Node, Remediation
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.outcomes import Adapters
from remediation.domain.statemachine import NodeStatus
from remediation.domain.states import AuditAction
from remediation.domain.topology import slurm_domain_sizes, slurm_domains
from remediation.domain_repair.rules import DomainRepairStatus, DomainStep
from remediation.domain_repair.service import DomainRepairs
from remediation.services.ingest import ingest
from remediation.settings import Settings, load_settings
from tests.integration.history import sessions  # noqa: F401  (the committed database's sessions)
from tests.integration.redfish.conftest import PASSWORD, USER, Emulator, running_emulator
from tests.integration.slurm.conftest import SlurmCluster
from tests.integration.slurm.test_slurm_domain_check import STAND_IN
from tests.integration.workerproc import wait_for

pytestmark = pytest.mark.slurm

PREFIX = "remediation:"
RACK = "00000000-0000-4000-8000-0000000000b1"  # the rack's power: the one system its chassis links
#: The fabric restart as far as the job can tell: it notes the tray it ran on and its job.
RESTART = """#!/bin/sh
echo "$SLURM_JOB_ID $SLURMD_NODENAME" >> "$(dirname "$0")/restarts"
echo "nvidia-imex restarted on $SLURMD_NODENAME"
"""
#: The domain check's stand-in, noting each rank's job and node before it answers.
RANKS = STAND_IN.replace('here=$(dirname "$0")\n', 'here=$(dirname "$0")\necho "$SLURM_JOB_ID $SLURMD_NODENAME" >> "$here/ranks"\n')


@pytest.fixture(scope="module")
def rack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """The rack's BMC: chassis ``Rack_b1`` links one system, the rack's power."""
    chassis = [{"Id": "Rack_b1", "Name": "Rack_b1", "UUID": "00000000-0000-4000-8000-000000000001"}]
    with running_emulator(tmp_path_factory.mktemp("rack-bmc"), {"rack-power": RACK}, chassis) as bmc:
        yield bmc


@pytest.fixture
def site(slurm_block_cluster: SlurmCluster, b1: list[str], rack: Emulator,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A work directory with both stand-ins first on the PATH the validator (and so its jobs) has, the
    inventory naming b1's chassis; after the test no job and no reservation, b1 resumed."""
    cluster = slurm_block_cluster
    work = cluster.workdir / f"repair-{time.monotonic_ns()}"
    (work / "bin").mkdir(parents=True)
    for name, text in (("all_reduce_perf", RANKS), ("fabric-restart", RESTART)):
        (work / "bin" / name).write_text(text)
        (work / "bin" / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{work / 'bin'}{os.pathsep}{os.environ['PATH']}")
    (work / "inventory.yaml").write_text(yaml.safe_dump(
        {"chassis": {"b1": {"bmc": rack.url, "chassis": "/redfish/v1/Chassis/Rack_b1", "credentials": "rack"}}}))
    (work / "credentials.json").write_text(json.dumps({"rack": {"username": USER, "password": PASSWORD}}))
    yield work
    cluster.put_back(b1, "the repair's jobs")


def settings_for(cluster: SlurmCluster, work: Path, rack: Emulator) -> Settings:
    """The shipped policy but for the storm breaker's fraction: a domain repair counts as all its trays,
    and a block of 4 is 25% of this 16-node pool, a storm at the shipped 10% (docs/policy.md, "The domain
    ladder")."""
    return load_settings(
        policy={"breaker_max_fraction": 0.5},
        slurm=cluster.slurm_options(),
        validation={"backend": "slurm", "slurm_workdir": str(work), "poll_interval_s": 0.2,
                    "fabric_restart": [str(work / "bin" / "fabric-restart")]},
        redfish={"inventory_file": str(work / "inventory.yaml"), "credentials_file": str(work / "credentials.json"),
                 "ca_file": str(rack.ca_file), "unobserved_after_s": 60},
    )


def engine(cfg: Settings, sessions: sessionmaker[Session]) -> DomainRepairs:
    intents = StepIntents(sessions, DomainRepairStep)  # as the worker builds them (workers/context.py)
    adapters = Adapters(slurm=CliSlurm(cfg.slurm), kube=None, machine=None,
                        validator=SlurmValidator(cfg.slurm, cfg.validation, prefix=PREFIX), intents=intents,
                        rack=make_rack_power(cfg, intents))
    return DomainRepairs(sessions, adapters, cfg, clock=SystemClock(), worker=f"test-{uuid.uuid4().hex[:6]}")


def report_sxid(cluster: SlurmCluster, cfg: Settings, sessions: sessionmaker[Session], trays: list[str]) -> int:
    """What the watchers would publish: every node's block from scontrol, then ``trays`` drained by a
    health check for an SXID; all through the real ingest. Returns the repair it opened."""
    switches = CliSlurm(cfg.slurm).topology()
    domains, sizes = slurm_domains(switches), slurm_domain_sizes(switches)
    now = SystemClock().now()
    events = [NodeEvent(source=Source.SLURM, node=n, kind=EventKind.DOMAINS, state="topology", domains=d,
                        domain_sizes=sizes.get(n), observed_at=now) for n, d in domains.items()]
    reason = "SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32"
    cluster.scontrol("update", f"nodename={','.join(trays)}", "state=drain", f"reason={reason}")
    events += [NodeEvent(source=Source.SLURM, node=t, kind=EventKind.UNHEALTHY, state="IDLE+DRAIN", reason=reason,
                         observed_at=now) for t in trays]
    with sessions() as s, s.begin():
        result = ingest(s, [e.to_json() for e in events], cfg.policy, clock=SystemClock(),
                        rules=_rules(cfg))
    assert len(result.repairs) == 1 and result.opened == []
    return result.repairs[0]


def _rules(cfg: Settings):  # type: ignore[no-untyped-def]
    from remediation.services.ingest import IngestRules

    return IngestRules(gpu_reset=cfg.validation.runs_jobs)


def run_to_the_end(repairs: DomainRepairs, rid: int, timeout: float = 150) -> None:
    """Look at the repair as its task does, again and again, until it closes; else say where it stands."""
    try:
        wait_for(lambda: repairs.advance(rid) is None, timeout, f"domain repair #{rid} to close")
    except AssertionError as exc:
        with repairs.sessions() as s:
            rep = s.get(DomainRepair, rid)
            where = rep and (rep.step, rep.wait_reason, [(r.step, r.status, r.outcome, r.detail) for r in rep.steps])
        raise AssertionError(f"{exc}; it stands at {where}") from None


def lines(path: Path) -> list[tuple[str, str]]:
    return [tuple(line.split()) for line in path.read_text().splitlines()] if path.exists() else []  # type: ignore[misc]


def sinfo(cluster: SlurmCluster, nodes: list[str]) -> dict[str, tuple[str, str]]:
    out = cluster.run("sinfo", "-N", "-h", "-n", ",".join(nodes), "-o", "%N|%T|%E").stdout
    return {n: (state, reason) for n, state, reason in (line.split("|") for line in out.splitlines())}


def test_an_sxid_on_two_trays_is_one_repair_that_returns_the_whole_block(
    slurm_block_cluster: SlurmCluster, b1: list[str], site: Path, rack: Emulator,
    sessions: sessionmaker[Session],
) -> None:
    cluster = slurm_block_cluster
    cfg = settings_for(cluster, site, rack)
    resets = rack.posts(f"/redfish/v1/Systems/{RACK}/Actions/ComputerSystem.Reset")  # the BMC serves the module
    rid = report_sxid(cluster, cfg, sessions, b1[1:3])
    run_to_the_end(engine(cfg, sessions), rid)
    with sessions() as s:
        rep = s.get(DomainRepair, rid)
        assert rep is not None and rep.status is DomainRepairStatus.RETURNED, rep and rep.close_reason
        assert rep.rungs == [DomainStep.FABRIC_RESTART, DomainStep.CHASSIS_RESET, DomainStep.QUARANTINE]
        steps = [(r.step, r.status.value) for r in rep.steps]
        assert steps == [(DomainStep.DRAIN, "done"), (DomainStep.JOBS, "done"), (DomainStep.FABRIC_RESTART, "done"),
                         (DomainStep.DOMAIN_CHECK, "done"), (DomainStep.RETURN, "done")]
        assert s.scalars(select(Remediation)).all() == []  # no tray has a remediation of its own
        statuses = dict(s.execute(select(Node.name, Node.status).where(Node.name.in_(b1))).all())
        assert statuses == dict.fromkeys(b1, NodeStatus.HEALTHY)
    restarts = lines(site / "bin" / "restarts")
    assert sorted(node for _, node in restarts) == b1 and len({job for job, _ in restarts}) == 4  # a job per tray
    ranks = lines(site / "bin" / "ranks")
    assert len({job for job, _ in ranks}) == 1 and {node for _, node in ranks} == set(b1)  # one job, 4 trays
    # Back in service: idle, drained by nobody (slurmctld hears from each slurmd again within a ping).
    wait_for(lambda: {n: st for n, (st, _) in sinfo(cluster, b1).items()} == dict.fromkeys(b1, "idle"), 30,
             f"{b1} to be idle in Slurm")
    assert rack.posts(f"/redfish/v1/Systems/{RACK}/Actions/ComputerSystem.Reset") == resets  # no reset


def test_a_failing_domain_check_power_cycles_the_rack_then_quarantines_the_block(
    slurm_block_cluster: SlurmCluster, b1: list[str], site: Path, rack: Emulator,
    sessions: sessionmaker[Session],
) -> None:
    cluster = slurm_block_cluster
    cfg = settings_for(cluster, site, rack)
    (site / "bin" / "fail-on").write_text(b1[2])  # a broken NVLink on one tray: the ranks there fail
    resets = rack.posts(f"/redfish/v1/Systems/{RACK}/Actions/ComputerSystem.Reset")
    rid = report_sxid(cluster, cfg, sessions, b1[:2])
    run_to_the_end(engine(cfg, sessions), rid, timeout=180)
    with sessions() as s:
        rep = s.get(DomainRepair, rid)
        assert rep is not None and rep.status is DomainRepairStatus.QUARANTINED
        steps = [(r.step, r.status.value) for r in rep.steps]
        assert steps == [(DomainStep.DRAIN, "done"), (DomainStep.JOBS, "done"), (DomainStep.FABRIC_RESTART, "done"),
                         (DomainStep.DOMAIN_CHECK, "failed"), (DomainStep.CHASSIS_RESET, "done"),
                         (DomainStep.DOMAIN_CHECK, "failed"), (DomainStep.QUARANTINE, "done")]
        assert s.scalars(select(Remediation)).all() == []
        (page,) = s.scalars(select(AuditLog).where(AuditLog.action == AuditAction.DOMAIN_REPAIR_QUARANTINED)).all()
        assert page.target == "block/b1" and "RMA: NVLink domain block b1, trays gpu-node-[0-3]" in (page.reason or "")
        assert "tried: fabric_restart, chassis_reset" in (page.reason or "")
        statuses = dict(s.execute(select(Node.name, Node.status).where(Node.name.in_(b1))).all())
        assert statuses == dict.fromkeys(b1, NodeStatus.QUARANTINED)
    # The rack's power cycle: ForceOff, then On once Off was seen; one POST each, from the BMC's own log.
    assert rack.posts(f"/redfish/v1/Systems/{RACK}/Actions/ComputerSystem.Reset") - resets == 2
    shown = sinfo(cluster, b1)
    assert all("drain" in state for state, _ in shown.values()), shown
    assert all(reason.startswith(f"{PREFIX} quarantined: NVLink domain block b1") for _, reason in shown.values())


#: A training job as far as the ladder can tell: it saves its work on USR1 (noted beside it) and ends.
TRAINING = """#!/bin/sh
trap 'echo "$SLURM_JOB_ID saved" >> "{here}/saved"; exit 0' USR1
echo started > "{here}/started"
while :; do sleep 0.2; done
"""  # sbatch runs a copy of the script from slurmd's spool: ``{here}`` is where the test reads


def test_a_job_on_a_tray_is_asked_to_checkpoint_and_the_ladder_waits_for_it(
    slurm_block_cluster: SlurmCluster, b1: list[str], site: Path, rack: Emulator,
    sessions: sessionmaker[Session],
) -> None:
    """With ``workflow.checkpoint_signal: USR1`` (off as shipped; this test turns it on), the job on a
    healthy tray of the block is signalled once, and no fabric restart runs before it has left."""
    cluster = slurm_block_cluster
    cfg = settings_for(cluster, site, rack)
    cfg = cfg.model_copy(update={"workflow": cfg.workflow.model_copy(update={"checkpoint_signal": "USR1"})})
    script = site / "bin" / "training"
    script.write_text(TRAINING.format(here=site / "bin"))
    script.chmod(0o755)
    job = cluster.run("sbatch", "--parsable", "-w", b1[3], "-o", str(site / "training.out"), str(script)).stdout.strip()
    try:
        wait_for(lambda: (site / "bin" / "started").exists(), 30, f"job {job} to start on {b1[3]}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {cluster.run('squeue', '-h', '-o', '%i %T %r %N').stdout}") from None
    rid = report_sxid(cluster, cfg, sessions, b1[:1])
    run_to_the_end(engine(cfg, sessions), rid)
    assert lines(site / "bin" / "saved") == [(job, "saved")]  # asked once, and it saved its work
    with sessions() as s:
        rep = s.get(DomainRepair, rid)
        assert rep is not None and rep.status is DomainRepairStatus.RETURNED
        (waited,) = [r for r in rep.steps if r.step is DomainStep.JOBS]
        restart = next(r for r in rep.steps if r.step is DomainStep.FABRIC_RESTART)
        assert waited.provider_op is not None and waited.provider_op["signalled"] == [job]
        assert restart.started_at >= waited.finished_at  # nothing acted under the job
