"""Cause classification: read the fault's cause from the signal itself, and pick the class's ladder.

In order: XID codes (the most severe class wins), the NVLink domain's own signals, the Kubernetes
condition type, well-known words, a Slurm state without a reason (``host``), else ``unknown``. The
table is data (``remediation/data/causes.yaml``) merged with the site's ``policy.faults``;
application-level XIDs come back with ``app_level``; each cause's ``scope`` is its node's or its
NVLink domain's. Pure: the shipped table is package data read once.

Why: docs/policy.md#fault-classes-the-cause-picks-the-first-action,
docs/policy.md#domain-faults-what-one-tray-cannot-be-blamed-for
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from remediation.domain.events import Source
from remediation.domain.slurm_states import SlurmState
from remediation.ports.cluster import VMAction
from remediation.settings import FaultSettings, WorkflowSettings
from remediation.vocabulary import APP, FAULT_CLASSES, GPU_RESET, HOLD, QUARANTINE, UNKNOWN

# The worse class wins when one signal names several causes (a kernel log with Xid 13 then Xid 79).
# A switch under the links is worse than the links (an SXID beside an NVLink error names the switch); a
# dead host explains its IMEX daemon being down, so ``imex`` ranks below ``host``
# (docs/policy.md#domain-faults-what-one-tray-cannot-be-blamed-for).
SEVERITY = ("gpu-rma", "gpu-hardware", "gpu-memory", "nvswitch", "nvlink", "ib-link", "fabric", "gpu-transient",
            "host", "imex", "software", UNKNOWN, APP)


class FaultScope(StrEnum):
    """Whose fault a cause is: one node's, or its NVLink domain's (every tray of it, and its switch trays)."""

    NODE = "node"
    DOMAIN = "domain"


@dataclass(frozen=True)
class ClassInfo:
    ladder: tuple[str, ...] | None  # None: follow workflow.ladder (class unknown)
    lemon_weight: float
    rma: bool
    why: str
    urgent: bool = False  # no checkpoint request: the jobs' GPU state cannot be trusted or reached
    scope: FaultScope = FaultScope.NODE  # DOMAIN: the class's signal is the domain's on a multi-node domain


@dataclass(frozen=True)
class XidInfo:
    fault_class: str
    nvidia: str  # NVIDIA's resolution bucket (immediate action)
    name: str
    repeat_class: str | None = None


@dataclass(frozen=True)
class Cause:
    """What a signal says about its fault."""

    fault_class: str
    evidence: str  # why this class, in words on-call can check against the signal
    xid: int | None = None
    app_level: bool = False  # an application-level XID: not a node fault unless it repeats
    repeat_class: str | None = None  # the class a repeated application-level XID is remediated as
    gpu_pci: str | None = None  # the PCI bus id of the GPU the XID names ("0000:3b:00"), when one is named
    scope: FaultScope = FaultScope.NODE  # DOMAIN: a fault of the node's NVLink domain, not of the node


@dataclass(frozen=True)
class CauseTable:
    classes: Mapping[str, ClassInfo]
    xids: Mapping[int, XidInfo]
    conditions: Mapping[str, tuple[str, bool]]  # type -> (class, the message carries the XID)
    messages: tuple[tuple[re.Pattern[str], str], ...] = field(default=())
    # The NVLink domain's own signals, read after the XIDs wherever the messages are read, and before
    # the class of the conditions in ``signal_conditions`` (whose type names a watch, and whose text the
    # part: NVSentinel's GpuNvlinkWatch carries IMEX's DCGM_FR_IMEX_UNHEALTHY).
    domain_signals: tuple[tuple[re.Pattern[str], str], ...] = field(default=())
    signal_conditions: frozenset[str] = frozenset()


@lru_cache(maxsize=1)
def shipped() -> CauseTable:
    """The table as shipped in the package (parsed once)."""
    raw: dict[str, Any] = yaml.safe_load(
        resources.files("remediation").joinpath("data/causes.yaml").read_text(encoding="utf-8"))
    classes = {
        name: ClassInfo(None if c["ladder"] == "workflow" else tuple(c["ladder"]), float(c["lemon_weight"]),
                        bool(c.get("rma")), " ".join(str(c.get("why", "")).split()), bool(c.get("urgent")),
                        FaultScope(c.get("scope", FaultScope.NODE)))
        for name, c in raw["classes"].items()
    }
    xids = {int(code): XidInfo(x["class"], x["nvidia"], x["name"], x.get("repeat_class"))
            for code, x in raw["xids"].items()}
    conditions = {t: (c["class"], bool(c.get("xid_in_message"))) for t, c in raw["conditions"].items()}
    messages = tuple((re.compile(m["pattern"], re.IGNORECASE), m["class"]) for m in raw["messages"])
    signals = tuple((re.compile(m["pattern"], re.IGNORECASE), m["class"]) for m in raw["domain_signals"])
    signal_conditions = frozenset(t for t, c in raw["conditions"].items() if c.get("domain_signals"))
    table = CauseTable(classes, xids, conditions, messages, signals, signal_conditions)
    _check(table)
    return table


def _check(table: CauseTable) -> None:
    known = set(FAULT_CLASSES)
    assert set(table.classes) == known, f"causes.yaml classes {sorted(table.classes)} != {sorted(known)}"
    for code, x in table.xids.items():
        assert x.fault_class in known | {APP}, f"xid {code}: class {x.fault_class}"
        assert x.repeat_class is None or x.repeat_class in known, f"xid {code}: repeat_class {x.repeat_class}"
    for t, (c, _) in table.conditions.items():
        assert c in known, f"condition {t}: class {c}"
    for _, c in table.messages:
        assert c in known, f"message class {c}"
    for _, c in table.domain_signals:
        assert table.classes[c].scope is FaultScope.DOMAIN, f"domain signal class {c} is not of domain scope"
    for code, x in table.xids.items():  # a tray's own XID is its own fault, whatever domain it is in
        for name in {x.fault_class, x.repeat_class or APP} - {APP}:
            assert table.classes[name].scope is FaultScope.NODE, f"xid {code}: class {name} is of domain scope"


def table(faults: FaultSettings) -> CauseTable:
    """The shipped table with the site's overrides (``policy.faults``) on top."""
    base = shipped()
    if not (faults.ladders or faults.xids or faults.conditions):
        return base
    classes = dict(base.classes)
    for name, ladder in faults.ladders.items():
        info = classes[name]
        classes[name] = replace(info, ladder=tuple(ladder))
    xids = dict(base.xids)
    for code, cls in faults.xids.items():
        old = xids.get(code)
        xids[code] = XidInfo(cls, old.nvidia if old else "site", old.name if old else f"XID {code}",
                             (old.repeat_class if old else None) or ("software" if cls == APP else None))
    conditions = dict(base.conditions)
    for ctype, cls in faults.conditions.items():
        conditions[ctype] = (cls, base.conditions.get(ctype, (cls, False))[1])
    return CauseTable(classes, xids, conditions, base.messages, base.domain_signals, base.signal_conditions)


# ------------------------------------------------------------------------------------ classify

# A kernel line: "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, ..." (also with a function: 3b:00.0).
_KERNEL = re.compile(r"xid\s*\(\s*(?:pci:)?[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}(?:\.[0-9a-f])?\s*\)\s*:?\s*(\d{1,3})\b",
                     re.IGNORECASE)
# As people and tools write it: "xid 79", "Xid48", "XID=48", "xid: 79", "xid#79", "NvidiaXID79Error".
# A list counts too: "xids 13 and 79", "xid 48/63".
_WRITTEN = re.compile(r"(?<![a-z0-9])(?:nvidia)?xids?\s*[:=#_-]?\s*(\d{1,3}(?:\s*(?:,|/|&|and)\s*\d{1,3}(?!\d))*)(?!\d)",
                      re.IGNORECASE)
# NVSentinel's XID condition message: "ErrorCode:79 PCI:0000:3b:00 ..." (read only on XID conditions).
_ERROR_CODE = re.compile(r"\berrorcode\s*[:=]\s*(\d{1,3})\b", re.IGNORECASE)
# A GPU's PCI address as the driver and NVSentinel print it: "PCI:0000:3b:00" (domain:bus:device; the
# kernel's Xid line may leave out "PCI:" and add the function, "0000:3b:00.0").
_PCI = r"([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})(?:\.[0-9a-f])?"
_KERNEL_PCI = re.compile(r"xid\s*\(\s*(?:pci:)?" + _PCI + r"\s*\)\s*:?\s*(\d{1,3})\b", re.IGNORECASE)
_ANY_PCI = re.compile(r"\bpci:" + _PCI + r"(?![0-9a-f:])", re.IGNORECASE)


def pci_id(domain: str, bus: str, device: str) -> str:
    """One spelling of a GPU's PCI address, ``0000:3b:00``: the domain as four hex digits at least
    (the kernel prints four, nvidia-smi eight), lower case, no function. The GPU reset job compares
    nvidia-smi's ``pci.bus_id`` in this spelling (:mod:`remediation.domain.gpu_reset`)."""
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}"


def gpu_pci_of(text: str, code: int) -> str | None:
    """The PCI address of the GPU that reported XID ``code`` in ``text``: with kernel Xid lines, the one
    on that code's lines; without, the only address the text names (NVSentinel's ``PCI:`` field). None
    when that is not one GPU (no address, several, or only other codes' lines): the reset then takes
    every GPU of the node."""
    kernel = [(pci_id(*m.groups()[:3]), int(m.group(4))) for m in _KERNEL_PCI.finditer(text)]
    named = {pci for pci, c in kernel if c == code} if kernel else {
        pci_id(*m.groups()) for m in _ANY_PCI.finditer(text)}
    return named.pop() if len(named) == 1 else None


def xids_in(text: str, error_codes: bool = False) -> list[int]:
    """Every XID code the text names, in order of appearance, without repeats."""
    found: list[tuple[int, int]] = []
    for pattern in (_KERNEL, _WRITTEN, *((_ERROR_CODE,) if error_codes else ())):
        found += [(m.start(1) + i, int(code)) for m in pattern.finditer(text)
                  for i, code in enumerate(re.findall(r"\d+", m.group(1)))]
    out: list[int] = []
    for _, code in sorted(found):
        if code not in out:
            out.append(code)
    return out


def classify(source: str, state: str, reason: str, *, tbl: CauseTable, domain_size: int = 1) -> Cause:
    """The cause of one unhealthy signal (``source`` slurm, kubernetes or manual; ``state`` a Slurm
    state or ``Type=Status``; ``reason`` the Slurm reason or the condition's message).
    ``domain_size``: the nodes of the node's NVLink domain (a Slurm block, a ``nvidia.com/gpu.clique``);
    1 when it is in none. Only in a domain of two or more is a domain class's signal the domain's: on a
    node alone, its NVSwitches are its own and IMEX has no domain to serve."""
    cause = _read(source, state, reason, tbl=tbl)
    info = tbl.classes.get(cause.fault_class)
    if cause.xid is not None or info is None or info.scope is FaultScope.NODE:
        return cause  # a tray's own XID is its own fault, whatever domain it is in
    if domain_size >= 2:
        return replace(cause, scope=FaultScope.DOMAIN,
                       evidence=f"{cause.evidence}: a fault of its NVLink domain ({domain_size} nodes)")
    return replace(cause, evidence=f"{cause.evidence}: the node's own (it is in no multi-node NVLink domain)")


def _read(source: str, state: str, reason: str, *, tbl: CauseTable) -> Cause:
    cond_type = state.partition("=")[0] if source == Source.KUBERNETES else ""
    cond = tbl.conditions.get(cond_type)
    codes = xids_in(reason, error_codes=bool(cond and cond[1]))
    if codes:
        cause = _from_xids(codes, tbl)
        return replace(cause, gpu_pci=gpu_pci_of(reason, cause.xid or 0))
    text = reason
    if source == Source.KUBERNETES and text.startswith("Node ") and ": " in text:
        text = text.split(": ", 1)[1]  # the watcher's "Node <name>: " prefix names no cause
    decisive = cond is not None and not cond[1] and cond[0] != UNKNOWN  # the type names the class
    if not decisive or cond_type in tbl.signal_conditions:
        for pattern, cls in tbl.domain_signals:
            if m := pattern.search(text):
                said = f"reason mentions {m.group(0).strip()!r}"
                return Cause(cls, f"condition {cond_type}, whose {said}" if cond else said)
    if cond is not None and decisive:
        return Cause(cond[0], f"condition {cond_type}")
    for pattern, cls in tbl.messages:
        if m := pattern.search(text):
            return Cause(cls, f"reason mentions {m.group(0).strip()!r}")
    if cond is not None:  # an XID condition whose message named no code
        return Cause(cond[0], f"condition {cond_type} without a named cause")
    upper = {s for s in re.split(r"[+\s,]+", state.upper()) if s}
    if source == Source.SLURM and upper & {SlurmState.DOWN, SlurmState.NOT_RESPONDING} and not reason.strip():
        return Cause("host", f"Slurm {'+'.join(sorted(upper))} without a reason: the host stopped answering")
    return Cause(UNKNOWN, "nothing in the signal names a cause")


def _from_xids(codes: list[int], tbl: CauseTable) -> Cause:
    def rank(code: int) -> int:
        info = tbl.xids.get(code)
        return SEVERITY.index(info.fault_class if info else UNKNOWN)

    code = min(codes, key=rank)
    info = tbl.xids.get(code)
    if info is None:
        return Cause(UNKNOWN, f"xid {code} (not in the catalogue)", xid=code)
    text = f"xid {code} ({info.name}; NVIDIA: {info.nvidia})"
    if info.fault_class == APP:
        return Cause(info.repeat_class or "software", f"{text}: application-level", xid=code, app_level=True,
                     repeat_class=info.repeat_class or "software")
    return Cause(info.fault_class, text, xid=code)


# ------------------------------------------------------------------------------------- ladders


def ladder(fault_class: str | None, faults: FaultSettings, workflow: WorkflowSettings, *,
           gpu_reset: bool) -> tuple[str, ...]:
    """The class's actions in order. No class, or classification off, is class ``unknown``, whose
    ladder is workflow.ladder unless the site wrote one (``policy.faults.ladders.unknown``; a drain-only
    profile holds every class).
    ``gpu_reset``: a job can run on the node (``validation.runs_jobs``); without that a ``gpu-reset``
    rung is left out, and the ladder starts at its next action."""
    info = table(faults).classes.get(fault_class if fault_class and faults.classify else UNKNOWN)
    return tuple(workflow.ladder) if info is None or info.ladder is None else runnable(info.ladder, gpu_reset)


def runnable(actions: tuple[str, ...], gpu_reset: bool) -> tuple[str, ...]:
    """The written actions this site can take (a ladder left empty ends in quarantine, as every one does)."""
    return actions if gpu_reset else tuple(a for a in actions if a != GPU_RESET) or ("quarantine",)


def action_rungs(fault_class: str | None, faults: FaultSettings, workflow: WorkflowSettings, *,
                 gpu_reset: bool) -> tuple[str, ...]:
    """The ladder's rungs: what vm_restart climbs (a GPU reset, machine actions); quarantine follows the
    last one. A class without any holds for a human or is quarantined at once."""
    return tuple(a for a in ladder(fault_class, faults, workflow, gpu_reset=gpu_reset)
                 if a not in (HOLD, QUARANTINE))


def first_action(fault_class: str | None, faults: FaultSettings, workflow: WorkflowSettings, *,
                 gpu_reset: bool) -> str:
    return ladder(fault_class, faults, workflow, gpu_reset=gpu_reset)[0]


def action_at(fault_class: str | None, faults: FaultSettings, workflow: WorkflowSettings, *, rung: int,
              gpu_reset: bool) -> str:
    """The action of ladder rung ``rung`` (past the machine actions and a GPU reset: quarantine)."""
    rungs = action_rungs(fault_class, faults, workflow, gpu_reset=gpu_reset)
    if not rungs:
        return first_action(fault_class, faults, workflow, gpu_reset=gpu_reset)
    return rungs[rung] if rung < len(rungs) else "quarantine"


def planned_action(cause: Cause | None, faults: FaultSettings, *, gpu_reset: bool) -> str | None:
    """The first action of the cause's class when the class has a ladder of its own (None: class
    unknown, the site's workflow.ladder decides when the workflow starts)."""
    if cause is None or not faults.classify:
        return None
    info = table(faults).classes.get(cause.fault_class)
    return runnable(info.ladder, gpu_reset)[0] if info is not None and info.ladder else None


def needs_rma(fault_class: str | None, faults: FaultSettings) -> bool:
    info = table(faults).classes.get(fault_class or UNKNOWN)
    return bool(info and info.rma and faults.classify)


def urgent(fault_class: str | None) -> bool:
    """Whether the class is marked urgent in the shipped table: its jobs get no checkpoint request."""
    info = shipped().classes.get(fault_class or UNKNOWN)
    return bool(info and info.urgent)


# A move to fresh hardware, per cloud: Azure redeploys; a GCE or EC2 stop and start lands on a new host.
_MOVE_HOST = {"azure": VMAction.REDEPLOY}


def to_machine_action(action: str, provider: str | None) -> VMAction:
    """A ladder action as the machine backend's action (``move-host`` depends on the cloud)."""
    if action == "move-host":
        return _MOVE_HOST.get(provider or "", VMAction.STOP_START)
    return VMAction(action)
