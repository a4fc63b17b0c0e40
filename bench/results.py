"""Run the benchmarks and write their figures to bench/RESULTS.md: the one place the project's figures live.

    .venv/bin/python -m bench.results                    # every benchmark, at its documented size
    .venv/bin/python -m bench.results --only ingest_throughput,slurm_scale
    .venv/bin/python -m bench.results --quick --only kube_watch   # reduced sizes, labelled as such
    .venv/bin/python -m bench.results --list

Each benchmark runs in its own process (``python -m bench.NAME ARGS``) and its output is copied into
RESULTS.md verbatim, under the command that produced it, the date, the machine's core count and the git
revision. With ``--only`` the other benchmarks' sections are kept as they were (each says when and at
which revision it was measured). ``--quick`` runs reduced sizes for a check that the command works; its
sections say QUICK in their heading, so a quick figure is never mistaken for one of record. Each goal a
benchmark names comes with its verdict (``bench.common.goal``), and the section's heading counts them. A benchmark
that fails is recorded as failed with its output, and the command exits non-zero.

The README and docs quote no figures of their own: they link here.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"


@dataclass(frozen=True)
class Bench:
    name: str
    what: str
    args: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    module: str = ""  # the bench module, when one module gives two sections (default: the name)

    @property
    def runs(self) -> str:
        return self.module or self.name


BENCHES = (
    Bench(
        "ingest_throughput",
        "Ingest throughput: Redis stream -> Celery -> Postgres, durable and volatile Redis",
        (),
        ("--events", "2000", "--nodes", "500"),
    ),
    Bench(
        "ingest_sustained",
        "Ingest at a sustained 1,000 events/s: publish -> recorded latency, durable Redis",
        ("--rate", "1000"),
        ("--rate", "1000", "--events", "2000", "--nodes", "500"),
        module="ingest_throughput",
    ),
    Bench(
        "kube_watch",
        "Kubernetes watcher: condition change -> event latency, relist cost",
        (),
        ("--flips", "50", "--nodes", "50", "--relist-nodes", "1000", "--relist-repeats", "2"),
    ),
    Bench(
        "slurm_detect", "Slurm watcher detection latency on real slurmctld releases", (), ("--changes", "20")
    ),
    Bench(
        "slurm_watch_10k",
        "Slurm watcher at 1,000 and 10,000 nodes: detection, CPU quiet and busy, slurmctld's RPCs",
        (),
        ("--nodes", "1000", "--changes", "50", "--quiet-s", "5", "--busy-s", "5", "--baseline-s", "3"),
    ),
    Bench(
        "slurm_scale",
        "MICRO-BENCHMARK: sinfo --json parse + diff at 10,000 nodes",
        (),
        ("--nodes", "1000", "--polls", "5"),
    ),
    Bench(
        "mass_failure",
        "Mass failure: 150 and 375 nodes at once, fault to drained and cordoned; Slurm detection at 10,000",
        (),
        ("--pool", "200", "--sizes", "50", "--detect-nodes", "0"),
    ),
    Bench(
        "many_clusters",
        "One service, many clusters: 10 clusters of 1,000 nodes, one worker; detection, and a fault beside a storm",
        (),
        ("--clusters", "3", "--nodes", "300", "--storm", "60", "--tries", "3", "--changes", "5"),
    ),
    Bench("validation_overhead", "Validation overhead per cycle", (), ("--cycles", "5")),
    Bench(
        "checkpoint",
        "Fault to node free with and without the checkpoint request, real slurmctld",
        (),
        ("--cycles", "1", "--drain-timeout", "20", "--poll", "2"),
    ),
    Bench("evidence", "Evidence before the hammer: what collecting the node's state adds, real slurmctld", (),
          ("--cycles", "3")),
    Bench(
        "vm_overhead",
        "Workflow overhead per remediation (GCE and Azure over HTTPS)",
        (),
        ("--remediations", "20"),
    ),
    Bench("rehearsal", "`remediation rehearse` at fleet scale", (), ("--skip-10k",)),
    Bench(
        "fault_intelligence",
        "Default policy against the naive ladder (rehearsal)",
        (),
        ("--nodes", "256", "--seeds", "1"),
    ),
    Bench(
        "gpu_reset",
        "Node-hours out per fault class with and without the gpu-reset rung (rehearsal)",
        (),
        ("--nodes", "256", "--seeds", "1"),
    ),
    Bench(
        "goodput",
        "ETTR of training jobs under the shipped policy and the naive ladder (rehearsal)",
        (),
        ("--nodes", "256", "--seeds", "1", "--job-nodes", "16"),
    ),
    Bench(
        "reliability_report",
        "The reliability report at 10,000 nodes and 30,000 faults over 30 days",
        (),
        ("--nodes", "1000", "--faults", "3000", "--repeats", "2"),
    ),
    Bench("phantom_soak", "Phantom-fault soak: false quarantines", (), ("--minutes", "1", "--nodes", "16")),
    Bench("false_positives", "False-positive soak: actions on nodes that had no fault, per noise signal", (),
          ("--minutes", "1", "--nodes", "16")),
    Bench("reliability", "Reliability and operator-trust table (tests/reliability and the API fuzzing)"),
    Bench("failover", "Redis (Sentinel) and Postgres (streaming replica) failover mid-run"),
)
BY_NAME = {b.name: b for b in BENCHES}
HEADER = "# Benchmark results\n"
SECTION = re.compile(r"<!-- bench:(?P<name>[\w]+) -->\n.*?<!-- /bench:(?P=name) -->\n", re.S)


def git_revision() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    rev = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return rev + (
        " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/RESULTS.md") else ""
    )


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores (os.cpu_count()), load average {load} before the run"


def run(bench: Bench, quick: bool) -> tuple[str, int, float]:
    args = bench.quick if quick else bench.args
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{bench.runs}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    output = proc.stdout + (f"\n[stderr]\n{proc.stderr[-4000:]}" if proc.returncode else "")
    return output, proc.returncode, time.monotonic() - started


def section(bench: Bench, quick: bool, output: str, code: int, took: float) -> str:
    args = bench.quick if quick else bench.args
    label = " (QUICK: reduced sizes, not figures of record)" if quick else ""
    verdict = "" if code == 0 else f"\n**FAILED** (exit status {code}): the figures below are not valid.\n"
    judged = re.findall(r": (met|not met)$", output, re.M)
    goals = f"- goals: {judged.count('met')} met, {judged.count('not met')} not met\n" if judged else ""
    fence = "```"
    return (
        f"<!-- bench:{bench.name} -->\n"
        f'<a id="{bench.name}"></a>\n\n'
        f"## {bench.name}{label}\n\n"
        f"{bench.what}.\n\n"
        f"- command: `python -m bench.{' '.join((bench.runs, *args))}`\n"
        f"- measured: {datetime.now(UTC):%Y-%m-%d %H:%M UTC}, {machine()}, git {git_revision()}, "
        f"took {took:.0f} s\n{goals}{verdict}\n"
        f"{fence}text\n{output.rstrip()}\n{fence}\n"
        f"<!-- /bench:{bench.name} -->\n"
    )


def write(sections: dict[str, str], path: Path) -> None:
    old = {m["name"]: m.group(0) for m in SECTION.finditer(path.read_text())} if path.exists() else {}
    merged = {**old, **sections}
    body = "\n".join(merged[b.name] for b in BENCHES if b.name in merged)
    path.write_text(
        f"{HEADER}\nEvery figure the project quotes, as measured by `python -m bench.results` (the README and the\n"
        f"docs link here rather than repeat numbers). Regenerate with that command; `--only NAME,...` re-runs some\n"
        f"benchmarks and keeps the others' sections, each of which says when, on how many cores and at which git\n"
        f"revision it was measured. Last written {datetime.now(UTC):%Y-%m-%d %H:%M UTC} on {os.cpu_count()} cores "
        f"at git {git_revision()}.\n\n{body}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated benchmark names (default: all)")
    ap.add_argument("--quick", action="store_true", help="reduced sizes; the sections are labelled QUICK")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = ap.parse_args(argv)
    if args.list:
        for b in BENCHES:
            print(f"{b.name:<20} {b.what}")
        return 0
    names = [n.strip() for n in args.only.split(",") if n.strip()] or [b.name for b in BENCHES]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; --list shows them")
    sections, failed = {}, []
    for name in names:
        bench = BY_NAME[name]
        print(f"running bench.{name}{' (quick)' if args.quick else ''} ...", flush=True)
        output, code, took = run(bench, args.quick)
        print(output.rstrip(), flush=True)
        sections[name] = section(bench, args.quick, output, code, took)
        if code:
            failed.append(name)
        write(sections, args.out)  # after each benchmark, so a long run keeps what it measured
    print(f"wrote {args.out}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
