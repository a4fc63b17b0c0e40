"""Mass failure: hundreds of nodes fail in the same second; how fast are all of them out of the
scheduler's hands (drained in Slurm by us and cordoned in Kubernetes)?

The whole system as a user runs it, each part its own process: a real Slurm 22.05 slurmctld with
``--pool`` nodes (CLOUD nodes, no slurmd: the controller's side of the cluster), the local
kube-apiserver (:mod:`remediation.simulator.kube.api`, in a child process) with a Node of the same name for each,
providerID ``gce://``, the Compute Engine fake for the VM actions, a scratch Postgres database, Redis,
``remediation watch slurm``, ``remediation watch kube`` and ``remediation worker -c 2 -B`` with the
shipped policy (storm breaker included), and a Slack-compatible receiver for the pages.

For each size in ``--sizes``, on a fresh system: once every node is known (the watchers' first
inventory, counted in the nodes table), one ``scontrol update nodename=<hostlist> state=fail`` fails
that many nodes, as a rack's power or a spine switch would. Each node's times are read from what
happened: its UNHEALTHY event's id on the Redis stream (the Redis server's clock at XADD), its
remediation's ``opened_at``, and the ``finished_at`` of its ``slurm_drain`` and ``k8s_cordon`` steps,
each minus the instant just before ``scontrol update`` ran. At the end the endpoints are asked: how
many of the failed nodes Slurm shows drained or failed, how many Nodes the apiserver shows
unschedulable, how many VM actions the cloud fake took, and how many pages the receiver got (one more
notification pass is run first, so a page still in the outbox is counted).

Then, in the same run, the Slurm watcher's detection at 10,000 nodes (``bench.slurm_watch_10k``'s
delta reads: detection p50 and p99 over 200 changes, its CPU quiet and busy), so that a change that
speeds one up at the other's cost shows.

Goal (issue: mass failure at fleet speed): at 375 nodes, fault to drained and cordoned P90 <= 10 s and
max <= 20 s; meanwhile the breaker latches, no VM action runs and one page goes out.

    .venv/bin/python -m bench.mass_failure [--pool 1500] [--sizes 150,375]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from bench import slurm_watch_10k as watch_10k
from bench.common import REDIS_URL, goal, percentile, scratch_database
from bench.slurm_watch_10k import controller
from remediation.db.models import AuditLog, Event, Node, Remediation, RemediationStep
from remediation.domain.events import EventKind
from remediation.services.notify import run_pass
from remediation.settings import NotifySettings, PolicySettings
from remediation.simulator.gce_api import GceFake
from remediation.simulator.kube.api import KubeAPIServer

GOAL_P90_S, GOAL_MAX_S = 10.0, 20.0
PROJECT, ZONE = "hpc-prod", "us-central1-a"
OUT = "out of the scheduler's hands"


def name(i: int) -> str:
    return f"gpu-node-{i}"


# ---------------------------------------------------------------------------------- the endpoints


def _serve_kube(count: int, conn: Connection) -> None:
    """Child process: the apiserver with a Node per Slurm node; answers "unschedulable" until "stop"."""
    api = KubeAPIServer()
    api.start()
    for i in range(count):
        api.add_node(name(i), provider_id=f"gce://{PROJECT}/{ZONE}/{name(i)}")
    conn.send((api.url, api.token, str(api.ca_file)))
    while conn.recv() == "unschedulable":
        conn.send(sorted(n for n, obj in api.store.nodes.items() if obj["spec"].get("unschedulable")))
    api.stop()


@contextmanager
def kube_server(count: int) -> Iterator[tuple[Connection, str, str, str]]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve_kube, args=(count, child), daemon=True)
    proc.start()
    try:
        if not parent.poll(120):
            raise SystemExit("the kube-apiserver did not start within 120 s")
        yield (parent, *parent.recv())
    finally:
        parent.send("stop")
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()


class Receiver:
    """A Slack-compatible webhook that keeps every message POSTed to it."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        texts = self.texts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                texts.append(
                    str(json.loads(self.rfile.read(int(self.headers["Content-Length"]))).get("text", ""))
                )
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T0/B0/bench"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


# ---------------------------------------------------------------------------------------- a run


def trips(size: int, pool: int) -> bool:
    """Whether ``size`` failed nodes of ``pool`` are more than the shipped storm breaker lets by."""
    return size > pool * PolicySettings().breaker_max_fraction


@dataclass
class Run:
    size: int
    pool: int
    stages: dict[str, list[float]]  # seconds from the fault, per node that reached the stage
    slurm_out: int  # failed nodes Slurm shows drained or failed
    cordoned: int  # failed nodes the apiserver shows unschedulable
    vm_actions: int
    breaker_latched: bool
    pages: list[str]
    load: tuple[float, float]  # 1-minute load average before and after


def _processes(env: dict[str, str], log_dir: Path) -> list[subprocess.Popen[bytes]]:
    cli = [sys.executable, "-m", "remediation.cli"]
    argvs = {
        "watch-slurm": [*cli, "watch", "slurm"],
        "watch-kube": [*cli, "watch", "kube"],
        "worker": [*cli, "worker", "-c", "2", "-B", "-s", str(log_dir / "beat-schedule"), "--without-gossip",
                   "--without-mingle", "-n", f"bench{uuid.uuid4().hex[:6]}@%h"],
    }  # fmt: skip
    procs = []
    for label, argv in argvs.items():
        with open(log_dir / f"{label}.log", "wb") as log:
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=log))  # noqa: S603 - our CLI
    return procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def _wait(what: str, check: Any, timeout: float, procs: list[subprocess.Popen[bytes]], logs: Path) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        dead = [p.args for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            tails = "\n".join(
                f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}" for f in logs.glob("*.log")
            )
            raise SystemExit(f"no {what} ({'exited: ' + str(dead) if dead else 'timed out'})\n{tails}")
        time.sleep(0.2)  # polling the database and the endpoints of other processes


def measure(pool: int, size: int, seed: int, keep_logs: Path | None = None) -> Run:
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"bench-mass-{uuid.uuid4().hex[:8]}"
    receiver = Receiver()
    with ExitStack() as stack:
        logs = keep_logs or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rembench-mass-")))
        logs.mkdir(parents=True, exist_ok=True)
        slurm_env, _ = stack.enter_context(controller(pool))
        kube, url, token, ca_file = stack.enter_context(kube_server(pool))
        gce = stack.enter_context(GceFake(op_seconds=0.05, wait_seconds=0.2))
        for i in range(pool):
            gce.add_instance(PROJECT, ZONE, name(i))
        pg_url = stack.enter_context(scratch_database())
        env = {k: v for k, v in slurm_env.items() if not k.startswith("REMEDIATION_")} | {
            "REMEDIATION_DATABASE__URL": pg_url,
            "REMEDIATION_BROKER__REDIS_URL": REDIS_URL, "REMEDIATION_BROKER__KEY_PREFIX": prefix,
            "REMEDIATION_SLURM__BACKEND": "cli", "REMEDIATION_SLURM__SLURM_CONF": slurm_env["SLURM_CONF"],
            "REMEDIATION_KUBE__BACKEND": "kubernetes", "REMEDIATION_KUBE__HOST": url,
            "REMEDIATION_KUBE__TOKEN": token, "REMEDIATION_KUBE__CA_FILE": ca_file, "REMEDIATION_KUBE__MAPPING": "node",
            "REMEDIATION_MACHINE__BACKEND": "gce", "REMEDIATION_MACHINE__GCE_ENDPOINT": gce.url,
            "REMEDIATION_MACHINE__GCE_ANONYMOUS": "true",
            "REMEDIATION_NOTIFY__WEBHOOK_URL": receiver.url, "REMEDIATION_LOG_LEVEL": "INFO" if keep_logs else "WARNING",
        }  # fmt: skip
        db = create_engine(pg_url, poolclass=NullPool)
        procs = _processes(env, logs)
        try:

            def count(model: Any, *where: Any) -> int:
                with Session(db) as s:
                    return int(s.scalar(select(func.count()).select_from(model).where(*where)) or 0)

            _wait("inventory of every node", lambda: count(Node) >= pool, 180, procs, logs)
            failed = sorted(random.Random(seed).sample(range(pool), size))
            hostlist = f"gpu-node-[{','.join(map(str, failed))}]"
            load_before = os.getloadavg()[0]
            fault_at = time.time()
            subprocess.run(  # noqa: S603,S607 - fixed argv
                ["scontrol", "update", f"nodename={hostlist}", "state=fail", "reason=rack PDU lost power"],
                env=slurm_env,
                check=True,
                capture_output=True,
            )
            names = {name(i) for i in failed}

            def done(step: str) -> int:
                return count(RemediationStep, RemediationStep.step == step, RemediationStep.status == "done")

            _wait("drain and cordon of every failed node", lambda: min(done("slurm_drain"), done("k8s_cordon")) >= size,
                  300, procs, logs)  # fmt: skip
            if trips(size, pool):
                _wait("the breaker's latch", lambda: count(AuditLog, AuditLog.action == "breaker_open") >= 1, 60,
                      procs, logs)  # fmt: skip
            load_after = os.getloadavg()[0]
        finally:
            _stop(procs)
        run_pass(sessionmaker(db), NotifySettings(webhook_url=receiver.url))  # what the outbox still holds
        stages = _stages(db, names, fault_at)
        kube.send("unschedulable")
        cordoned = len(names & set(kube.recv()))
        out = subprocess.run(  # noqa: S603,S607
            ["sinfo", "-h", "-N", "-t", "drain,fail,draining,drained", "-o", "%N"],
            env=slurm_env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        vm_actions = len(gce.acted)  # every reset, stop or start that acted, on any instance
        latched = bool(count(AuditLog, AuditLog.action == "breaker_open")) and not count(
            AuditLog, AuditLog.action == "breaker_closed"
        )
        db.dispose()
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    receiver.server.shutdown()
    return Run(size, pool, stages, len(names & set(out)), cordoned, vm_actions, latched, receiver.texts,
               (load_before, load_after))  # fmt: skip


def _stages(db: Any, names: set[str], fault_at: float) -> dict[str, list[float]]:
    """Each failed node's first UNHEALTHY event (published by the watcher, received by ingest), its
    remediation's opening and its drain and cordon steps (started, done), in seconds from the fault."""
    with Session(db) as s:
        events = s.execute(
            select(Event.node, func.min(Event.published_at), func.min(Event.received_at))
            .where(Event.node.in_(names), Event.kind == EventKind.UNHEALTHY.value)
            .group_by(Event.node)
        ).all()
        opened = dict(
            s.execute(
                select(Remediation.node, Remediation.opened_at).where(Remediation.node.in_(names))
            ).all()
        )
        steps = s.execute(
            select(
                Remediation.node,
                RemediationStep.step,
                RemediationStep.started_at,
                RemediationStep.finished_at,
            )
            .join(Remediation, Remediation.id == RemediationStep.remediation_id)
            .where(RemediationStep.status == "done", RemediationStep.step.in_(("slurm_drain", "k8s_cordon")))
        ).all()

    def since(at: datetime | None) -> float:
        return float("nan") if at is None else at.timestamp() - fault_at

    drained = {node: since(done) for node, step, _, done in steps if step == "slurm_drain"}
    cordoned = {node: since(done) for node, step, _, done in steps if step == "k8s_cordon"}
    out = {n: max(drained[n], cordoned[n]) for n in names if n in drained and n in cordoned}
    return {
        "published by the watcher": [since(p) for _, p, _ in events if p is not None],
        "received by ingest": [since(r) for _, _, r in events],
        "remediation opened": [since(at) for at in opened.values()],
        "drain started": [since(a) for _, step, a, _ in steps if step == "slurm_drain"],
        "drained": list(drained.values()),
        "cordon started": [since(a) for _, step, a, _ in steps if step == "k8s_cordon"],
        "cordoned": list(cordoned.values()),
        OUT: list(out.values()),
    }


# ------------------------------------------------------------------------------------------ report


def report(run: Run) -> None:
    print(f"\n{run.size} nodes failed in one `scontrol update` (load average {run.load[0]:.2f} before, "
          f"{run.load[1]:.2f} at the end)")  # fmt: skip
    print(f"  {'seconds from the fault':34}{'nodes':>7}{'first':>8}{'P50':>8}{'P90':>8}{'max':>8}")
    for stage, values in run.stages.items():
        if not values:
            print(f"  {stage:34}{0:7d}")
            continue
        print(f"  {stage:34}{len(values):7d}{min(values):8.1f}{percentile(values, 50):8.1f}"
              f"{percentile(values, 90):8.1f}{max(values):8.1f}")  # fmt: skip
    print(f"  endpoints: Slurm shows {run.slurm_out}/{run.size} drained or failed, the apiserver "
          f"{run.cordoned}/{run.size} unschedulable; VM actions at the cloud: {run.vm_actions}")  # fmt: skip
    opened = [t for t in run.pages if "OPEN" in t]
    print(f"  storm breaker {'latched' if run.breaker_latched else 'NOT latched'}; pages: {len(run.pages)} "
          f"({len(opened)} breaker open)")  # fmt: skip
    out = run.stages[OUT]
    complete = len(out) == run.size
    p90, top = (percentile(out, 90), max(out)) if out else (float("nan"), float("nan"))
    if run.size >= 375:
        print(
            f"  {goal(f'P90 <= {GOAL_P90_S:.0f} s and max <= {GOAL_MAX_S:.0f} s at {run.size}', f'P90 {p90:.1f} s, max {top:.1f} s, {len(out)}/{run.size} done', complete and p90 <= GOAL_P90_S and top <= GOAL_MAX_S)}"
        )
    if not trips(run.size, run.pool):
        return  # at or under the shipped breaker's fraction: machine actions are the policy's to take
    print(
        f"  {goal('breaker latched, 0 VM actions, 1 page', f'latched {run.breaker_latched}, {run.vm_actions} VM actions, {len(run.pages)} pages', run.breaker_latched and run.vm_actions == 0 and len(run.pages) == 1)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", type=int, default=1500, help="Slurm nodes and Kubernetes Nodes")
    ap.add_argument("--sizes", default="150,375", help="nodes failed at once, one fresh system each")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--logs", type=Path, help="keep the processes' logs (at INFO) in this directory")
    ap.add_argument("--detect-nodes", type=int, default=10_000,
                    help="then the Slurm watcher's detection at this many nodes (bench.slurm_watch_10k, delta "
                         "reads), in the same run so a regression of either shows; 0 skips it")  # fmt: skip
    args = ap.parse_args()
    print(f"Mass failure on a real slurmctld and the local kube-apiserver, {args.pool} nodes, "
          f"{os.cpu_count()} CPUs; worker -c 2 -B, both watchers, shipped policy")  # fmt: skip
    for size in (int(s) for s in args.sizes.split(",")):
        report(measure(args.pool, size, args.seed, args.logs / str(size) if args.logs else None))
    if args.detect_nodes:
        detect = argparse.Namespace(
            nodes=args.detect_nodes, changes=200, quiet_s=30.0, busy_s=20.0, baseline_s=10.0
        )
        watch_10k.report(detect, [watch_10k.measure("delta", detect, redis.Redis.from_url(REDIS_URL))])


if __name__ == "__main__":
    main()
