"""The phantom-fault soak: continuous fault replay on 32 simulated nodes for 10 minutes.

    .venv/bin/python -m bench.phantom_soak [--nodes 32] [--minutes 10] [--seed 22]

The real ``remediation worker -c 2 -B``, ``remediation watch slurm`` and ``remediation watch kube``
against :class:`remediation.simulator.cluster.SimCluster` under :class:`remediation.simulator.continuous.ContinuousReplay`
(the Llama 3 interruption mix at its default pace, switch storms every 4 minutes), on real Postgres and
Redis (a scratch database and key prefix). Prints the faults injected (from the injector's log), the
remediations, the quarantines and how many of them are false: fewer than ``repeat_offender_count``
injected faults on that node up to its quarantine. Not run in CI (it takes 10 minutes); the
reliability suite runs the same code shortened (``tests/reliability/test_phantoms.py``).
"""

from __future__ import annotations

import json

from bench.common import soak_args, soak_in_scratch
from tests.reliability.phantoms import soak


def main() -> int:
    args = soak_args(__doc__.splitlines()[0], seed=22)
    r = soak_in_scratch(soak, args, word="soak")
    print(f"soak: {r.nodes} nodes, {r.duration_s / 60:g} min of continuous replay (seed {args.seed})")
    print(f"faults injected        {r.faults} on {r.faulted_nodes} nodes  {json.dumps(r.by_kind)}")
    print(f"remediations           {r.remediations} ({r.extra_remediations} beyond their node's faults)")
    print(f"quarantines            {r.quarantines}")
    print(f"false quarantines      {len(r.false_quarantines)}  {r.false_quarantines}")
    print(f"decisions              {json.dumps(r.decisions)}")
    print(f"open at the end        {r.open_at_end}")
    return 1 if r.false_quarantines else 0


if __name__ == "__main__":
    raise SystemExit(main())
