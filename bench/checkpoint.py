"""Checkpoint before the hammer: time from a fault to the node being free, with and without the request.

On each real Slurm release (22.05, and 24.11 and 26.05 from the cached roots; scripts/slurm-up.sh), the service
runs as deployed: the Slurm watcher (``python -m remediation.watchers.slurm.watcher``) and a Celery worker with beat, on a
scratch Postgres and Redis, with the cli backend and no Kubernetes or machine backend (the drain is
what is measured). Each cycle submits a batch job to its own node that traps USR1, takes ``--save-s``
(5 s) to write a checkpoint, and exits; once the job has set its trap, the node is FAILed with
``scontrol update state=fail``. Then:

    node free   = fault -> squeue lists no job on the node (polled every 0.1 s by the benchmark)
    drain done  = fault -> the slurm_drain step finished (the remediation goes on)
    work kept   = the job wrote its checkpoint before it left

With the request (``workflow.checkpoint_signal: USR1``, ``checkpoint_wait_s`` as shipped) the drain
signals the job as soon as it finds it. Without it (the shipped default) the job runs on until
``drain_timeout_s`` and ``on_jobs_timeout: requeue`` takes it off the node, unsaved. ``drain_timeout_s``
is ``--drain-timeout`` (60 s) rather than the shipped 3,600 s so that a cycle ends; without the request
a node is free only after that timeout, so at the shipped value the difference is an hour per fault.
Polls are the shipped ``workflow.poll_interval_s`` and ``slurm.poll_interval_s`` unless given.
Fewer than 200 cycles print the max, not a p99.

Run: .venv/bin/python -m bench.checkpoint [--cycles 3] [--save-s 5] [--drain-timeout 60]
     [--poll SECONDS] [--releases 22.05,24.11,26.05]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from bench._cluster import RELEASES, ROOT, slurm_cluster
from bench.common import REDIS_URL, goal, scratch_database, scratch_dir, tail
from remediation.db.models import Remediation, RemediationStep
from remediation.settings import SlurmSettings, WorkflowSettings
from tests.integration.workerproc import Worker, wait_for, worker_env

#: With the request, the node must be free this long after the job's own checkpoint time: the
#: watcher noticing the FAIL, the drain's first look, the signal, and Slurm ending the job.
SLACK_S = 15.0
JOB = """#!/bin/bash
trap 'sleep {save_s}; echo saved > {checkpoint}; exit 0' USR1
echo ready > {ready}
while true; do sleep 1 & wait $!; done
"""


def summary(name: str, values: list[float]) -> str:
    return f"    {name:<28} p50 {statistics.median(values):6.1f}s  mean {statistics.fmean(values):6.1f}s  {tail(values, '{:.1f}', 's')}"


def cycle(
    env: dict[str, str], db: Session, node: str, work: Path, save_s: float
) -> tuple[float, float, bool]:
    """One fault on a busy node: (node free, drain done, checkpoint written), seconds after the fault."""
    work.mkdir()
    ready, checkpoint = work / "ready", work / "checkpoint"
    (work / "job.sh").write_text(JOB.format(save_s=f"{save_s:g}", checkpoint=checkpoint, ready=ready))

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=env, capture_output=True, text=True, check=True)  # noqa: S603

    run(
        "sbatch",
        "--parsable",
        "--requeue",
        "-w",
        node,
        "-o",
        "/dev/null",
        "-D",
        str(work),
        str(work / "job.sh"),
    )
    wait_for(ready.exists, 30, f"the job on {node} to set its trap")
    fault, fault_wall = time.monotonic(), time.time()
    run("scontrol", "update", f"nodename={node}", "state=fail", "reason=training hung: loss is NaN")
    while run("squeue", "-h", "-w", node, "-o", "%i").stdout.strip():
        if time.monotonic() - fault > 900:
            raise SystemExit(f"{node} still busy 900 s after the fault")
        time.sleep(0.1)
    free = time.monotonic() - fault

    def drained() -> RemediationStep | None:
        db.expire_all()
        return db.scalars(
            select(RemediationStep)
            .join(Remediation)
            .where(
                Remediation.node == node,
                RemediationStep.step == "slurm_drain",
                RemediationStep.finished_at.is_not(None),
            )
        ).first()

    row = wait_for(drained, 120, f"the drain of {node} to finish")
    return free, row.finished_at.timestamp() - fault_wall, checkpoint.exists()


def measure(release: str, cycles: int, save_s: float, drain_timeout: int, poll: float | None) -> None:
    nodes = 2 * cycles
    with slurm_cluster(nodes, release) as env, scratch_database() as pg_url, scratch_dir() as tmp:
        conf = Path(env["SLURM_CONF"])
        bin_dir = conf.parent / "bin"
        commands = (
            {c: str(bin_dir / c) for c in ("scontrol", "sinfo", "squeue", "scancel")}
            if bin_dir.is_dir()
            else {}
        )
        version = subprocess.run(
            [commands.get("scontrol", "scontrol"), "--version"],
            env=env,  # noqa: S603
            capture_output=True,
            text=True,
        ).stdout.strip()
        wf_poll = poll if poll is not None else WorkflowSettings().poll_interval_s
        slurm_poll = poll if poll is not None else SlurmSettings().poll_interval_s
        print(
            f"Slurm {version}: {cycles} faults per arm on busy nodes, the job saves in {save_s:g}s; "
            f"workflow.poll_interval_s={wf_poll:g}, slurm.poll_interval_s={slurm_poll:g}, "
            f"drain_timeout_s={drain_timeout}, on_jobs_timeout=requeue"
        )
        results: dict[str, list[tuple[float, float, bool]]] = {}
        for arm, signal in (("with the request (USR1)", "USR1"), ("without (shipped default)", "")):
            prefix = f"rembench-ckpt-{uuid.uuid4().hex[:6]}"
            extra = {
                "REMEDIATION_SLURM__BACKEND": "cli",
                "REMEDIATION_SLURM__SLURM_CONF": str(conf),
                "REMEDIATION_SLURM__POLL_INTERVAL_S": f"{slurm_poll:g}",
                **{f"REMEDIATION_SLURM__{c.upper()}": p for c, p in commands.items()},
                "REMEDIATION_KUBE__BACKEND": "none",
                "REMEDIATION_MACHINE__BACKEND": "none",
                "REMEDIATION_WORKFLOW__POLL_INTERVAL_S": f"{wf_poll:g}",
                "REMEDIATION_WORKFLOW__LEASE_S": "60",
                "REMEDIATION_WORKFLOW__SWEEP_INTERVAL_S": "30",
                "REMEDIATION_WORKFLOW__DRAIN_TIMEOUT_S": str(drain_timeout),
                "REMEDIATION_WORKFLOW__ON_JOBS_TIMEOUT": "requeue",
                "REMEDIATION_WORKFLOW__CHECKPOINT_SIGNAL": signal,
                "REMEDIATION_POLICY__BREAKER_MAX_FRACTION": "1.0",
                "REMEDIATION_POLICY__MAX_CONCURRENT": str(nodes),
                "PATH": env["PATH"],
            }
            wenv = worker_env(pg_url, REDIS_URL, prefix, tmp, **extra)
            wenv.pop("REMEDIATION_MEMORY__JOURNAL", None)
            worker = Worker(wenv, tmp, concurrency=2)
            watcher_log = open(tmp / f"watcher-{prefix}.log", "w")  # noqa: SIM115 - closed below
            watcher = subprocess.Popen(
                [sys.executable, "-m", "remediation.watchers.slurm.watcher"],
                cwd=ROOT,
                env=wenv,  # noqa: S603
                stdout=subprocess.DEVNULL,
                stderr=watcher_log,
            )
            engine = create_engine(pg_url, poolclass=NullPool)
            try:
                wait_for(worker.ready, 60, "the worker", worker)
                arm_nodes = [f"gpu-node-{i}" for i in (range(cycles) if signal else range(cycles, nodes))]
                with Session(engine) as db:
                    results[arm] = [
                        # inside the cluster directory: a chroot's slurmd (24.11, 26.05) sees it too
                        cycle(env, db, node, conf.parent / f"{prefix}-{node}", save_s)
                        for node in arm_nodes
                    ]
            finally:
                watcher.terminate()
                watcher.wait(15)
                watcher_log.close()
                worker.stop()
                engine.dispose()
                subprocess.run(
                    [
                        commands.get("scancel", "scancel"),
                        "--quiet",
                        "--full",
                        "-w",  # noqa: S603
                        ",".join(f"gpu-node-{i}" for i in range(nodes)),
                    ],
                    env=env,
                    capture_output=True,
                )
        for arm, rows in results.items():
            print(f"  {arm}:")
            print(summary("fault -> node free", [r[0] for r in rows]))
            print(summary("fault -> drain done", [r[1] for r in rows]))
            print(f"    checkpoint written          {sum(r[2] for r in rows)} of {len(rows)} jobs")
        with_rows, without_rows = results["with the request (USR1)"], results["without (shipped default)"]
        worst = max(r[0] for r in with_rows)
        print(
            "  "
            + goal(
                f"with the request, node free <= {save_s:g} s checkpoint + {SLACK_S:g} s",
                f"max {worst:.1f}s",
                worst <= save_s + SLACK_S,
            )
        )
        best_without = min(r[0] for r in without_rows)
        print(
            "  "
            + goal(
                "with the request, every job saved its work and every node was free sooner than any "
                "without it",
                f"{sum(r[2] for r in with_rows)}/{len(with_rows)} saved; max {worst:.1f}s "
                f"with vs min {best_without:.1f}s without",
                all(r[2] for r in with_rows) and worst < best_without,
            )
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=3, help="faults per arm (each on its own node)")
    ap.add_argument(
        "--save-s", type=float, default=5.0, help="how long the job takes to write its checkpoint"
    )
    ap.add_argument("--drain-timeout", type=int, default=60, help="workflow.drain_timeout_s (shipped: 3600)")
    ap.add_argument(
        "--poll",
        type=float,
        default=None,
        help="workflow and slurm poll intervals, seconds (default: the shipped ones)",
    )
    ap.add_argument("--releases", default=",".join(RELEASES))
    args = ap.parse_args()
    for release in args.releases.split(","):
        measure(release.strip(), args.cycles, args.save_s, args.drain_timeout, args.poll)


if __name__ == "__main__":
    main()
