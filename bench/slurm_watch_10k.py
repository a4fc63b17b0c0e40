"""The Slurm watcher at 10,000 real nodes: detection, CPU, memory, and what slurmctld pays for it.

A real Slurm 22.05 controller with ``--nodes`` CLOUD nodes (powered down, visible, no slurmd: the
controller's side of a 10,000-node cluster, started in seconds) and the real watcher as its own process
(``remediation watch slurm``, the shipped settings) publishing to Redis. Each read strategy gets
a fresh controller and three phases:

- **quiet** (``--quiet-s``): nothing changes. Watcher CPU (its process tree: its own time plus every
  Slurm command it ran), slurmctld CPU above its idle baseline, slurmctld's RPC counts from ``sdiag``.
- **detection** (``--changes`` drains at random moments): latency from just before ``scontrol update``
  to the event's ``observed_at`` on the stream (a p99 needs 200 samples; fewer print "max").
- **busy** (``--busy-s``): 100 node changes a second (a 50-node hostlist drained or resumed every
  0.5 s); watcher CPU.

Peak memory is sampled every 50 ms over the whole run: the watcher plus its live child commands, as PSS
(a child between fork and exec shares the watcher's pages; plain RSS would count them twice).

    .venv/bin/python -m bench.slurm_watch_10k [--nodes 1000,10000] [--changes 200] [--strategies delta,sinfo_json]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import redis

from bench.common import REDIS_URL, percentile, tail
from remediation.domain.events import EventKind, NodeEvent
from remediation.settings import SlurmSettings
from tests.ports import lease

TICK = os.sysconf("SC_CLK_TCK")
CONF = """ClusterName=bench10k
SlurmctldHost=localhost
SlurmctldPort={port}
SlurmUser=root
AuthType=auth/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmctldLogFile={d}/slurmctld.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SlurmdTimeout=300
ReturnToService=1
MailProg=/bin/true
SuspendProgram=/bin/true
ResumeProgram=/bin/true
SuspendTime=600
PrivateData=cloud
NodeName=gpu-node-[0-{last}] NodeHostname=localhost NodeAddr=127.0.0.1 Port=19000 CPUs=64 RealMemory=512000 State=CLOUD
PartitionName=gpu Nodes=gpu-node-[0-{last}] Default=YES MaxTime=INFINITE State=UP
"""


def cpu_s(pid: int, children: bool = True) -> float:
    """CPU seconds of a process, plus (by default) of every child it has waited for."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12]) + ((int(fields[13]) + int(fields[14])) if children else 0)
    return ticks / TICK


def tree_pss_mb(pid: int) -> tuple[float, dict[str, float]]:
    """Memory of the watcher and its live children, as PSS (a child between fork and exec shares the
    parent's pages, which plain RSS would count twice, so such a child is skipped): the total, and each process by command."""
    parts: dict[str, float] = {}
    todo = [pid]
    own = Path(f"/proc/{pid}/comm").read_text().strip()
    while todo:
        p = todo.pop()
        try:
            comm = Path(f"/proc/{p}/comm").read_text().strip()
            rollup = Path(f"/proc/{p}/smaps_rollup").read_text()
            if p != pid and (comm == own or Path(f"/proc/{p}/comm").read_text().strip() != comm):
                continue  # forked, not yet exec'd: still the watcher's own memory (vfork shares it)
            name = comm + ("" if p == pid else f":{p}")
            parts[name] = int(re.search(r"Pss:\s+(\d+)", rollup).group(1)) / 1024  # type: ignore[union-attr]
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, AttributeError):
            continue
    return sum(parts.values()), parts


@contextmanager
def controller(nodes: int) -> Iterator[tuple[dict[str, str], int]]:
    d = Path(tempfile.mkdtemp(prefix="slurm-10k-"))
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    conf = d / "slurm.conf"
    with lease() as ctld:  # held until slurmctld has shut down
        conf.write_text(CONF.format(port=ctld.port, d=d, last=nodes - 1))
        env = {**os.environ, "SLURM_CONF": str(conf)}
        if subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:
            Path("/run/munge").mkdir(exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
            _until(lambda: subprocess.run(["munge", "-n"], capture_output=True).returncode == 0, "munged")
        subprocess.run(["slurmctld", "-f", str(conf)], env=env, check=True)
        try:
            deadline = time.monotonic() + 60
            while subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True).stdout.count("UP") < 1:
                assert time.monotonic() < deadline, (d / "slurmctld.log").read_text()[-2000:]
                time.sleep(0.3)
            yield env, int((d / "slurmctld.pid").read_text())
        finally:
            subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
            pid_file = d / "slurmctld.pid"
            if pid_file.exists():  # the lease ends once slurmctld has let its port go
                pid = int(pid_file.read_text())
                _until(lambda: not _running(pid), "slurmctld to exit")
            shutil.rmtree(d, ignore_errors=True)


def _running(pid: int) -> bool:
    """The process runs (a zombie waiting for its parent to reap it holds no port)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _until(done: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll ``done`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.1)


def sdiag_rpcs(env: dict[str, str]) -> dict[str, int]:
    text = subprocess.run(["sdiag"], env=env, capture_output=True, text=True, check=True).stdout
    section = text.split("Remote Procedure Call statistics by message type", 1)[1].split("statistics by user")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"(REQUEST_\w+)\s+\(\s*\d+\)\s+count:(\d+)", section)}


class Sampler(threading.Thread):
    """Peak RSS of the watcher and its live children, sampled every 50 ms, and the phase it came in."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop, self.phase, self.peak_phase = pid, 0.0, threading.Event(), "start", ""
        self.peak_parts = ""
        self.loads: list[float] = []  # the 1-minute load average, once a second: the machine is shared

    def run(self) -> None:
        ticks = 0
        while not self.stop.wait(0.05):
            ticks += 1
            if ticks % 20 == 0:
                self.loads.append(os.getloadavg()[0])
            total, parts = tree_pss_mb(self.pid)
            if total > self.peak:
                self.peak, self.peak_phase = total, self.phase
                self.peak_parts = ", ".join(f"{k.split(':')[0]} {v:.0f}MB" for k, v in parts.items())


def measure(strategy: str, args: argparse.Namespace, client: redis.Redis) -> dict[str, object]:
    prefix = f"bench10k-{uuid.uuid4().hex[:8]}"
    stream = f"{prefix}:events:slurm"  # the Slurm watcher's own stream
    with controller(args.nodes) as (env, ctld):
        base0, t0 = cpu_s(ctld, False), time.monotonic()
        time.sleep(args.baseline_s)
        ctld_idle = (cpu_s(ctld, False) - base0) / (time.monotonic() - t0)
        wenv = {**env, "REMEDIATION_SLURM__SLURM_CONF": env["SLURM_CONF"], "REMEDIATION_SLURM__READ_STRATEGY": strategy,
                "REMEDIATION_BROKER__REDIS_URL": REDIS_URL, "REMEDIATION_BROKER__KEY_PREFIX": prefix,
                "REMEDIATION_LOG_LEVEL": "WARNING"}
        watcher = subprocess.Popen([sys.executable, "-c", "from remediation.cli.main import main; main()", "watch", "slurm"],
                                   env=wenv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        sampler = Sampler(watcher.pid)
        sampler.start()
        try:
            deadline = time.monotonic() + 120
            while client.xlen(stream) < args.nodes:  # the first resync: one inventory event per node
                assert watcher.poll() is None and time.monotonic() < deadline, "watcher did not resync"
                time.sleep(0.2)
            time.sleep(2)  # past the resync's own cost: the quiet phase measures steady polling
            sampler.phase = "quiet"
            subprocess.run(["sdiag", "--reset"], env=env, check=True, capture_output=True)
            w0, c0, t0 = cpu_s(watcher.pid), cpu_s(ctld, False), time.monotonic()
            time.sleep(args.quiet_s)
            span = time.monotonic() - t0
            quiet_cpu = (cpu_s(watcher.pid) - w0) / span
            ctld_cpu = (cpu_s(ctld, False) - c0) / span - ctld_idle
            rpcs = {k: v for k, v in sdiag_rpcs(env).items() if v}

            sampler.phase = "detection"
            rng = random.Random(5)
            started: dict[str, float] = {}
            names = rng.sample(range(args.nodes), args.changes)
            for i, n in enumerate(names):
                time.sleep(rng.uniform(0.05, 0.55))
                reason = f"bench {i}"
                started[reason] = time.time()
                subprocess.run(["scontrol", "update", f"nodename=gpu-node-{n}", "state=drain", f"reason={reason}"],
                               env=env, check=True)
            latencies: dict[str, float] = {}
            deadline = time.monotonic() + 30
            while len(latencies) < len(started) and time.monotonic() < deadline:
                for _id, fields in client.xrange(stream):
                    ev = NodeEvent.parse(fields[b"e"])
                    if ev.kind is EventKind.UNHEALTHY and ev.reason in started and ev.reason not in latencies:
                        latencies[ev.reason] = ev.observed_at.timestamp() - started[ev.reason]
                time.sleep(0.5)

            sampler.phase = "busy"
            w0, t0, flip = cpu_s(watcher.pid), time.monotonic(), 0
            busy_nodes = [n for n in range(args.nodes) if n not in set(names)][:100]
            while time.monotonic() - t0 < args.busy_s:
                tick = time.monotonic()
                half = busy_nodes[(flip % 2) * 50:(flip % 2) * 50 + 50]
                state = ["state=drain", "reason=busy"] if (flip // 2) % 2 == 0 else ["state=resume"]
                subprocess.run(["scontrol", "update", f"nodename=gpu-node-[{','.join(map(str, half))}]", *state],
                               env=env, check=True)
                flip += 1
                time.sleep(max(0.0, 0.5 - (time.monotonic() - tick)))
            busy_cpu = (cpu_s(watcher.pid) - w0) / (time.monotonic() - t0)
        finally:
            watcher.send_signal(signal.SIGTERM)
            watcher.wait(30)
            sampler.stop.set()
            keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
            if keys:
                client.delete(*keys)
    lat = list(latencies.values())
    return {"strategy": strategy, "quiet_cpu": quiet_cpu, "busy_cpu": busy_cpu, "ctld_cpu": ctld_cpu,
            "rpcs": rpcs, "rss": sampler.peak, "rss_phase": f"{sampler.peak_phase} phase: {sampler.peak_parts}", "lat": lat, "missed": len(started) - len(lat), "quiet_s": span,
            "load": (min(sampler.loads), sum(sampler.loads) / len(sampler.loads), max(sampler.loads))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="1000,10000",
                    help="controller sizes, comma-separated: one table each (the issue asks for 1,000 and 10,000)")
    ap.add_argument("--changes", type=int, default=200)
    ap.add_argument("--quiet-s", type=float, default=30.0)
    ap.add_argument("--busy-s", type=float, default=20.0)
    ap.add_argument("--baseline-s", type=float, default=10.0)
    ap.add_argument("--strategies", default="delta,sinfo_json")
    args = ap.parse_args()
    try:
        sizes = [int(n) for n in str(args.nodes).split(",") if n.strip()]
    except ValueError:
        ap.error(f"--nodes: comma-separated node counts, not {args.nodes!r}")
    client = redis.Redis.from_url(REDIS_URL)
    for nodes in sizes:
        size = argparse.Namespace(**{**vars(args), "nodes": nodes})
        report(size, [measure(s.strip(), size, client) for s in args.strategies.split(",") if s.strip()])


def report(args: argparse.Namespace, rows: list[dict[str, object]]) -> None:
    shipped = SlurmSettings()
    print(f"\nSlurm watcher on a real slurmctld with {args.nodes:,} nodes, shipped settings (poll "
          f"{shipped.poll_interval_s:g} s, CPU budget {shipped.cpu_budget:.0%}), {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f} at the end, {datetime.now():%Y-%m-%d}")
    print(f"(the load average is the machine's, other work included; {os.cpu_count()} cores are saturated at "
          f"{os.cpu_count()})")
    print(f"{'strategy':<12} {'detect p50':>10} {'p99/max':>12} {'missed':>6} {'CPU quiet':>9} {'CPU busy':>9} "
          f"{'peak RSS':>9} {'ctld CPU':>9}  RPCs/s while quiet")
    for r in rows:
        lat, load = r["lat"], r["load"]
        assert isinstance(lat, list) and isinstance(load, tuple)
        tail99 = tail(lat, "{:.3f}")
        rpcs = ", ".join(f"{k} {v / float(r['quiet_s']):.2f}" for k, v in sorted(r["rpcs"].items()))  # type: ignore[attr-defined,arg-type]
        print(f"{r['strategy']:<12} {percentile(lat, 50):>9.3f}s {tail99:>11}s {r['missed']:>6} "
              f"{float(r['quiet_cpu']):>8.1%} {float(r['busy_cpu']):>8.1%} {float(r['rss']):>7.0f}MB "  # type: ignore[arg-type]
              f"{float(r['ctld_cpu']):>8.1%}  {rpcs or 'none'}  (peak memory in the {r['rss_phase']}; load "  # type: ignore[arg-type]
              f"average during the run {load[1]:.1f}, {load[0]:.1f}-{load[2]:.1f})")
    if len(rows) == 2:
        a, b = rows
        print(f"{b['strategy']} / {a['strategy']}: quiet CPU x{float(b['quiet_cpu']) / max(float(a['quiet_cpu']), 1e-9):.1f}, "  # type: ignore[arg-type]
              f"detection p50 x{percentile(b['lat'], 50) / percentile(a['lat'], 50):.1f}")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
