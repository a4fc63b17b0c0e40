"""The false-positive soak: how often the service acts on a node that had no fault.

    .venv/bin/python -m bench.false_positives [--nodes 32] [--minutes 10] [--seed 7]

The real ``remediation worker -c 2 -B``, ``remediation watch slurm`` and ``remediation watch kube``
against :class:`remediation.simulator.cluster.SimCluster`: half the nodes take the phantom soak's fault
replay, the other half only :data:`remediation.simulator.noise.NOISE_MIX` (application XIDs, short
Ready flaps, node-problem-detector conditions, maintenance drains, slurmd blips) while slurmctld stalls
every minute, on real Postgres and Redis (a scratch database and key prefix). Prints the signals and
faults injected (the injector's log), what the ingest decided for the noise, the false actions and
the rate with its 95% upper bound. Not run in CI (it takes 10 minutes); the reliability suite runs the
same code shortened (``tests/reliability/test_false_positives.py``).
"""

from __future__ import annotations

import json
import math

from bench.common import goal, soak_args, soak_in_scratch
from tests.reliability.false_positives import soak


def upper_95(k: int, n: int) -> tuple[float, str]:
    """The 95% upper bound of a rate seen ``k`` times in ``n``: the rule of three (3/n) when k is 0,
    else the upper end of the Wilson score interval."""
    if n == 0:
        return math.nan, "no signals"
    if k == 0:
        return 3 / n, "rule of three, 3/n"
    z, p = 1.96, k / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre + half) / (1 + z * z / n), "Wilson score"


def main() -> int:
    args = soak_args(__doc__.splitlines()[0], seed=7)
    r = soak_in_scratch(soak, args, word="fpsoak")
    false = len(r.false_remediations)
    bound, how = upper_95(false, r.signals)
    node_hours = len(r.noise_nodes) * r.duration_s / 3600
    print(f"soak: {r.nodes} nodes, {r.duration_s / 60:g} min (seed {args.seed}); {len(r.noise_nodes)} take only "
          f"noise ({node_hours:.2f} node-hours), the others {r.faults} real faults")
    print(f"noise signals          {r.signals}  {json.dumps(r.noise)} + {r.own_machine_actions} own machine actions")
    print(f"decided (noise nodes)  {json.dumps(r.reached)}; slurm reads failed in stalls: {r.stall_reads_failed}")
    print(f"barrier                {r.barrier_s:.1f} s from the last signal's end to the barrier's events decided")
    print(f"remediations           {r.remediations} (all on faulted nodes unless listed below)")
    print(f"false remediations     {false}  {r.false_remediations}")
    print(f"false actions          {r.false_actions} recorded; {r.sim_actions} seen by the cluster")
    print(f"open at the end        {r.open_at_end}")
    print(f"false-positive rate    {false}/{r.signals} = {false / max(1, r.signals):.4f}; "
          f"95% upper bound {bound:.4f} ({how})")
    print(goal("of 0 false actions", f"{false} false remediations, {r.false_actions} actions", false == 0
               and r.false_actions == 0 and r.sim_actions == 0))
    return 1 if false or r.false_actions or r.sim_actions else 0


if __name__ == "__main__":
    raise SystemExit(main())
