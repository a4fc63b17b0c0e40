"""Scale benchmark: the Slurm watcher's cost per poll at 10,000 nodes.

A real ``sinfo --json`` document is taken from a real Slurm 22.05 (started here with
scripts/slurm-up.sh), and its node object is cloned, text and all, into a 10,000-node document: the
same schema, the same layout and escaping as slurmctld prints them. Each simulated poll changes a few
nodes the way a live cluster does (load and memory figures from pings, now and then a drain), then
the watcher's parse + diff is timed in CPU time. Then the real watcher process (``python -m
watchers.slurm``, cli backend, real Redis) reads the generated document every second through a
stand-in ``sinfo`` that prints it, and its CPU per poll and RSS are read from /proc.

Run: .venv/bin/python -m bench.slurm_scale [--nodes 10000] [--polls 30]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

from bench._cluster import slurm_cluster
from remediation.slurm_json import NodesParser, diff, parse_nodes_json

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

    watcher_process(head, tail, chunks, rng, args)


def _cpu_ms(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def _status_kb(pid: int, key: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def watcher_process(head: str, tail: str, chunks: list[str], rng: random.Random, args: argparse.Namespace) -> None:
    """The real watcher process (python -m watchers.slurm) reading the generated document through its
    cli backend, publishing to a real Redis. ``sinfo`` is a two-line script printing the document."""
    url = os.environ.get("REMEDIATION_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url)
    with tempfile.TemporaryDirectory(prefix="slurm-scale-") as tmp:
        doc = Path(tmp) / "sinfo.json"
        sinfo = Path(tmp) / "sinfo"
        sinfo.write_text(f"#!/bin/sh\nexec cat '{doc}'\n")
        sinfo.chmod(0o755)

        def write() -> None:
            staged = doc.with_suffix(".tmp")
            staged.write_text(head + SEP.join(chunks) + tail)
            staged.replace(doc)

        write()
        env = dict(os.environ)
        env.update(
            REMEDIATION_BROKER__REDIS_URL=url,
            REMEDIATION_BROKER__KEY_PREFIX=prefix,
            REMEDIATION_SLURM__SINFO=str(sinfo),
            REMEDIATION_SLURM__POLL_INTERVAL_S="1.0",
            REMEDIATION_SLURM__RESYNC_INTERVAL_S="3600",
        )
        proc = subprocess.Popen([sys.executable, "-m", "watchers.slurm"], env=env, cwd=tmp)  # noqa: S603
        try:
            stream = f"{prefix}:events"
            deadline = time.monotonic() + 60
            while client.xlen(stream) < len(chunks):  # the first resync: one INVENTORY per node
                assert time.monotonic() < deadline and proc.poll() is None, "watcher did not start"
                time.sleep(0.2)
            time.sleep(1.5)
            before, started = _cpu_ms(proc.pid), time.monotonic()
            for _ in range(args.polls):
                churn(chunks, rng, args.changed, 1)
                write()
                time.sleep(1.0)
            elapsed = time.monotonic() - started
            cpu = _cpu_ms(proc.pid) - before
            polls = elapsed / 1.0
            print(
                f"watcher process, steady state: {cpu / polls:.1f} ms CPU per poll "
                f"({args.changed} load changes + 1 drain per poll; includes running sinfo and publishing)"
            )
            print(
                f"watcher process RSS: {_status_kb(proc.pid, 'VmRSS') / 1024:.0f} MB now, "
                f"{_status_kb(proc.pid, 'VmHWM') / 1024:.0f} MB peak"
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
            keys = list(client.scan_iter(match=f"{prefix}*"))
            if keys:
                client.delete(*keys)


if __name__ == "__main__":
    main()
