"""Failure traces: read them, or synthesise one from a published failure mix, as timed NodeEvents.

An **events** file (``.jsonl``, one NodeEvent per line) is replayed as it is; a **mix** (``.csv``,
one row per fault category) is scaled to ``nodes`` over ``days`` and spread at random. With an outcome
model each fault carries its cause in its signal and nodes sit in leaf-switch groups of ``leaf_size``.
A given seed always gives the same trace.

Why: docs/rehearsal.md#traces-events-or-a-failure-mix
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from remediation.domain.events import EventKind, InvalidEvent, NodeEvent, Source
from remediation.rehearsal.truth import Outcome, OutcomeModel

#: The published trace's cluster (Llama 3 405B pre-training): 2,048 nodes over 54 days. Scaling to
#: another cluster keeps the per-node rate. The simulator's replay reads the same CSV through here.
PAPER_NODES = 2048
PAPER_DAYS = 54.0


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Fault:
    at: datetime
    event: NodeEvent
    fixed_by_restart: bool = True
    category: str = ""
    # From an outcome model: which actions fix it (None: the mix's remediable_by_vm_restart column).
    outcome: Outcome | None = None
    group: int = 0  # the fault's number in the trace: the nodes of one fabric fault share it


def leaf_of(node: int, leaf_size: int) -> str:
    """The leaf switch a synthesised node hangs off (``leaf-3``): nodes are cabled in order."""
    return f"leaf-{node // leaf_size}"


@dataclass(frozen=True)
class Scale:
    """How a failure mix is scaled and placed: on ``nodes`` over ``days`` from ``start``, at random
    from ``seed``, with a fabric fault hitting one leaf group of ``leaf_size`` nodes."""

    nodes: int
    days: float
    start: datetime
    seed: int = 1
    leaf_size: int = 16


def load(path: Path, scale: Scale, *, model: OutcomeModel | None = None) -> list[Fault]:
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    if path.suffix == ".jsonl":
        return _load_events(path)
    if path.suffix == ".csv":
        return synthesise(read_mix(path), scale, model=model)
    raise TraceError(f"{path}: a trace is .jsonl (events) or .csv (a failure mix)")


def _load_events(path: Path) -> list[Fault]:
    out = []
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            ev = NodeEvent.parse(line)
        except InvalidEvent as exc:
            raise TraceError(f"{path}:{no}: {exc}") from None
        out.append(Fault(ev.observed_at, ev))
    return sorted(out, key=lambda f: f.at)


@dataclass(frozen=True)
class MixRow:
    """One root-cause category of a failure mix."""

    category: str
    count: int
    signal: str  # suggested_signal, lower-cased: how the fault shows itself
    remediable: bool  # remediable_by_vm_restart
    component: str = ""


def read_mix(path: str | Path) -> list[MixRow]:
    """The rows of a failure-mix CSV (the one reader of that format: the simulator's replay uses it too)."""
    path = Path(path)
    rows = []
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        needed = {"category", "count", "suggested_signal", "remediable_by_vm_restart"}
        if not reader.fieldnames or not needed <= set(reader.fieldnames):
            raise TraceError(f"{path}: a failure mix needs the columns {sorted(needed)}")
        for no, rec in enumerate(reader, 2):
            try:
                count = int(rec["count"])
            except ValueError:
                raise TraceError(f"{path}:{no}: count {rec['count']!r} is not a number") from None
            if count < 0:
                raise TraceError(f"{path}:{no}: count must not be negative")
            rows.append(MixRow(rec["category"], count, rec["suggested_signal"].lower(),
                               rec["remediable_by_vm_restart"].strip().lower().startswith("yes"),
                               rec.get("component") or ""))
    return rows


def _kind_of(signal: str) -> tuple[Source, str, str] | None:
    """(source, state, reason) for a suggested signal, or None when the fault leaves nodes healthy."""
    if "job failure only" in signal:
        return None
    if "maintenance" in signal:
        return Source.SLURM, "DRAIN", "maintenance: host repair"
    if "not responding" in signal or "down" in signal:
        return Source.SLURM, "DOWN", "Not responding"
    if "researcher" in signal and "condition" not in signal:
        return Source.SLURM, "FAIL", "xid"
    if "gpu condition" in signal:
        return Source.KUBERNETES, "GpuXidError=True", "GPU fault"
    if "notready" in signal:
        return Source.KUBERNETES, "Ready=False", "KubeletNotReady"
    if "node condition" in signal:
        return Source.KUBERNETES, "KernelDeadlock=True", "host fault"
    return Source.KUBERNETES, "Ready=False", signal[:80]


def _cause_signal(kind: tuple[Source, str, str], row: MixRow, model: OutcomeModel | None,
                  *, rng: random.Random) -> tuple[Source, str, str]:
    """The signal with the fault's cause in it, the way the source would show it."""
    source, state, reason = kind
    if model is None or row.category not in model.categories:
        return source, state, f"{reason} ({row.category})"
    truth = model.truth(row.category)
    if "or researcher" in row.signal and truth.xids and rng.random() < 0.5:
        source, state = Source.SLURM, "FAIL"  # "a GPU condition or a researcher's state=fail"
    if source is Source.KUBERNETES and state != "Ready=False" and truth.conditions:
        ctype, _, message = rng.choice(truth.conditions).partition(":")
        return source, f"{ctype.strip()}=True", message.strip()
    if source is Source.SLURM and state == "FAIL" and truth.xids:
        xid = rng.choice(truth.xids)
        styles = (f"xid {xid}", f"Xid {xid}", f"XID {xid} on gpu {rng.randrange(8)}",
                  f"NVRM: Xid (PCI:0000:{rng.randrange(16, 240):02x}:00): {xid}, pid={rng.randrange(1000, 99999)}")
        return source, state, rng.choice(styles)
    return source, state, f"{reason} ({row.category})"


def synthesise(mix: list[MixRow], scale: Scale, *, model: OutcomeModel | None = None) -> list[Fault]:
    """Scale a failure mix to ``nodes`` over ``days`` and place each fault at random (seeded).

    With ``model``, faults carry their causes and their outcomes, and a fabric fault hits one whole
    leaf group of ``leaf_size`` nodes (see the module docstring)."""
    nodes, days, start, seed, leaf_size = scale.nodes, scale.days, scale.start, scale.seed, scale.leaf_size
    if nodes < 1 or days <= 0:
        raise TraceError("nodes must be at least 1 and days positive")
    if leaf_size < 1:
        raise TraceError("leaf_size must be at least 1")
    rng = random.Random(seed)
    fate = random.Random(seed * 7919 + 1)  # outcomes and causes: the placement stream stays as it was
    span = timedelta(days=days).total_seconds()
    factor = (nodes / PAPER_NODES) * (days / PAPER_DAYS)
    out: list[Fault] = []
    group = 0
    for row in mix:
        kind = _kind_of(row.signal)
        expected = row.count * factor
        n = int(expected) + (1 if rng.random() < expected - int(expected) else 0)
        for i in range(n):
            at = start + timedelta(seconds=rng.uniform(0, span))
            if kind is None:
                continue
            group += 1
            correlated = "correlated" in row.signal or "several" in row.signal
            fabric = model is not None and row.category in model.categories and model.truth(row.category).fabric
            if fabric:
                leaf = rng.randrange(0, max(1, -(-nodes // leaf_size)))
                targets = list(range(leaf * leaf_size, min(nodes, (leaf + 1) * leaf_size)))
            else:
                width = max(2, nodes // 32) if correlated else 1
                targets = rng.sample(range(nodes), min(width, nodes))
            for node in targets:
                name = f"gpu-node-{node}"
                source, state, reason = _cause_signal(kind, row, model, rng=fate)
                outcome = model.roll(row.category, fate) if model is not None and row.category in model.categories \
                    else None
                ev = NodeEvent(source=source, node=name, kind=EventKind.UNHEALTHY, state=state,
                               reason=reason, observed_at=at, dedupe_key=f"trace:{seed}:{row.category}:{i}:{name}")
                fixed = bool(outcome.fixed_by & {"restart"}) if outcome is not None else row.remediable
                out.append(Fault(at, ev, fixed, row.category, outcome, group))
    return sorted(out, key=lambda f: (f.at, f.event.node))


def dump_events(faults: list[Fault], path: Path) -> None:
    path.write_text("".join(json.dumps(json.loads(f.event.to_json())) + "\n" for f in faults))
