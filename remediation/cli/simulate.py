"""``remediation rehearse --trace FILE``: rehearse the policy on a failure trace before turning it on.

Replays the trace through :mod:`remediation.rehearsal` and prints what the service would have done.
Options: ``--dump-events`` (JSONL), ``--truth`` (the outcome model), ``--baseline`` (a second policy, with
ratios), ``--gpu-reset``, ``--site``/``--reboot-minutes``, ``--node-facts`` (per-pool figures,
:mod:`remediation.cli.simulate_pools`), ``--racks`` (NVL72 racks, :mod:`remediation.cli.simulate_racks`);
``-o json`` carries ``wall_s``.

Why: docs/rehearsal.md#rehearse-a-policy-before-turning-it-on
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

import typer
import yaml

from remediation.cli.context import CliError, cli_errors, state
from remediation.cli.render import check_format, print_json, show, table
from remediation.cli.simulate_pools import load_facts, show_pools
from remediation.cli.simulate_racks import rack_figures, rack_fleet, rack_line
from remediation.rehearsal.compare import by_class, figures, ratios, with_reset, without_reset
from remediation.rehearsal.goodput import CAUSES, JobModel
from remediation.rehearsal.loop import Tally
from remediation.rehearsal.run import Layout, Pace, rehearse
from remediation.rehearsal.trace import Fault, Scale, TraceError, dump_events, load
from remediation.rehearsal.truth import SITE_REBOOT, OutcomeModel, TruthError, parse_model
from remediation.settings import Settings, SettingsError, overlay

SHIPPED_TRUTH = "truth-llama3.yaml"
#: Where a synthesised trace (and the racks' domain faults) starts on the simulated clock.
START = datetime(2026, 1, 1, tzinfo=UTC)


def outcome_model(path: Path | None) -> OutcomeModel:
    """The ``--truth`` file, or the shipped one (remediation/data/truth-llama3.yaml)."""
    try:
        if path is None:
            text, name = resources.files("remediation.data").joinpath(SHIPPED_TRUTH).read_text(), SHIPPED_TRUTH
        else:
            text, name = path.read_text(), str(path)
        return parse_model(name, yaml.safe_load(text))
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: not valid YAML ({exc.__class__.__name__})") from None
    except TruthError as exc:
        raise CliError(f"{path or SHIPPED_TRUTH}: {exc}") from None


def progress_bar(faults: list[Fault], out: TextIO, every_s: float = 0.2,
                 *, tick: Callable[[], float] = time.monotonic) -> tuple[Callable[[datetime, Tally], None],
                                                                      Callable[[], None]]:
    """A one-line bar (simulated days done, faults handled), redrawn at most every ``every_s`` of wall
    time, and the function that clears it. The caller only installs it when ``out`` is a terminal."""
    first, last = (faults[0].at, faults[-1].at) if faults else (None, None)
    span_days = max((last - first).total_seconds() / 86400, 1e-9) if first and last else 1e-9
    shown = [float("-inf")]

    def draw(now: datetime, tally: Tally) -> None:
        t = tick()
        if t - shown[0] < every_s or first is None:
            return
        shown[0] = t
        done = min(max((now - first).total_seconds() / 86400, 0.0), span_days)
        filled = int(30 * done / span_days)
        out.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] day {done:.1f}/{span_days:.1f}  "
                  f"faults {tally.faults_handled}/{len(faults)}")
        out.flush()

    def clear() -> None:
        if shown[0] != float("-inf"):
            out.write("\r" + " " * 72 + "\r")
            out.flush()

    return draw, clear


@cli_errors
def simulate(
    ctx: typer.Context,
    trace: Path = typer.Option(..., "--trace", help="Failure trace: events (.jsonl) or a failure mix (.csv)."),
    nodes: int = typer.Option(64, help="Cluster size to scale a failure mix to."),
    days: float = typer.Option(54.0, help="Period a failure mix is spread over, in days."),
    seed: int = typer.Option(1, help="Random seed for a failure mix (same seed, same trace)."),
    site: str = typer.Option("cloud", help="cloud (a VM action takes the outcome model's vm-restart time) or "
                             "bare-metal (its bare-metal-reboot time)."),
    reboot_minutes: float = typer.Option(None, help="How long a simulated VM action takes (default: the "
                                         "outcome model's time for --site; 10 for a model without times)."),
    gpu_reset: bool = typer.Option(False, "--gpu-reset", help="Run the policy with and without the gpu-reset "
                                   "rung (both with jobs on the node) and compare node-hours out per fault class."),
    repair_hours: float = typer.Option(4.0, help="How long a repair by hand takes, once a human has the node "
                                       "(a quarantine, a page) or, for the fabric, after it broke."),
    truth: Path = typer.Option(None, "--truth", help="Outcome model (YAML): per category, the chance a restart, "
                               "a host move or a reimage fixes it. Default: the shipped truth-llama3.yaml."),
    baseline: Path = typer.Option(None, "--baseline", help="A second policy (YAML laid over the current "
                                  "settings, e.g. deploy/policies/naive-ladder.yaml) run on the same trace."),
    leaf_size: int = typer.Option(16, help="Nodes per leaf switch in a synthesised trace (a fabric fault "
                                  "takes one leaf's nodes down at once)."),
    dump_events_to: Path = typer.Option(None, "--dump-events", help="Also write the trace's events as JSONL."),
    node_facts: Path = typer.Option(None, "--node-facts", help="YAML list of {hostlist, partitions, features, "
                                    "labels}: what the watchers would report of the nodes, for profiles to select on."),
    racks: int = typer.Option(0, "--racks", help="NVL72 racks (the outcome model's racks section) as the first nodes: "
                              "node-hours lost per NVLink domain fault, the domain ladder against per-tray."),
    job_nodes: int = typer.Option(128, "--job-nodes", help="Nodes per training job (ETTR); the rest are spares."),
    checkpoint_minutes: float = typer.Option(60.0, "--checkpoint-minutes", help="How often a job saves its state: "
                                             "a fault loses the work since (an assumption; docs/rehearsal.md)."),
    restart_minutes: float = typer.Option(10.0, "--restart-minutes", help="A job's relaunch and warm-up after an "
                                          "interruption, once it has its nodes (an assumption; docs/rehearsal.md)."),
    spare_fraction: float = typer.Option(0.05, "--spare-fraction", help="Least share of the fleet kept spare."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Replay a failure trace through the real decision and workflow code on a simulated clock and report
    what the service would have done with the current settings (with --baseline, a second policy beside)."""
    fmt = check_format(output)
    settings = state(ctx).settings()
    settings, second = _second_policy(settings, baseline, gpu_reset)
    model = outcome_model(truth)
    rack, nodes = rack_fleet(model, racks, nodes)
    reboot, reset = _action_minutes(model, site, reboot_minutes)
    scale = Scale(nodes=nodes, days=days, start=START, seed=seed, leaf_size=leaf_size)
    faults, names = _trace(trace, model, scale, dump_to=dump_events_to)
    leaves = leaf_size if trace.suffix == ".csv" else None  # an events trace brings no topology
    by = settings.profiles or (second.profiles if second is not None else [])  # read both pool by pool
    t0 = time.monotonic()
    pace = Pace(reboot_s=reboot * 60, repair_s=repair_hours * 3600, reset_s=reset * 60)
    jobs = _job_model(job_nodes, checkpoint_minutes, restart_minutes, spare_fraction=spare_fraction)
    layout = Layout(leaves, load_facts(node_facts), by, jobs)
    report = _run(faults, settings, names, pace=pace, layout=layout)
    base = _run(faults, second, names, pace=pace, layout=layout) if second is not None else None
    ran = _Rehearsed(report, base, time.monotonic() - t0, model.name, site, reboot, reset, gpu_reset, baseline,
                     rack_figures(rack, racks, settings, scale=scale, pace=pace))
    if fmt == "json":
        print_json(_json_doc(ran, seed=seed, nodes=nodes))
        return
    _show_tables(ran, trace.name, settings.policy.max_concurrent)
    if report["profiles"]:
        show_pools(report, base, baseline.name if baseline is not None else None, truth=model.name,
                   site=site, pace=pace)


@dataclass(frozen=True)
class _Rehearsed:
    """What a rehearsal reported, under the policy and under the second one, and what it ran with."""

    report: dict[str, Any]
    base: dict[str, Any] | None  # the second policy's report: the baseline, or the run without gpu-reset
    took: float  # wall time of both runs, in seconds
    truth: str  # the outcome model's name
    site: str
    reboot: float  # minutes a VM action takes
    reset: float  # minutes a GPU reset takes
    gpu_reset: bool
    baseline: Path | None
    domains: dict[str, Any] | None = None  # a rack fleet's NVLink domain faults, both ways (--racks)


def _second_policy(settings: Settings, baseline: Path | None, gpu_reset: bool) -> tuple[Settings, Settings | None]:
    """The policy and the second one: the baseline, or with --gpu-reset the policy with and without it."""
    second = _baseline_policy(settings, baseline)
    if not gpu_reset:
        return settings, second
    if second is not None:
        raise CliError("--gpu-reset and --baseline each run a second policy: give one of them", 2)
    return with_reset(settings), without_reset(settings)


def _trace(trace: Path, model: OutcomeModel, scale: Scale, *, dump_to: Path | None) -> tuple[list[Fault], list[str]]:
    """The trace's faults (written as JSONL to ``dump_to`` too) and the fleet's node names."""
    faults = _load_faults(trace, model, scale)
    if dump_to is not None:
        dump_events(faults, dump_to)
    return faults, sorted({f.event.node for f in faults} | {f"gpu-node-{i}" for i in range(scale.nodes)})


def _job_model(job_nodes: int, checkpoint_minutes: float, restart_minutes: float, *,
               spare_fraction: float) -> JobModel:
    """The job model the ETTR is counted with (exit 2 on a value it cannot take)."""
    if job_nodes < 1 or checkpoint_minutes <= 0 or restart_minutes < 0 or not 0 <= spare_fraction < 1:
        raise CliError("--job-nodes must be at least 1, --checkpoint-minutes positive, --restart-minutes not "
                       "negative and --spare-fraction from 0 to below 1", 2)
    return JobModel(job_nodes=job_nodes, checkpoint_s=checkpoint_minutes * 60, restart_s=restart_minutes * 60,
                    spare_fraction=spare_fraction)


def _baseline_policy(settings: Settings, baseline: Path | None) -> Settings | None:
    """``--baseline`` laid over the current settings (exit 2 when it does not load), or None."""
    if baseline is None:
        return None
    try:
        return overlay(settings, baseline)
    except SettingsError as exc:
        raise CliError(str(exc), 2) from None


def _action_minutes(model: OutcomeModel, site: str, reboot_minutes: float | None) -> tuple[float, float]:
    """How long a VM action (``--reboot-minutes``, else the model's time for the site) and a GPU reset take."""
    if site not in SITE_REBOOT:
        raise CliError(f"--site must be one of {', '.join(SITE_REBOOT)}, not {site!r}", 2)
    try:
        reboot = reboot_minutes or model.minutes(SITE_REBOOT[site], 10.0 if site == "cloud" else None)
        reset = model.minutes("gpu-reset", 2.0)
    except TruthError as exc:
        raise CliError(str(exc), 2) from None
    return reboot, reset


def _load_faults(trace: Path, model: OutcomeModel, scale: Scale) -> list[Fault]:
    """The trace's faults: read from an events file, or synthesised from a failure mix."""
    try:
        return load(trace, scale, model=model)
    except TraceError as exc:
        raise CliError(str(exc)) from None


def _json_doc(ran: _Rehearsed, *, seed: int, nodes: int) -> dict[str, Any]:
    """``-o json``: the report, or with a second policy both reports, their ratios and the run's inputs."""
    report, base = ran.report, ran.base
    racked = {"nvlink_domains": ran.domains} if ran.domains is not None else {}
    if base is None:
        return {**report, "wall_s": round(ran.took, 2), **racked}
    return {**racked, "policy": report,
            "baseline": {**base, "config": "without gpu-reset" if ran.gpu_reset else str(ran.baseline)},
            "ratios": ratios(report, base), "wall_s": round(ran.took, 2), "truth": ran.truth, "seed": seed,
            "nodes": nodes, "site": ran.site, "reboot_minutes": ran.reboot, "reset_minutes": ran.reset}


def _show_tables(ran: _Rehearsed, trace_name: str, max_concurrent: int) -> None:
    """The summary side by side, then per fault class (--gpu-reset) or per figure with ratios
    (--baseline), then the events recorded and not acted on."""
    report, base, gpu_reset, baseline = ran.report, ran.base, ran.gpu_reset, ran.baseline
    second_head = "without gpu-reset" if gpu_reset else f"baseline ({baseline.name})" if baseline else ""
    heads = ["", "with gpu-reset" if gpu_reset else "with these settings"] + ([second_head] if base is not None else [])
    rows = _summary_rows([report] + ([base] if base is not None else []), max_concurrent)
    show(table(heads, rows, title=f"simulated {trace_name} ({ran.took:.1f}s, outcomes: {ran.truth}, {ran.site}: reboot "
                                  f"{ran.reboot:g} min, GPU reset {ran.reset:g} min)"))
    if gpu_reset and base is not None:
        show(table(["fault class", "node-hours out with gpu-reset", "without", "ratio"],
                   [(c, f"{a:.1f}", f"{b:.1f}", f"{a / b:.2f}" if b else "-") for c, a, b in by_class(report, base)]))
    if base is not None and not gpu_reset:
        cand, ref = figures(report), figures(base)
        show(table(["figure", "these settings", "baseline", "ratio"],
                   [(k, cand[k] if not isinstance(cand[k], float) else f"{cand[k]:.1f}",
                     ref[k] if not isinstance(ref[k], float) else f"{ref[k]:.1f}", "-" if v is None else f"{v:.2f}")
                    for k, v in ratios(report, base).items()]))
    if report["ignored"]:
        show(table(["recorded, not acted on", "events"], sorted(report["ignored"].items())))
    if ran.domains is not None:
        typer.echo(rack_line(ran.domains))


def _summary_rows(columns: list[dict[str, Any]], max_concurrent: int) -> list[tuple[Any, ...]]:
    """One row per figure, one column per report."""
    return [
        ("faults replayed", *[r["faults"] for r in columns]),
        ("events decided", *[", ".join(f"{k}: {v}" for k, v in sorted(r["decisions"].items())) or "-" for r in columns]),
        ("remediations", *[", ".join(f"{k}: {v}" for k, v in sorted(r["outcomes"].items())) or "-" for r in columns]),
        ("VM actions", *[", ".join(f"{k}: {v}" for k, v in sorted(r["vm_actions"].items())) or "none" for r in columns]),
        ("VM actions that fixed nothing", *[r["wasted_vm_actions"] for r in columns]),
        ("VM actions · quarantines on fabric faults", *[f"{r['fabric_vm_actions']} · {r['fabric_quarantines']}"
                                                       for r in columns]),
        ("faults fixed automatically", *[r["auto_fixed"] for r in columns]),
        ("node-hours out of service", *[f"{r['node_hours_out']:.1f}" for r in columns]),
        ("incidents · pages", *[f"{r['incidents']} · {r['pages']}" for r in columns]),
        ("most VM actions at once", *[f"{r['max_vm_in_flight']} (max_concurrent {max_concurrent})" for r in columns]),
        ("storm breaker", *[f"opened {r['breaker_openings']}x, open {r['breaker_open_s'] / 3600:.1f} h in all"
                            for r in columns]),
        ("median time to recover", *[f"{r['recovery_p50_s'] / 60:.1f} min" if r["recovery_p50_s"] else "-"
                                     for r in columns]),
        ("quarantined", *[len(r["quarantined"]) for r in columns]),
        *_goodput_rows(columns),
    ]


def _goodput_rows(columns: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The jobs' ETTR and what moved it (hours lost by cause, checkpoint saves, the spare pool)."""
    gs = [r["goodput"] for r in columns]
    return [
        ("ETTR (jobs · nodes each · spares)", *[f"{g['ettr']:.4f} ({g['jobs']} · {g['job_nodes']} · {g['spare_nodes']})"
                                                if g["ettr"] is not None else f"- (no job of {g['job_nodes']} fits)"
                                                for g in gs]),
        ("job-hours lost: detect · work · wait · restart · false pos.",
         *[" · ".join(f"{g['lost_hours_by_cause'][c]:.1f}" for c in CAUSES) for g in gs]),
        ("interruptions · checkpoint saves · fewest free nodes",
         *[f"{g['interruptions']} · {g['checkpoint_saves']} · {g['fewest_free']}" for g in gs]),
    ]


def _run(faults: list[Fault], settings: Settings, names: list[str], *, pace: Pace,
         layout: Layout) -> dict[str, Any]:
    """One rehearsal, with the progress bar on a terminal."""
    draw, clear = progress_bar(faults, sys.stderr) if sys.stderr.isatty() else (None, lambda: None)
    try:
        return rehearse(faults, settings, names, pace=pace, layout=layout, progress=draw).as_dict()
    finally:
        clear()
