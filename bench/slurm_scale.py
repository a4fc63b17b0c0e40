"""MICRO-BENCHMARK (one function, not the system): the sinfo --json parser and the snapshot diff at 10,000
nodes. The system's figures (a real 10,000-node slurmctld, the real watcher process, its Slurm commands
and the controller's side) are bench/slurm_watch_10k.py's; quote those, not these.

A real ``sinfo --json`` document is taken from a real Slurm 22.05 (started here with scripts/slurm-up.sh),
and its node object is cloned, text and all, into a 10,000-node document: the same schema, layout and
escaping as slurmctld prints them. Each simulated poll changes a few nodes the way a live cluster does
(load and memory figures from pings, now and then a drain); the parse + diff is timed in CPU time. This
is the ``slurm.read_strategy = sinfo_json`` path and the REST backend's parse.

Run: .venv/bin/python -m bench.slurm_scale [--nodes 10000] [--polls 30]
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import time

from bench._cluster import slurm_cluster
from remediation.adapters.slurm.diff import diff
from remediation.adapters.slurm.parse import NodesParser, parse_nodes_json

SEP = "\n    },\n    {\n"
OPEN = '\n  "nodes": [\n    {\n'
CLOSE = "\n    }\n  ]\n}"


def real_document() -> str:
    with slurm_cluster(2) as env:
        subprocess.run(  # noqa: S603
            ["scontrol", "update", "nodename=gpu-node-1", "state=drain", "reason=maintenance: PSU swap"],
            env=env, check=True,
        )
        return subprocess.run(["sinfo", "--json"], env=env, check=True, capture_output=True, text=True).stdout  # noqa: S603,S607


def clone(document: str, count: int) -> tuple[str, str, list[str]]:
    head, rest = document.split(OPEN, 1)
    body, tail = rest.rsplit(CLOSE, 1)
    template = body.split(SEP)[0]
    chunks = [template.replace('"name": "gpu-node-0"', f'"name": "gpu-node-{i}"') for i in range(count)]
    return head + OPEN, CLOSE + tail, chunks


def churn(chunks: list[str], rng: random.Random, loads: int, drains: int) -> None:
    for i in rng.sample(range(len(chunks)), loads):
        chunks[i] = re.sub(r'"cpu_load": \d+', f'"cpu_load": {rng.randint(0, 6400)}', chunks[i])
    for i in rng.sample(range(len(chunks)), drains):
        stamp = int(time.time()) + rng.randint(0, 10**6)
        chunks[i] = (
            chunks[i]
            .replace('"state_flags": [\n      ]', '"state_flags": [\n        "DRAIN"\n      ]')
            .replace('"reason": ""', f'"reason": "maintenance {stamp}"')
            .replace('"reason_changed_at": 0', f'"reason_changed_at": {stamp}')
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--polls", type=int, default=30)
    ap.add_argument("--changed", type=int, default=100, help="nodes whose load figures change per poll")
    args = ap.parse_args()
    rng = random.Random(7)

    real = real_document()
    head, tail, chunks = clone(real, args.nodes)
    text = head + SEP.join(chunks) + tail
    assert len(parse_nodes_json(text)) == args.nodes
    print("MICRO-BENCHMARK: parser and diff only (the system: bench.slurm_watch_10k)")
    print(f"document: {args.nodes} nodes, {len(text) / 1e6:.1f} MB, schema from real {real.count(chr(10))}-line sinfo")

    t = time.process_time()
    parse_nodes_json(text)
    print(f"plain json.loads + build, full document: {(time.process_time() - t) * 1000:.1f} ms CPU")

    parser = NodesParser()
    previous = parser.parse(text)
    bad = frozenset({"DOWN", "DRAIN", "FAIL", "NOT_RESPONDING"})
    costs = []
    for _ in range(args.polls):
        churn(chunks, rng, args.changed, 1)
        text = head + SEP.join(chunks) + tail
        t = time.process_time()
        current = parser.parse(text)
        changes = diff(previous, current, bad)
        costs.append((time.process_time() - t) * 1000)
        assert len(changes.unhealthy) <= 1
        previous = current
    costs.sort()
    print(
        f"parse+diff per poll ({args.changed} nodes with new load figures + 1 drain): "
        f"p50 {costs[len(costs) // 2]:.1f} ms, max {costs[-1]:.1f} ms CPU"
    )

    # Worst case: every node changed since the last poll.
    churn(chunks, rng, args.nodes, 0)
    text = head + SEP.join(chunks) + tail
    t = time.process_time()
    diff(previous, parser.parse(text), bad)
    print(f"parse+diff, every node changed: {(time.process_time() - t) * 1000:.1f} ms CPU")



if __name__ == "__main__":
    main()
