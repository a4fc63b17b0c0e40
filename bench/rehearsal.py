"""`remediation rehearse` at fleet scale: the event loop against the polling loop, and the issue's goals.

    python -m bench.rehearsal [--seed 3] [--skip-10k]

One run measures, each in its own child process (so that its peak RSS is its own, from getrusage):

1. 256 nodes x 54 days of the Llama 3 mix, default policy, through the original polling loop and through
   the event loop: wall time of each and the ratio (goal: >= 10x);
2. 2,048 nodes x 54 days (the paper's own cluster), event loop (goal: <= 25 s);
3. 10,000 nodes x 54 days, event loop (goals: <= 60 s, peak RSS <= 1 GB).

Every figure is measured here: wall time around ``rehearse`` in the child, workflow runs counted by the
loop, peak RSS from the kernel. The machine's load average is printed beside them, since a shared
machine slows every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import goal

MIX = Path(__file__).resolve().parents[1] / "remediation" / "data" / "llama3-405b-interruptions.csv"

CHILD = """
import json, resource, sys, time
from datetime import UTC, datetime
from pathlib import Path
from remediation.cli.simulate import outcome_model
from remediation.rehearsal.run import Layout, Pace, rehearse
from remediation.rehearsal.trace import Scale, load
from remediation.settings import Settings
mix, nodes, days, seed, loop = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
# What `remediation rehearse` runs: the shipped outcome model, nodes in leaf groups of 16.
faults = load(Path(mix), Scale(nodes=nodes, days=days, start=datetime(2026, 1, 1, tzinfo=UTC), seed=seed,
                              leaf_size=16), model=outcome_model(None))
names = sorted({f.event.node for f in faults} | {f"gpu-node-{i}" for i in range(nodes)})
t0 = time.monotonic()
r = rehearse(faults, Settings(), names, pace=Pace(loop=loop), layout=Layout(leaf_size=16))
print(json.dumps({"wall_s": time.monotonic() - t0, "runs": r.runs, "faults": r.faults,
                  "outcomes": r.outcomes, "vm_actions": sum(r.vm_actions.values()),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(nodes: int, loop: str, seed: int, days: float = 54.0) -> dict[str, object]:
    """Run one rehearsal in a child; its figures, with the child's own peak RSS in MB (getrusage)."""
    proc = subprocess.run([sys.executable, "-c", CHILD, str(MIX), str(nodes), str(days), str(seed), loop],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise SystemExit(f"{nodes} nodes ({loop}) failed: {proc.stderr.strip()[-2000:]}")
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def row(fleet: str, loop: str, r: dict[str, object], note: str = "") -> None:
    print(f"{fleet:<14} {loop:<8} {r['faults']:>6} {r['runs']:>8} {r['vm_actions']:>7} "
          f"{float(r['wall_s']):>8.1f} {float(r['rss_mb']):>11.0f}  {note}", flush=True)  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--skip-10k", action="store_true", help="leave out the 10,000-node run")
    args = ap.parse_args()
    t0 = time.monotonic()
    print(f"rehearsal of the Llama 3 mix, default policy, seed {args.seed}; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f} at start")
    print(f"{'fleet':<14} {'loop':<8} {'faults':>6} {'runs':>8} {'VM acts':>7} {'wall s':>8} {'peak RSS MB':>11}  note",
          flush=True)
    old = measure(256, "polling", args.seed)
    row("256 x 54 d", "polling", old)
    new = measure(256, "events", args.seed)
    ratio = float(old["wall_s"]) / float(new["wall_s"])  # type: ignore[arg-type]
    row("256 x 54 d", "events", new, goal(">= 10x faster", f"{ratio:.1f}x", ratio >= 10))
    big = measure(2048, "events", args.seed)
    wall = float(big["wall_s"])  # type: ignore[arg-type]
    row("2,048 x 54 d", "events", big, goal("<= 25 s", f"{wall:.1f} s", wall <= 25))
    if not args.skip_10k:
        huge = measure(10_000, "events", args.seed)
        ok = float(huge["wall_s"]) <= 60 and float(huge["rss_mb"]) <= 1024  # type: ignore[arg-type]
        row("10,000 x 54 d", "events", huge,
            goal("<= 60 s, <= 1024 MB", f"{float(huge['wall_s']):.1f} s, {float(huge['rss_mb']):.0f} MB", ok))  # type: ignore[arg-type]
    print(f"{time.monotonic() - t0:.0f} s in all; load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
