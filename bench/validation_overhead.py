"""The validation's overhead per remediation, beyond the check's own run time, on a real slurmctld.

On each real Slurm release (22.05, and 24.11 and 26.05 from the cached roots; started with scripts/slurm-up.sh,
4 nodes, no accounting storage) one node at a time is drained with our reason, then the Slurm validator runs
exactly as the ``validate`` step drives it: ``start`` (create the maintenance reservation, resume the
node, sbatch the check), a ``poll`` every ``validation.poll_interval_s`` until the job has ended, then
``finish`` (drain back, delete the reservation). The check is a script that sleeps ``--check-s`` and
prints its own start and end time; its run time is taken from those, so the overhead is

    overhead = (start called -> finish returned) - (check's own end - check's own start)

and it splits into: the set-up (``start``), the job waiting to run (sbatch -> the check's first
line), noticing the end (the check's last line -> the poll that sees it ended) and undoing the set-up
(``finish``). Fewer than 200 cycles print the max, not a p99.

Run: .venv/bin/python -m bench.validation_overhead [--cycles 20] [--poll SECONDS (default: the shipped
     validation.poll_interval_s)] [--check-s 1] [--releases 22.05,24.11,26.05]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

from bench._cluster import RELEASES, slurm_cluster
from bench.common import goal, tail
from remediation.adapters.slurm.validator import SlurmValidator
from remediation.settings import ValidationSettings, load_settings
from remediation.validation.port import ValidationCheck

NODES = 4
#: What validation may add to a remediation beyond the check's own run time (docs/policy.md).
GOAL_S = 5.0
CHECK = """#!/bin/sh
echo "check-start $(date +%s.%N)"
sleep "$1"
echo "check-end $(date +%s.%N)"
"""


def summary(name: str, values: list[float]) -> str:
    return (f"  {name:<34} p50 {statistics.median(values):5.2f}s  mean {statistics.fmean(values):5.2f}s  "
            f"{tail(values, unit='s')}")


def measure(release: str, cycles: int, poll: float, check_s: float) -> None:
    with slurm_cluster(NODES, release) as env:
        conf = Path(env["SLURM_CONF"])
        workdir = conf.parent / "validation"  # inside the cluster directory: a chroot's slurmd writes there too
        workdir.mkdir()
        (workdir / "check.sh").write_text(CHECK)
        bin_dir = conf.parent / "bin"
        commands = {c: str(bin_dir / c) for c in ("scontrol", "sinfo", "squeue", "scancel", "sbatch")} \
            if bin_dir.is_dir() else {}
        settings = load_settings(
            slurm={"slurm_conf": str(conf), **commands},
            validation={"backend": "slurm", "slurm_workdir": str(workdir), "poll_interval_s": poll,
                        "checks": {"unknown": ["/bin/sh", str(workdir / "check.sh"), f"{check_s:g}"]}},
        )
        validator = SlurmValidator(settings.slurm, settings.validation)
        scontrol = commands.get("scontrol", "scontrol")
        version = subprocess.run([scontrol, "--version"], env=env, capture_output=True, text=True).stdout.strip()  # noqa: S603
        parts: dict[str, list[float]] = {k: [] for k in ("overhead", "start", "queue", "notice", "finish", "run")}
        for i in range(cycles):
            node = f"gpu-node-{i % NODES}"
            subprocess.run([scontrol, "update", f"nodename={node}", "state=drain", 'reason="remediation: bench"'],  # noqa: S603
                           env=env, check=True, capture_output=True)
            check = ValidationCheck(node, f"nr-gate-bench-{i}", tuple(settings.validation.check_for("unknown")), 120)
            t0 = time.time()
            ref = {**validator.start(check), "node": node}
            t_started = time.time()
            result = validator.poll(ref)
            while not result.done:
                time.sleep(poll)
                result = validator.poll(ref)
            t_seen = time.time()
            validator.finish(ref)
            t_end = time.time()
            marks = dict(line.split() for line in result.output.splitlines() if line.startswith("check-"))
            c_start, c_end = float(marks["check-start"]), float(marks["check-end"])
            assert result.passed, result
            parts["run"].append(c_end - c_start)
            parts["overhead"].append((t_end - t0) - (c_end - c_start))
            parts["start"].append(t_started - t0)
            parts["queue"].append(c_start - t_started)
            parts["notice"].append(t_seen - c_end)
            parts["finish"].append(t_end - t_seen)
        print(f"Slurm {version}: {cycles} validation cycles, check sleeps {check_s:g}s, poll every {poll:g}s")
        print(summary("validation overhead per remediation", parts["overhead"]))
        print(summary("  set up (reservation, resume, sbatch)", parts["start"]))
        print(summary("  job waiting to start", parts["queue"]))
        print(summary("  noticing the end (poll)", parts["notice"]))
        print(summary("  taking it down (drain, delete)", parts["finish"]))
        print(summary("check's own run time", parts["run"]))
        worst = max(parts["overhead"])  # per remediation: every one of them, so the worst decides
        print("  " + goal(f"overhead <= {GOAL_S:g} s per remediation", f"max {worst:.2f}s", worst <= GOAL_S))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--poll", type=float, default=ValidationSettings().poll_interval_s,
                    help="seconds between polls of the check (default: the shipped default)")
    ap.add_argument("--check-s", type=float, default=1.0, help="how long the check itself runs")
    ap.add_argument("--releases", default=",".join(RELEASES))
    args = ap.parse_args()
    for release in args.releases.split(","):
        measure(release.strip(), args.cycles, args.poll, args.check_s)


if __name__ == "__main__":
    main()
