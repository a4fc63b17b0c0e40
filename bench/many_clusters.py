"""One service, many clusters: ten 1,000-node clusters on one Redis, one Postgres and one worker.

Ten real Slurm 22.05 controllers (``--clusters``, each with ``--nodes`` CLOUD nodes: the controller's side
of a cluster, no slurmd), a ``remediation watch slurm`` process per cluster (``cluster.name`` set), and
one ``remediation worker -c 2 -B`` whose config lists every cluster under ``clusters:`` (each entry with
its own ``slurm.slurm_conf``, Kubernetes and machine ``none``: Slurm only), on a scratch Postgres database
and Redis.

- **detection, one cluster alone**: only the first cluster's watcher runs (the other controllers idle);
  ``--changes`` nodes are set DOWN, at random gaps. Then every watcher runs, and ``--changes`` nodes of
  each cluster are set DOWN, the clusters interleaved. A change's detection is its event's
  ``published_at`` as recorded in the events table (the watcher's clock) minus the instant just before
  ``scontrol update`` ran.
- **a fault beside a storm** (``--tries``): ``--storm`` nodes of cluster A fail in one ``scontrol
  update``; a random 0.3-1.0 s later one node of cluster B fails. B's fault is drained when its
  ``slurm_drain`` step is recorded done (``finished_at``), read from the database; a try waits for B's
  drain and all of A's before the next starts. A turns through the clusters, B is another each time.

Goals: each cluster's detection p50 within 1.5x of the one cluster alone; B's fault drained within 2 s
of its fault, p90 of the tries (a fault not drained within ``--wait`` counts as never).

    .venv/bin/python -m bench.many_clusters [--clusters 10] [--nodes 1000] [--storm 375] [--tries 20]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import redis
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from bench.common import REDIS_URL, goal, percentile, scratch_database, tail
from bench.slurm_watch_10k import controller
from remediation.db.models import Event, Node, Remediation, RemediationStep

DETECT_RATIO = 1.5  # a cluster's detection p50 at most this many times the one cluster alone's
DRAIN_S = 2.0  # B's fault drained within this, at the p90 of the tries
FIRST_FAULT_NODE = 100  # nodes below are the detection changes', then B's faults, then the storms'
FIRST_STORM_NODE = 200


def cluster_name(i: int) -> str:
    return f"c{i}"


def node(i: int) -> str:
    return f"gpu-node-{i}"


# ------------------------------------------------------------------------------------- statistics


def detection_ratios(alone: Sequence[float], fleet: dict[str, list[float]]) -> dict[str, float]:
    """Each cluster's detection p50 over the p50 of the one cluster alone."""
    base = percentile(list(alone), 50)
    return {name: percentile(values, 50) / base if values and base > 0 else math.inf
            for name, values in fleet.items()}  # fmt: skip


def detection_goal(alone: Sequence[float], fleet: dict[str, list[float]], changes: int) -> tuple[str, bool]:
    """The measured figures and whether every cluster's p50 is within :data:`DETECT_RATIO` of alone's,
    every change having been seen (one never seen fails the goal)."""
    ratios = detection_ratios(alone, fleet)
    worst = max(ratios, key=lambda n: ratios[n])
    seen = sum(len(v) for v in fleet.values())
    expected = changes * len(fleet)
    measured = (f"alone p50 {percentile(list(alone), 50):.3f} s; worst {worst} p50 "
                f"{percentile(fleet[worst], 50) if fleet[worst] else math.inf:.3f} s, x{ratios[worst]:.2f}; "
                f"{seen}/{expected} seen, {len(alone)}/{changes} alone")  # fmt: skip
    ok = all(r <= DETECT_RATIO for r in ratios.values()) and seen == expected and len(alone) == changes
    return measured, ok


def drain_goal(latencies: Sequence[float | None]) -> tuple[str, bool]:
    """B's fault to drained, p90 of the tries (None: not drained in time, counted as never)."""
    values = [math.inf if v is None else v for v in latencies]
    p90 = percentile(values, 90)
    done = sum(v is not None for v in latencies)
    top = max(values) if values else math.nan
    measured = f"p90 {p90:.2f} s, max {top:.2f} s, {done}/{len(values)} drained"
    return measured, bool(values) and p90 <= DRAIN_S


# ------------------------------------------------------------------------------------------ the fleet


@dataclass
class Fleet:
    envs: list[dict[str, str]]  # each controller's environment (SLURM_CONF)
    env: dict[str, str]  # the service's processes'
    db: Engine
    logs: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, label: str, argv: list[str], **extra: str) -> None:
        with open(self.logs / f"{label}.log", "wb") as log:
            self.procs.append(subprocess.Popen(argv, env={**self.env, **extra}, stdout=log, stderr=log))  # noqa: S603

    def watch(self, i: int) -> None:
        self.start(
            f"watch-{cluster_name(i)}", [*CLI, "watch", "slurm"], REMEDIATION_CLUSTER__NAME=cluster_name(i)
        )

    def wait(self, what: str, check: Callable[[], bool], timeout: float) -> bool:
        """Poll ``check`` (the database, other processes' work) until true; a dead process stops the run."""
        deadline = time.monotonic() + timeout
        while not check():
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead:
                tails = "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}"
                                  for f in self.logs.glob("*.log"))  # fmt: skip
                raise SystemExit(f"no {what}: exited {dead}\n{tails}")
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def scalar(self, stmt: object) -> object:
        with Session(self.db) as s:
            return s.scalar(stmt)  # type: ignore[call-overload]

    def fail(self, i: int, nodes: str, state: str, reason: str) -> float:
        """Set ``nodes`` of cluster ``i`` to ``state``; returns the instant just before ``scontrol``."""
        at = time.time()
        subprocess.run(["scontrol", "update", f"nodename={nodes}", f"state={state}", f"reason={reason}"],  # noqa: S603,S607
                       env=self.envs[i], check=True, capture_output=True)  # fmt: skip
        return at


CLI = [sys.executable, "-m", "remediation.cli"]


def config(path: Path, envs: list[dict[str, str]]) -> None:
    """The workers' config: one ``clusters:`` entry per controller (JSON is YAML)."""
    entry = {"kube": {"backend": "none"}, "machine": {"backend": "none"}}
    path.write_text(json.dumps({
        "kube": {"backend": "none"}, "machine": {"backend": "none"},
        "clusters": [{"name": cluster_name(i), "slurm": {"backend": "cli", "slurm_conf": env["SLURM_CONF"]}, **entry}
                     for i, env in enumerate(envs)],
    }))  # fmt: skip


@contextmanager
def fleet(clusters: int, nodes: int, logs: Path | None) -> Iterator[Fleet]:
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"bench-fleet-{uuid.uuid4().hex[:8]}"
    level = "INFO" if logs else "WARNING"
    with ExitStack() as stack:
        envs = [stack.enter_context(controller(nodes))[0] for _ in range(clusters)]
        logs = logs or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rembench-fleet-")))
        logs.mkdir(parents=True, exist_ok=True)
        config(logs / "config.yaml", envs)
        pg_url = stack.enter_context(scratch_database())
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REMEDIATION_", "SLURM_"))} | {
            "REMEDIATION_CONFIG": str(logs / "config.yaml"), "REMEDIATION_DATABASE__URL": pg_url,
            "REMEDIATION_BROKER__REDIS_URL": REDIS_URL, "REMEDIATION_BROKER__KEY_PREFIX": prefix,
            "REMEDIATION_LOG_LEVEL": level,
        }  # fmt: skip
        db = create_engine(pg_url, poolclass=NullPool)
        run = Fleet(envs, env, db, logs)
        run.start(
            "worker",
            [
                *CLI,
                "worker",
                "-c",
                "2",
                "-B",
                "-s",
                str(logs / "beat-schedule"),
                "--without-gossip",
                "--without-mingle",
                "-n",
                f"bench{uuid.uuid4().hex[:6]}@%h",
            ],
        )
        try:
            yield run
        finally:
            for p in run.procs:
                p.terminate()
            for p in run.procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
            db.dispose()
            keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
            if keys:
                client.delete(*keys)


# ------------------------------------------------------------------------------------------ the phases


def known(run: Fleet, cluster: str | None = None) -> int:
    where = [Node.cluster == cluster] if cluster else []
    return int(run.scalar(select(func.count()).select_from(Node).where(*where)) or 0)  # type: ignore[call-overload]


def detected(run: Fleet, started: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """(cluster, reason) -> seconds from the change to its first event's ``published_at``."""
    with Session(run.db) as s:
        rows = s.execute(select(Event.cluster, Event.reason, func.min(Event.published_at))
                         .where(Event.reason.in_({r for _, r in started}))
                         .group_by(Event.cluster, Event.reason)).all()  # fmt: skip
    return {(c, r): at.timestamp() - started[(c, r)] for c, r, at in rows if (c, r) in started and at}


def detect(
    run: Fleet, clusters: list[int], changes: int, rng: random.Random, *, tag: str, first: int
) -> dict[str, list[float]]:
    """``changes`` nodes of each cluster, from ``first`` on, set DOWN, interleaved at random gaps; each
    one's detection."""
    started: dict[tuple[str, str], float] = {}
    for k in range(changes):
        for i in rng.sample(clusters, len(clusters)):
            time.sleep(rng.uniform(0.2, 0.6) / len(clusters))
            reason = f"bench {tag} {k}"
            started[(cluster_name(i), reason)] = run.fail(i, node(first + k), "down", reason)
    run.wait("every change's event", lambda: len(detected(run, started)) == len(started), 30)
    seen = detected(run, started)
    out: dict[str, list[float]] = {cluster_name(i): [] for i in clusters}
    for (c, _), latency in seen.items():
        out[c].append(latency)
    return out


@dataclass
class Try:
    storm: str  # cluster A
    fault: str  # cluster B
    offset: float  # B's fault, seconds after A's storm
    stages: dict[str, float | None]  # B's fault: seconds from it to each stage
    storm_drained: list[float]  # A's nodes: seconds from the storm to drained


def steps_done(
    run: Fleet, cluster: str, nodes: Sequence[str], step: str = "slurm_drain"
) -> dict[str, datetime]:
    with Session(run.db) as s:
        rows = s.execute(select(Remediation.node, RemediationStep.finished_at)
                         .join(Remediation, Remediation.id == RemediationStep.remediation_id)
                         .where(Remediation.cluster == cluster, Remediation.node.in_(nodes),
                                RemediationStep.step == step, RemediationStep.status == "done")).all()  # fmt: skip
    return {n: at for n, at in rows if at is not None}


def fault_stages(run: Fleet, cluster: str, name: str, at: float) -> dict[str, float | None]:
    """B's fault: its event published and received, its remediation opened, its drain started and done."""
    with Session(run.db) as s:
        ev = s.execute(
            select(func.min(Event.published_at), func.min(Event.received_at)).where(
                Event.cluster == cluster, Event.node == name, Event.kind == "unhealthy"
            )
        ).one()
        rem = s.execute(
            select(Remediation.id, Remediation.opened_at).where(
                Remediation.cluster == cluster, Remediation.node == name
            )
        ).first()
        step = s.execute(select(RemediationStep.started_at, RemediationStep.finished_at)
                         .where(RemediationStep.remediation_id == rem[0], RemediationStep.step == "slurm_drain",
                                RemediationStep.status == "done")).first() if rem else None  # fmt: skip

    def since(when: datetime | None) -> float | None:
        return None if when is None else when.timestamp() - at

    return {
        "published": since(ev[0]),
        "received": since(ev[1]),
        "opened": since(rem[1] if rem else None),
        "drain started": since(step[0] if step else None),
        "drained": since(step[1] if step else None),
    }


def storm_try(run: Fleet, k: int, *, clusters: int, storm: int, rng: random.Random, wait: float) -> Try:
    a = k % clusters
    b = (a + 1 + k % (clusters - 1)) % clusters
    first = FIRST_STORM_NODE + (k // clusters) * storm
    names = [node(n) for n in range(first, first + storm)]
    fault = node(FIRST_FAULT_NODE + k)
    storm_at = run.fail(a, f"gpu-node-[{first}-{first + storm - 1}]", "fail", f"bench storm {k}")
    time.sleep(max(0.0, storm_at + rng.uniform(0.3, 1.0) - time.time()))
    fault_at = run.fail(b, fault, "fail", f"bench fault {k}")
    run.wait("B's drain", lambda: bool(steps_done(run, cluster_name(b), [fault])), wait)
    run.wait("A's drains", lambda: len(steps_done(run, cluster_name(a), names)) >= storm, 120)
    drained = steps_done(run, cluster_name(a), names)
    return Try(cluster_name(a), cluster_name(b), fault_at - storm_at, fault_stages(run, cluster_name(b), fault, fault_at),
               sorted(at.timestamp() - storm_at for at in drained.values()))  # fmt: skip


# ------------------------------------------------------------------------------------------ report


def fmt(v: float | None) -> str:
    return "   never" if v is None else f"{v:8.2f}"


def report_detection(alone: list[float], fleet_lat: dict[str, list[float]], changes: int) -> None:
    print(
        f"\ndetection: scontrol update -> event published by the watcher, seconds ({changes} changes per cluster)"
    )
    print(f"  {'':24}{'n':>5}{'p50':>8}{'p90':>8}{'max':>8}{'x alone':>9}")
    print(f"  {'one cluster alone':24}{len(alone):5d}{percentile(alone, 50):8.3f}{percentile(alone, 90):8.3f}"
          f"{max(alone):8.3f}")  # fmt: skip
    ratios = detection_ratios(alone, fleet_lat)
    for name, values in fleet_lat.items():
        if values:
            print(f"  {name + ', all running':24}{len(values):5d}{percentile(values, 50):8.3f}"
                  f"{percentile(values, 90):8.3f}{max(values):8.3f}{ratios[name]:9.2f}")  # fmt: skip
        else:
            print(f"  {name + ', all running':24}    0")
    every = [v for values in fleet_lat.values() for v in values]
    if every:
        print(f"  {'every cluster together':24}{len(every):5d}{percentile(every, 50):8.3f}"
              f"{percentile(every, 90):8.3f}{max(every):8.3f}   ({tail(every, '{:.3f}', ' s')})")  # fmt: skip
    measured, ok = detection_goal(alone, fleet_lat, changes)
    print(f"  {goal(f'each cluster detection p50 <= {DETECT_RATIO}x one cluster alone', measured, ok)}")


def report_tries(tries: list[Try], storm: int) -> None:
    print(f"\na fault in cluster B while {storm} nodes of cluster A fail at once: seconds from B's fault")
    print(f"  {'try':>4} {'A':>4} {'B':>4}{'B after A':>10}{'published':>10}{'received':>9}{'opened':>8}"
          f"{'drain go':>9}{'drained':>8}{'A drained p50':>14}{'A max':>7}")  # fmt: skip
    for k, t in enumerate(tries):
        s = t.stages
        print(f"  {k:4d} {t.storm:>4} {t.fault:>4}{t.offset:10.2f}{fmt(s['published']):>10}{fmt(s['received']):>9}"
              f"{fmt(s['opened']):>8}{fmt(s['drain started']):>9}{fmt(s['drained']):>8}"
              f"{percentile(t.storm_drained, 50):14.2f}{max(t.storm_drained, default=math.nan):7.2f}")  # fmt: skip
    stage_names = list(tries[0].stages) if tries else []
    for stage in stage_names:
        values = [t.stages[stage] for t in tries]
        got = [v for v in values if v is not None]
        if got:
            print(f"  B {stage:14} p50 {percentile(got, 50):6.2f}  p90 {percentile(got, 90):6.2f}  "
                  f"max {max(got):6.2f}  ({len(got)}/{len(values)})")  # fmt: skip
    storm_all = [v for t in tries for v in t.storm_drained]
    if storm_all:
        print(f"  A's {len(storm_all)} storm nodes, storm to drained: p50 {percentile(storm_all, 50):.2f} s, "
              f"p90 {percentile(storm_all, 90):.2f} s, {tail(storm_all, '{:.2f}', ' s')}")  # fmt: skip
    measured, ok = drain_goal([t.stages["drained"] for t in tries])
    print(
        f"  {goal(f'B drained <= {DRAIN_S:.0f} s beside a {storm}-node storm, p90 of {len(tries)}', measured, ok)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clusters", type=int, default=10)
    ap.add_argument("--nodes", type=int, default=1000, help="nodes per cluster")
    ap.add_argument("--changes", type=int, default=20, help="detection changes per cluster")
    ap.add_argument("--storm", type=int, default=375, help="nodes of cluster A failed at once")
    ap.add_argument("--tries", type=int, default=20, help="storms, each with one fault in another cluster")
    ap.add_argument("--wait", type=float, default=30.0, help="seconds a try waits for B's drain")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--logs", type=Path, help="keep the processes' logs (at INFO) in this directory")
    args = ap.parse_args()
    if FIRST_STORM_NODE + math.ceil(args.tries / args.clusters) * args.storm > args.nodes or 2 * args.changes > FIRST_FAULT_NODE \
            or args.tries > FIRST_STORM_NODE - FIRST_FAULT_NODE or args.clusters < 2:  # fmt: skip
        ap.error("the storms, faults and changes need distinct nodes: fewer tries or changes, or more nodes")
    rng = random.Random(args.seed)
    print(f"{args.clusters} clusters of {args.nodes} nodes (real slurmctld 22.05 each, CLOUD nodes), a slurm watcher "
          f"per cluster, one worker -c 2 -B serving all (clusters: {args.clusters} entries); one Redis, one "
          f"Postgres; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start")  # fmt: skip
    started = time.monotonic()
    with fleet(args.clusters, args.nodes, args.logs) as run:
        run.watch(0)
        if not run.wait(
            "the first cluster's inventory", lambda: known(run, cluster_name(0)) >= args.nodes, 180
        ):
            raise SystemExit("the first watcher's inventory did not arrive within 180 s")
        alone = detect(run, [0], args.changes, rng, tag="alone", first=0)[cluster_name(0)]
        for i in range(1, args.clusters):
            run.watch(i)
        if not run.wait("every cluster's inventory", lambda: known(run) >= args.clusters * args.nodes, 300):
            raise SystemExit("the inventories did not arrive within 300 s")
        load_detect = os.getloadavg()[0]
        fleet_lat = detect(
            run, list(range(args.clusters)), args.changes, rng, tag="fleet", first=args.changes
        )
        report_detection(alone, fleet_lat, args.changes)
        load_storm = os.getloadavg()[0]
        tries = [storm_try(run, k, clusters=args.clusters, storm=args.storm, rng=rng, wait=args.wait)
                 for k in range(args.tries)]  # fmt: skip
        report_tries(tries, args.storm)
        print(f"\nload average {load_detect:.2f} before the fleet's detection, {load_storm:.2f} before the storms, "
              f"{os.getloadavg()[0]:.2f} at the end; {time.monotonic() - started:.0f} s in all")  # fmt: skip


if __name__ == "__main__":
    main()
