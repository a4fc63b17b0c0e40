"""Run the reliability and operator-trust suite and print its table.

    .venv/bin/python -m bench.reliability [--full] [pytest args...]

Runs ``tests/reliability`` against the real servers (the same tests CI runs, at CI scale unless
``--full``), collects the figures each scenario records and prints: scenario, runs, passed, lost events,
duplicate actions, recovery time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    args = sys.argv[1:]
    full = "--full" in args
    args = [a for a in args if a != "--full"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.jsonl"
        env = {**os.environ, "REMEDIATION_RELIABILITY_OUT": str(out),
               "REMEDIATION_RELIABILITY_SCALE": "full" if full else "ci"}
        code = subprocess.call([sys.executable, "-m", "pytest", "-q", "tests/reliability", *args], cwd=ROOT, env=env)
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    head = f"{'scenario':<44} {'runs':>5} {'passed':>6} {'lost events':>11} {'dup. actions':>12} {'recovery':>10}"
    print("\n" + head + "\n" + "-" * len(head))
    for r in rows:
        rec = "-" if r["recovery_s"] is None else f"{r['recovery_s']:.2f}s"
        print(f"{r['scenario']:<44} {r['runs']:>5} {r['passed']:>6} {r['lost_events']:>11} "
              f"{r['duplicate_actions']:>12} {rec:>10}")
        if r.get("notes"):
            print(f"    {r['notes']}")
    return code


if __name__ == "__main__":
    sys.exit(main())
