"""The gpu-reset rung rehearsed: node-hours out per fault class with and without it, side by side.

    python -m bench.gpu_reset [--nodes 2048] [--seeds 1 2 3] [--site bare-metal] [--truth FILE] [--jobs 2]

A rehearsal, not a measurement on hardware: for every seed the Llama 3 mix is synthesised once (with
causes and leaf groups) and replayed through ``remediation rehearse --gpu-reset``'s engine twice, each in
its own process: the shipped policy with jobs on the node (so the gpu-reset rung is planned) and the same
policy with the rung taken out (both run the GPU check after every action). The times come from the
outcome model (``times``: the GPU reset, and the site's reboot); whether a reset fixes a fault is its
``p_reset``. Every figure is what the rehearsal's world counted; the goals are checked on the totals
over the seeds and printed beside them.
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

from bench.common import goal

ROOT = Path(__file__).resolve().parents[1]
MIX = ROOT / "remediation" / "data" / "llama3-405b-interruptions.csv"
#: The classes whose shipped ladder starts with the reset (NVIDIA's RESET_GPU and reset workflows).
RESET_CLASSES = ("gpu-transient", "gpu-memory", "nvlink")


def one(truth: str, seed: int, nodes: int, days: float, site: str, reset: bool) -> dict[str, Any]:
    """One rehearsal in this (child) process, with or without the gpu-reset rung."""
    for key in [k for k in os.environ if k.startswith("REMEDIATION_")]:
        del os.environ[key]  # the shipped defaults, not the caller's environment
    from remediation.rehearsal.compare import with_reset, without_reset
    from remediation.rehearsal.run import Layout, Pace, rehearse
    from remediation.rehearsal.trace import Scale, load
    from remediation.rehearsal.truth import SITE_REBOOT, parse_model
    from remediation.settings import Settings

    model = parse_model(truth, yaml.safe_load(Path(truth).read_text()))
    faults = load(MIX, Scale(nodes=nodes, days=days, start=datetime(2026, 1, 1, tzinfo=UTC), seed=seed),
                  model=model)
    names = [f"gpu-node-{i}" for i in range(nodes)]
    settings = (with_reset if reset else without_reset)(Settings())
    t0 = time.monotonic()
    pace = Pace(reboot_s=model.minutes(SITE_REBOOT[site]) * 60, repair_s=4 * 3600,
                reset_s=model.minutes("gpu-reset") * 60)
    report = rehearse(faults, settings, names, pace=pace, layout=Layout(leaf_size=16))
    return {"seed": seed, "reset": reset, "wall_s": time.monotonic() - t0, "faults": report.faults,
            "by_class": report.node_hours_by_class, "total": report.node_hours_out,
            "resets": report.gpu_resets, "resets_fixed": report.gpu_resets_fixed,
            "quarantined": len(report.quarantined)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--days", type=float, default=54.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--site", choices=("cloud", "bare-metal"), default="bare-metal")
    ap.add_argument("--truth", default=str(ROOT / "remediation" / "data" / "truth-llama3.yaml"))
    ap.add_argument("--jobs", type=int, default=2, help="rehearsals run at once (one per core)")
    args = ap.parse_args()
    print(f"rehearsal: {args.nodes} nodes x {args.days:g} days, Llama 3 mix, {Path(args.truth).name}, "
          f"{args.site}, seeds {args.seeds}, load average {os.getloadavg()[0]:.1f}", flush=True)
    t0 = time.monotonic()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(one, args.truth, s, args.nodes, args.days, args.site, r)
                   for s in args.seeds for r in (True, False)]
        rows = [f.result() for f in futures]
    for r in rows:
        print(f"  seed {r['seed']} {'with' if r['reset'] else 'without':<7} gpu-reset {r['wall_s']:6.1f}s  "
              f"faults {r['faults']:5}  node-hours out {r['total']:7.1f}  resets {r['resets']} "
              f"(fixed {r['resets_fixed']})  quarantined {r['quarantined']}")
    tot = {flag: {} for flag in (True, False)}  # type: dict[bool, dict[str, float]]
    for r in rows:
        for cls, hours in r["by_class"].items():
            tot[r["reset"]][cls] = tot[r["reset"]].get(cls, 0.0) + hours
    on, off = tot[True], tot[False]
    print(f"\nnode-hours out per fault class, totals over {len(args.seeds)} seed(s)")
    print(f"  {'fault class':<15} {'with':>9} {'without':>9} {'ratio':>6}")
    for cls in sorted(set(on) | set(off)):
        a, b = on.get(cls, 0.0), off.get(cls, 0.0)
        print(f"  {cls:<15} {a:>9.1f} {b:>9.1f} {f'{a / b:.2f}' if b else '-':>6}")
    reset_on, reset_off = (sum(t.get(c, 0.0) for c in RESET_CLASSES) for t in (on, off))
    rest_on, rest_off = (sum(v for c, v in t.items() if c not in RESET_CLASSES) for t in (on, off))
    resets, fixed = sum(r["resets"] for r in rows), sum(r["resets_fixed"] for r in rows)
    print()
    print(goal("reset classes' node-hours out lower with the rung", f"{reset_on:.1f} vs {reset_off:.1f}",
               reset_on < reset_off))
    print(goal("other classes' node-hours out within 5% (the rung touches only reset classes)",
               f"{rest_on:.1f} vs {rest_off:.1f}", abs(rest_on - rest_off) <= 0.05 * max(rest_off, 1e-9)))
    print(goal("resets ran and some fixed their node", f"{fixed} of {resets}", resets > 0 and fixed > 0))
    print(f"\nwall time {time.monotonic() - t0:.0f}s for {len(rows)} rehearsals ({args.jobs} at once)")


if __name__ == "__main__":
    main()
