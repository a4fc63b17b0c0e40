"""`remediation rehearse` pool by pool: what the watchers would report of the nodes (``--node-facts``),
and every figure for each profile's pool beside the baseline's for the same nodes.

A mixed fleet (an NVL72 pool, an H100 pool, an inference pool) is rehearsed under one global policy
and under profiles on the same trace: the baseline is read by the same pools, so each pool's numbers
sit side by side. What is an assumption is printed under the table, never mixed into it.

Why: docs/rehearsal.md#profiles-and-a-mixed-fleet
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from remediation.cli.context import CliError
from remediation.cli.render import show, table
from remediation.hostlist import HostlistError, expand
from remediation.rehearsal.run import NodeGroup, Pace

#: Per pool, each figure and how it reads (the same names as the report's).
FIGURES: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("nodes", lambda r: r["nodes"]),
    ("faults replayed", lambda r: r["faults"]),
    ("VM actions", lambda r: r["vm_actions_total"]),
    ("VM actions that fixed nothing", lambda r: r["wasted_vm_actions"]),
    ("faults fixed automatically", lambda r: r["auto_fixed"]),
    ("node-hours out of service", lambda r: f"{r['node_hours_out']:.1f}"),
    ("quarantined", lambda r: len(r["quarantined"])),
    ("still held for a human at the end", lambda r: r["outcomes"].get("waiting", 0)),
    ("incidents · pages", lambda r: f"{r['incidents']} · {r['pages']}"),
    ("own storm breaker opened", lambda r: r["breaker_openings"]),
    ("most VM actions at once", lambda r: r["max_vm_in_flight"]),
]


def load_facts(path: Path | None) -> list[NodeGroup]:
    """The ``--node-facts`` file: a YAML list of {hostlist, partitions, features, labels}."""
    if path is None:
        return []
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: not valid YAML ({exc.__class__.__name__})") from None
    if not isinstance(doc, list):
        raise CliError(f"{path}: expected a list of {{hostlist, partitions, features, labels}}")
    out = []
    for i, item in enumerate(doc):
        where = f"{path}: entry {i}"
        if not isinstance(item, dict) or set(item) - {"hostlist", "partitions", "features", "labels"}:
            raise CliError(f"{where}: expected hostlist, partitions, features and labels only")
        try:
            expand(str(item.get("hostlist", "")))
        except HostlistError as exc:
            raise CliError(f"{where}: hostlist: {exc}") from None
        labels = item.get("labels") or {}
        if not isinstance(labels, dict):
            raise CliError(f"{where}: labels must be a mapping")
        out.append(
            NodeGroup(
                str(item["hostlist"]),
                tuple(map(str, item.get("partitions") or ())),
                tuple(map(str, item.get("features") or ())),
                tuple((str(k), str(v)) for k, v in labels.items()),
            )
        )
    return out


def show_pools(
    report: dict[str, Any],
    base: dict[str, Any] | None,
    baseline: str | None,
    *,
    truth: str,
    site: str,
    pace: Pace,
) -> None:
    """The figures pool by pool, and what the rehearsal assumed (``pace``: its reboot and repair times)."""
    reboot_minutes, repair_hours = pace.reboot_s / 60, pace.repair_s / 3600
    pools = sorted(report["profiles"])
    heads = ["figure"]
    for pool in pools:
        heads += [pool] if base is None else [f"{pool}: these", f"{pool}: {baseline or 'baseline'}"]
    rows = []
    for label, read in FIGURES:
        row: list[Any] = [label]
        for pool in pools:
            row.append(read(report["profiles"][pool]))
            if base is not None:
                theirs = base["profiles"].get(pool)
                row.append(read(theirs) if theirs is not None else "-")
        rows.append(row)
    show(table(heads, rows, title="by pool (the nodes each profile selects first)"))
    show(
        table(
            ["assumption", "value"],
            [
                ("what fixes each fault (the outcome model)", truth),
                (
                    "failure mix and rate",
                    "the trace's, the same for every pool (no per-pool rates are published)",
                ),
                (
                    "a machine action's time",
                    f"{reboot_minutes:g} min ({site}), for every pool and every hammer",
                ),
                ("a repair by hand", f"{repair_hours:g} h after a human has the node"),
                ("what the watchers report of the nodes", "--node-facts (partitions, features, labels)"),
            ],
        )
    )
