"""Redis and Postgres failover: what is lost, what is done twice, how long recovery takes.

    .venv/bin/python -m bench.failover [--full] [pytest args...]

Runs ``tests/reliability/test_failover_{redis,leader,postgres}.py`` (the same tests CI runs), which start their own servers:
a Redis primary, a replica and three sentinels (Debian's redis-sentinel), and a Postgres primary with a
synchronous streaming replica made by ``pg_basebackup``. It prints the reliability table's rows for
those scenarios and a verdict for each of the failover goals: no event lost, no machine action done
twice, every remediation complete, and no event a replaced leader published recorded. Recovery times
are measured, not goals: they are printed with what they measure (kill or promotion to caught up).
"""

from __future__ import annotations

import re
import sys

from bench.common import goal
from bench.reliability import run

SUITE = [f"tests/reliability/test_failover_{part}.py" for part in ("redis", "leader", "postgres")]
STALE = re.compile(r"(\d+) event\(s\) published under the replaced leadership, (\d+) of them recorded")


def main() -> int:
    args = sys.argv[1:]
    full = "--full" in args
    code, rows = run(SUITE, [a for a in args if a != "--full"], full, "Failover")
    if not rows:
        return code or 1
    lost = sum(r["lost_events"] or 0 for r in rows)
    dups = sum(r["duplicate_actions"] or 0 for r in rows)
    passed = all(r["passed"] == r["runs"] and not r["problems"] for r in rows)
    stale = [m for r in rows for note in r["notes"] if (m := STALE.search(note))]
    recorded_stale = sum(int(m[2]) for m in stale)
    print()
    print(goal("0 events lost across the failovers", f"{lost} lost", lost == 0))
    print(goal("0 machine actions done twice", f"{dups} repeated", dups == 0))
    print(
        goal(
            "every remediation completes (every scenario passed)",
            f"{sum(r['passed'] for r in rows)}/{sum(r['runs'] for r in rows)} runs",
            passed,
        )
    )
    print(
        goal(
            "0 events of a replaced leader recorded",
            f"{recorded_stale} of {sum(int(m[1]) for m in stale)} published",
            bool(stale) and recorded_stale == 0,
        )
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
