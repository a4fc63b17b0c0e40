"""The reliability report at fleet scale: how long the Reliability page and ``remediation reliability``
take on a large history.

    python -m bench.reliability_report [--nodes 10000] [--faults 30000] [--days 30] [--repeats 5]

A scratch Postgres database (migrated to head) is filled in bulk with ``--nodes`` nodes (each with a
pool, a rack and a zone, as the watchers report them), ``--faults`` remediations spread over ``--days``
(most succeeded, some quarantined, a few open) and, for each, the two hardware sightings of its machine
action (before and after; one fault in five moves its node to another host). Then the report of the
whole window is computed ``--repeats`` times (:func:`remediation.services.reliability.reliability`), and
rendered as the standalone HTML and as CSV. Last, ``remediation reliability --since Nd -o csv`` runs as
the process a user starts, ``--repeats`` times. The goals: the page's figures within 10 s, so that
on-call opening the Reliability page of a 10,000-node fleet's month is not kept waiting; the command's
median within 5 s.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import insert

from bench.common import goal, scratch_database, scratch_dir, tail
from remediation.db.models import HardwareSighting, Node, NodeDomain, Remediation
from remediation.db.session import make_engine, make_session_factory
from remediation.reports.reliability import standalone_html, to_csv
from remediation.services.reliability import reliability
from remediation.settings import DatabaseSettings, LemonSettings

CLASSES = ("gpu-memory", "gpu-hardware", "host", "nvlink", "software", None)
GOAL_S = 10.0
CLI_GOAL_S = 5.0


def cli_runs(url: str, days: int, repeats: int, out: str) -> list[float]:
    """Wall seconds of each ``remediation reliability`` run, a process started as a user starts it."""
    env = {**os.environ, "REMEDIATION_DATABASE__URL": url}
    argv = [sys.executable, "-m", "remediation.cli", "reliability", "--since", f"{days}d", "-o", "csv", "--file", out]
    took = []
    for _ in range(repeats):
        t0 = time.monotonic()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        took.append(time.monotonic() - t0)
    return took


def fill(url: str, nodes: int, faults: int, days: int, until: datetime, seed: int = 7) -> None:
    rng = random.Random(seed)
    start = until - timedelta(days=days)
    names = [f"gpu-node-{i}" for i in range(nodes)]
    engine = make_engine(DatabaseSettings(url=url))
    with engine.begin() as conn:
        conn.execute(
            insert(Node),
            [
                {
                    "name": n,
                    "status": "healthy",
                    "status_reason": "",
                    "first_seen_at": start,
                    "updated_at": start,
                }
                for n in names
            ],
        )
        conn.execute(insert(NodeDomain), [
            {"node": n, "source": "kubernetes", "kind": kind, "name": value, "updated_at": start}
            for i, n in enumerate(names) for kind, value in (
                ("cloud.google.com/gke-nodepool", f"pool-{i % 4}"),
                ("cloud.google.com/gce-topology-subblock", f"sb-{i // 16}"),
                ("topology.kubernetes.io/zone", f"zone-{i % 3}"))])  # fmt: skip
        host = {n: 0 for n in names}
        rems, sights = [], []
        still_open: set[str] = set()
        for rid in range(1, faults + 1):
            node = rng.choice(names)
            opened = start + timedelta(seconds=rng.uniform(0, days * 86400 - 7200))
            status = rng.choices(("succeeded", "quarantined", "waiting"), (90, 8, 2))[0]
            if status == "waiting" and node in still_open:
                status = "succeeded"  # one open remediation per node
            if status == "waiting":
                still_open.add(node)
            closed = None if status == "waiting" else opened + timedelta(seconds=rng.uniform(600, 7200))
            rems.append(
                {
                    "id": rid,
                    "node": node,
                    "cause": "bench",
                    "source": "slurm",
                    "status": status,
                    "step": "done",
                    "ladder": 0,
                    "opened_at": opened,
                    "updated_at": closed or opened,
                    "closed_at": closed,
                    "context": {},
                    "dry_run": False,
                    "fault_class": rng.choice(CLASSES),
                }
            )
            moved = rng.random() < 0.2
            for after in (False, True):
                if after and moved:
                    host[node] += 1
                sights.append(
                    {
                        "node": node,
                        "at": opened + timedelta(seconds=60 if after else 30),
                        "remediation_id": rid,
                        "step": "vm_restart",
                        "action": ("stop_start" if moved else "restart") if after else None,
                        "provider": "gce",
                        "instance_id": f"i-{node}",
                        "host": f"/{node}/h{host[node]}",
                        "sku": "a3-highgpu-8g",
                        "gpus": [],
                        "dry_run": False,
                    }
                )
        conn.execute(insert(Remediation), rems)
        conn.execute(insert(HardwareSighting), sights)
    engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--faults", type=int, default=30_000)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    until = datetime.now(UTC).replace(microsecond=0)
    with scratch_database() as url:
        t0 = time.monotonic()
        fill(url, args.nodes, args.faults, args.days, until)
        print(
            f"history: {args.nodes} nodes, {args.faults} faults over {args.days} days, "
            f"{2 * args.faults} hardware sightings (filled in {time.monotonic() - t0:.1f}s)"
        )
        sessions = make_session_factory(make_engine(DatabaseSettings(url=url)))
        took, cpu = [], []
        for _ in range(args.repeats):
            t0, c0 = time.monotonic(), time.process_time()
            with sessions() as s:
                rep = reliability(s, until - timedelta(days=args.days), until, lemon=LemonSettings())
            took.append(time.monotonic() - t0)
            cpu.append(time.process_time() - c0)
        t0 = time.monotonic()
        html = standalone_html(rep, until)
        html_s = time.monotonic() - t0
        t0 = time.monotonic()
        csv_text = to_csv(rep)
        csv_s = time.monotonic() - t0
        with scratch_dir() as tmp:
            cli = cli_runs(url, args.days, args.repeats, str(tmp / "reliability.csv"))
    print(
        f"figures (reliability()): {tail(took, unit=' s')} over {len(took)} runs, median "
        f"{sorted(took)[len(took) // 2]:.2f} s wall; this process's CPU: median {sorted(cpu)[len(cpu) // 2]:.2f} s "
        f"(the rest is Postgres, and other load on the machine: load average {os.getloadavg()[0]:.1f})"
    )
    print(
        f"standalone HTML: {len(html) / 1e6:.1f} MB in {html_s:.2f} s; CSV: {len(csv_text) / 1e6:.1f} MB, "
        f"{csv_text.count(chr(10))} rows in {csv_s:.2f} s"
    )
    print(
        f"moves found: {len(rep.moves)}; hardware rows: {len(rep.hardware)}; groups by pool: "
        f"{len(rep.trends['pool'].groups)}, by rack: {len(rep.trends['rack'].groups)}"
    )
    worst = max(took) + html_s
    print(f"remediation reliability --since {args.days}d -o csv, a process: {tail(cli, unit=' s')} over {len(cli)} runs")
    print(
        goal(
            f"figures and HTML of a {args.days}-day window within {GOAL_S:.0f} s",
            f"max {worst:.2f} s",
            worst <= GOAL_S,
        )
    )
    median = sorted(cli)[len(cli) // 2]
    print(goal(f"the command's median within {CLI_GOAL_S:.0f} s", f"median {median:.2f} s", median <= CLI_GOAL_S))


if __name__ == "__main__":
    main()
