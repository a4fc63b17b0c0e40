"""Detection latency: from ``scontrol update ... state=down`` to the event on the Redis stream.

On each real Slurm release (22.05, and 24.11 and 26.05 from the roots scripts/slurm-root.sh caches;
started here with scripts/slurm-up.sh, 16 nodes) the watcher runs with its default settings (cli backend,
the shipped poll interval) and publishes to a real Redis; one table per release. On 24.11 and 26.05 the
commands are the root's (chroot wrappers) and the libslurm change probe is off (this process cannot load
their libslurm), so every poll runs sinfo: the figure includes that. 50 nodes are set DOWN one
after another, at random gaps so the changes fall at random points of the poll cycle. The latency of
one change is the Redis stream id of its event (the server's clock, in ms) minus the time just before
``scontrol update`` started.

Baseline, on the same controller at the same time: a permanent ``strigger --node --down`` trigger
whose program appends the time and the node list to a file.

Run: .venv/bin/python -m bench.slurm_detect [--changes 50] [--poll SECONDS (default: slurm.poll_interval_s)]
     [--releases 22.05,24.11,26.05]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import threading
import time
import uuid
from pathlib import Path

import redis

from bench._cluster import RELEASES, slurm_cluster
from bench.common import tail
from remediation.adapters.bus import RedisEventBus
from remediation.adapters.slurm.cli import CliSlurm
from remediation.domain.events import EventKind, NodeEvent
from remediation.hostlist import expand
from remediation.settings import SlurmSettings, load_settings
from remediation.watchers.runtime import Stopper
from remediation.watchers.slurm import watcher as slurm_watcher

NODES = 16


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=50)
    ap.add_argument("--poll", type=float, default=SlurmSettings().poll_interval_s,
                    help="watcher poll interval, seconds (default: the shipped default)")
    ap.add_argument("--releases", default=",".join(RELEASES), help="Slurm releases to measure, in order")
    args = ap.parse_args()
    for release in args.releases.split(","):
        measure(release.strip(), args.changes, args.poll)


def measure(release: str, changes: int, poll: float) -> None:
    url = os.environ.get("REMEDIATION_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    client = redis.Redis.from_url(url)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    rng = random.Random(11)

    with slurm_cluster(NODES, release) as env:
        conf = env["SLURM_CONF"]
        tmp = Path(conf).parent / "strigger"  # inside the cluster directory: slurmctld sees it in a chroot too
        tmp.mkdir()
        bin_dir = Path(conf).parent / "bin"
        commands = {c: str(bin_dir / c) for c in ("scontrol", "sinfo", "squeue", "scancel")} if bin_dir.is_dir() else {}
        version = subprocess.run(["scontrol", "--version"], env=env, capture_output=True, text=True)  # noqa: S603,S607
        fired = Path(tmp) / "fired.log"
        program = Path(tmp) / "on-down.sh"
        program.write_text(f"#!/bin/sh\necho \"$(date +%s.%N) $*\" >> '{fired}'\n")
        program.chmod(0o755)
        subprocess.run(  # noqa: S603,S607
            ["strigger", "--set", "--node", "--down", "--flags=PERM", f"--program={program}"],
            env=env, check=True, capture_output=True,
        )

        settings = load_settings(
            broker={"redis_url": url, "key_prefix": prefix},
            slurm={"slurm_conf": conf, "poll_interval_s": poll, **commands},
        )
        stopper = Stopper(install=False)
        bus = RedisEventBus(client, prefix, kick=None)
        thread = threading.Thread(
            target=slurm_watcher.run, args=(settings, stopper, bus), kwargs={"slurm": CliSlurm(settings.slurm)},
            daemon=True,
        )
        thread.start()
        nodes = [f"gpu-node-{i}" for i in range(NODES)]
        stream = f"{prefix}:events:slurm"  # the Slurm watcher's own stream
        while client.xlen(stream) < NODES:
            time.sleep(0.1)

        def scontrol(*argv: str) -> None:
            subprocess.run(["scontrol", *argv], env=env, check=True, capture_output=True)  # noqa: S603,S607

        started: dict[str, tuple[str, float]] = {}  # reason -> (node, t0)
        busy_until: dict[str, float] = {}
        for i in range(changes):
            node = nodes[i % NODES]
            # Reuse a node only after the baseline had its chance to fire for its previous change.
            while time.time() < busy_until.get(node, 0):
                time.sleep(0.1)
            if i >= NODES:
                scontrol("update", f"nodename={node}", "state=resume")
                time.sleep(0.5)
            time.sleep(rng.uniform(0.2, 1.2))
            reason = f"bench {i}"
            t0 = time.time()
            scontrol("update", f"nodename={node}", "state=down", f"reason={reason}")
            started[reason] = (node, t0)
            busy_until[node] = t0 + 20
        deadline = time.time() + 25
        watcher_lat: dict[str, float] = {}
        while time.time() < deadline and len(watcher_lat) < len(started):
            for entry_id, fields in client.xrange(stream):
                event = NodeEvent.parse(fields[b"e"])
                if event.kind == EventKind.UNHEALTHY and event.state == "DOWN" and event.reason in started:
                    stamp = int(entry_id.split(b"-")[0]) / 1000
                    watcher_lat.setdefault(event.reason, stamp - started[event.reason][1])
            time.sleep(0.5)
        time.sleep(max(0.0, deadline - time.time()))  # the baseline gets its full chance too
        stopper.stop()
        thread.join(timeout=10)

        firings: list[tuple[float, set[str]]] = []
        for line in fired.read_text().splitlines() if fired.exists() else []:
            when, _, hosts = line.partition(" ")
            firings.append((float(when), set(expand(hosts.strip())) if hosts.strip() else set()))
        trigger_lat = []
        for node, t0 in started.values():
            hits = [when for when, hosts in firings if when >= t0 and node in hosts]
            if hits:
                trigger_lat.append(min(hits) - t0)
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)

    w = list(watcher_lat.values())
    print(f"{changes} state changes (state=down) on a real {version.stdout.strip()}, {NODES} nodes; "
          f"watcher poll {poll:g}s")
    # A p99 needs 200 samples; with fewer, the tail column is the maximum and says so.
    print(f"{'':26}{'p50':>8}{'p99/max':>16}{'max':>8}{'seen':>8}")
    print(f"{'watcher -> Redis stream':26}{pct(w, 0.5):8.3f}{tail(w, '{:.3f}'):>16}{max(w):8.3f}{len(w):5}/{changes}")
    if trigger_lat:
        t = trigger_lat
        print(f"{'strigger --down baseline':26}{pct(t, 0.5):8.3f}{tail(t, '{:.3f}'):>16}{max(t):8.3f}"
              f"{len(t):5}/{changes}")
    else:
        print(f"{'strigger --down baseline':26}   never fired within 20 s of any change")


if __name__ == "__main__":
    main()
