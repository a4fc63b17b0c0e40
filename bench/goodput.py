"""Goodput rehearsed: the jobs' ETTR under the shipped policy and under deploy/policies/naive-ladder.yaml.

    python -m bench.goodput [--nodes 2048] [--days 54] [--seeds 1 2 3 4 5] [--job-nodes 128] [--jobs 2]

For every seed the Llama 3 mix is synthesised once (with the shipped outcome model and leaf groups of
16) and replayed under both policies, each rehearsal in its own process, with the job model's defaults
(remediation.rehearsal.goodput.JobModel: jobs of 128 nodes, a checkpoint every hour, 10 minutes to
restart, 5% spares). Every figure is measured here: ETTR per seed (mean, min, max) and each cause's
share of the job-hours lost, summed over the seeds. The published marks are printed beside them: the
Llama 3 paper's "more than 90%" effective training time (one job on 16,384 GPUs, 54 days) and
ByteRobust's 97% ETTR (9,600 GPUs, three months); they are other fleets, jobs and causes, not goals.
The goal: the shipped policy's ETTR above the naive ladder's on every seed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import goal

ROOT = Path(__file__).resolve().parents[1]
MIX = ROOT / "remediation" / "data" / "llama3-405b-interruptions.csv"
NAIVE = ROOT / "deploy" / "policies" / "naive-ladder.yaml"
POLICIES = ("shipped", "naive")
#: Published ETTR marks, printed beside the figures (docs/rehearsal.md, "Goodput").
MARKS = (("Llama 3 405B (16,384 GPUs, 54 days)", 0.90, "more than"), ("ByteRobust (9,600 GPUs, 3 months)", 0.97, ""))


def one(seed: int, nodes: int, days: float, policy: str, job_nodes: int) -> dict[str, Any]:
    """One rehearsal in this (child) process: the goodput figures of ``policy``."""
    for key in [k for k in os.environ if k.startswith("REMEDIATION_")]:
        del os.environ[key]  # the shipped defaults, not the caller's environment
    from remediation.cli.simulate import outcome_model
    from remediation.rehearsal.goodput import JobModel
    from remediation.rehearsal.run import Layout, rehearse
    from remediation.rehearsal.trace import Scale, load
    from remediation.settings import Settings, overlay

    faults = load(MIX, Scale(nodes=nodes, days=days, start=datetime(2026, 1, 1, tzinfo=UTC), seed=seed),
                  model=outcome_model(None))
    names = [f"gpu-node-{i}" for i in range(nodes)]
    settings = Settings() if policy == "shipped" else overlay(Settings(), NAIVE)
    t0 = time.monotonic()
    report = rehearse(faults, settings, names, layout=Layout(leaf_size=16, jobs=JobModel(job_nodes=job_nodes))).as_dict()
    return {"seed": seed, "policy": policy, "wall_s": time.monotonic() - t0, "faults": report["faults"],
            "node_hours_out": report["node_hours_out"], **report["goodput"]}


def summary(rows: list[dict[str, Any]], policy: str) -> None:
    """ETTR mean/min/max over the seeds and each cause's share of the job-hours lost."""
    mine = [r for r in rows if r["policy"] == policy]
    ettr = [r["ettr"] for r in mine]
    lost = {c: sum(r["lost_hours_by_cause"][c] for r in mine) for c in mine[0]["lost_hours_by_cause"]}
    total = sum(lost.values())
    print(f"  {policy:<8} ETTR mean {statistics.mean(ettr):.4f}  min {min(ettr):.4f}  max {max(ettr):.4f}   "
          f"job-hours lost {total:.1f}, by cause: "
          + ", ".join(f"{c} {v / total:.1%}" if total else f"{c} -" for c, v in lost.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--days", type=float, default=54.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--job-nodes", type=int, default=128, help="nodes per training job (the job model's default)")
    ap.add_argument("--jobs", type=int, default=2, help="rehearsals run at once (one per core)")
    args = ap.parse_args()
    print(f"{args.nodes} nodes x {args.days:g} days, Llama 3 mix, seeds {args.seeds}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    t0 = time.monotonic()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(one, s, args.nodes, args.days, p, args.job_nodes) for s in args.seeds for p in POLICIES]
        rows = []
        for f in futures:
            r = f.result()
            if r["ettr"] is None:
                raise SystemExit(f"no job of {args.job_nodes} nodes fits {args.nodes} nodes with spares: --job-nodes")
            rows.append(r)
            print(f"  seed {r['seed']} {r['policy']:<8} {r['wall_s']:6.1f}s  faults {r['faults']:5}  "
                  f"ETTR {r['ettr']:.4f}  jobs {r['jobs']} x {r['job_nodes']} nodes, spares {r['spare_nodes']}  "
                  f"interruptions {r['interruptions']}  checkpoint saves {r['checkpoint_saves']}  "
                  f"false positives {r['false_positives']}  fewest free {r['fewest_free']}  "
                  f"quarantined {r['quarantined']}  node-hours out {r['node_hours_out']:.0f}", flush=True)
    print(f"\nover {len(args.seeds)} seed(s)")
    for policy in POLICIES:
        summary(rows, policy)
    for name, mark, how in MARKS:
        print(f"  published mark: {name}: {how + ' ' if how else ''}{mark:.0%} ETTR")
    by = {(r["seed"], r["policy"]): r["ettr"] for r in rows}
    above = [by[(s, "shipped")] > by[(s, "naive")] for s in args.seeds]
    print("  " + goal("shipped policy's ETTR above the naive ladder's on every seed",
                      f"{sum(above)} of {len(above)} seeds", all(above)))
    print(f"\nwall time {time.monotonic() - t0:.0f}s for {len(rows)} rehearsals ({args.jobs} at once)")


if __name__ == "__main__":
    main()
