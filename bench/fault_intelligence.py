"""Fault intelligence rehearsed: the default policy against deploy/policies/naive-ladder.yaml, side by side.

    python -m bench.fault_intelligence [--nodes 2048] [--seeds 1 2 3 4 5] [--truth FILE ...] [--jobs 2]

For every (outcome model, seed) the Llama 3 mix is synthesised once (with causes and leaf groups) and
replayed through ``remediation rehearse``'s engine under both policies, each run in its own process.
Every figure is what the rehearsal's world counted (VM actions that fixed nothing, node-hours out,
faults fixed automatically, VM actions and quarantines on fabric faults, incidents, pages); the goals are
checked on the totals over the seeds and printed beside them. The shipped outcome model is an
assumption, so the same comparison can be run on the other models in remediation/data/truth-*.yaml.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from bench.common import verdict

ROOT = Path(__file__).resolve().parents[1]
MIX = ROOT / "remediation" / "data" / "llama3-405b-interruptions.csv"
NAIVE = ROOT / "deploy" / "policies" / "naive-ladder.yaml"
FIGURES = ("vm_actions_total", "wasted_vm_actions", "node_hours_out", "auto_fixed", "quarantined",
           "fabric_vm_actions", "fabric_quarantines", "incidents", "pages")


def one(truth: str, seed: int, nodes: int, days: float, policy: str) -> dict[str, Any]:
    """One rehearsal in this (child) process: figures of ``policy`` ("default" or "naive")."""
    for key in [k for k in os.environ if k.startswith("REMEDIATION_")]:
        del os.environ[key]  # the shipped defaults, not the caller's environment
    from remediation.rehearsal.run import Layout, Pace, rehearse
    from remediation.rehearsal.trace import Scale, load
    from remediation.rehearsal.truth import parse_model
    from remediation.settings import Settings, overlay

    model = parse_model(truth, yaml.safe_load(Path(truth).read_text()))
    faults = load(MIX, Scale(nodes=nodes, days=days, start=datetime(2026, 1, 1, tzinfo=UTC), seed=seed),
                  model=model)
    names = [f"gpu-node-{i}" for i in range(nodes)]
    settings = Settings() if policy == "default" else overlay(Settings(), NAIVE)
    t0 = time.monotonic()
    report = rehearse(faults, settings, names, pace=Pace(reboot_s=600, repair_s=4 * 3600),
                      layout=Layout(leaf_size=16)).as_dict()
    report["quarantined"] = len(report["quarantined"])
    return {"truth": Path(truth).name, "seed": seed, "policy": policy, "wall_s": time.monotonic() - t0,
            "faults": report["faults"], **{k: report[k] for k in FIGURES}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--days", type=float, default=54.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--truth", nargs="+", default=[str(ROOT / "remediation" / "data" / "truth-llama3.yaml")])
    ap.add_argument("--jobs", type=int, default=2, help="rehearsals run at once (one per core)")
    args = ap.parse_args()
    print(f"{args.nodes} nodes x {args.days:g} days, Llama 3 mix, seeds {args.seeds}, load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    runs = [(t, s, p) for t in args.truth for s in args.seeds for p in ("default", "naive")]
    t0 = time.monotonic()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(one, t, s, args.nodes, args.days, p) for t, s, p in runs]
        rows = []
        for f in futures:
            r = f.result()
            rows.append(r)
            print(f"  {r['truth']:<28} seed {r['seed']} {r['policy']:<7} {r['wall_s']:6.1f}s  faults {r['faults']:5}  "
                  + "  ".join(f"{k}={r[k]:.0f}" if isinstance(r[k], float) else f"{k}={r[k]}" for k in FIGURES),
                  flush=True)
    for truth in sorted({r["truth"] for r in rows}):
        tot = {p: {k: sum(r[k] for r in rows if r["truth"] == truth and r["policy"] == p) for k in FIGURES}
               for p in ("default", "naive")}
        d, n = tot["default"], tot["naive"]
        print(f"\n{truth}: totals over {len(args.seeds)} seed(s)")
        print(f"  {'figure':<20} {'default':>10} {'naive':>10} {'ratio':>7}")
        for k in FIGURES:
            ratio = f"{d[k] / n[k]:.2f}" if n[k] else "-"
            print(f"  {k:<20} {d[k]:>10.0f} {n[k]:>10.0f} {ratio:>7}")
        goals = [
            ("fabric faults: 0 VM actions", d["fabric_vm_actions"] == 0),
            ("fabric faults: 0 quarantines", d["fabric_quarantines"] == 0),
            ("wasted_vm_actions <= 25% of baseline", d["wasted_vm_actions"] <= 0.25 * n["wasted_vm_actions"]),
            ("node_hours_out <= 70% of baseline", d["node_hours_out"] <= 0.70 * n["node_hours_out"]),
            ("auto_fixed >= baseline", d["auto_fixed"] >= n["auto_fixed"]),
        ]
        for name, ok in goals:
            print(f"  goal {name}: {verdict(ok)}")
    print(f"\nwall time {time.monotonic() - t0:.0f}s for {len(runs)} rehearsals ({args.jobs} at once)")


if __name__ == "__main__":
    main()
