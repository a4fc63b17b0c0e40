"""Two policies, one trace: the side-by-side rehearsal behind ``remediation rehearse --baseline``.

The same faults (same seed, same outcome draws) run once per policy; only figures the world measured
are compared, each ratio candidate / baseline. ``--gpu-reset`` compares one policy with and without
the gpu-reset rung (:func:`with_reset`, :func:`without_reset`), node-hours out per fault class
(:func:`by_class`).

Why: docs/rehearsal.md#the-gpu-reset
"""

from __future__ import annotations

from typing import Any

from remediation.domain.causes import ladder
from remediation.settings import Settings
from remediation.vocabulary import FAULT_CLASSES, GPU_RESET

#: The figures compared, each with whether lower is better.
COMPARED = {
    "vm_actions_total": True,
    "wasted_vm_actions": True,
    "node_hours_out": True,
    "auto_fixed": False,
    "quarantined": True,
    "fabric_vm_actions": True,
    "fabric_quarantines": True,
    "incidents": False,
    "pages": True,
}


def figures(report: dict[str, Any]) -> dict[str, float]:
    """The compared figures of one simulate report (``Report.as_dict()``)."""
    out = {k: report[k] for k in COMPARED if k in report and k != "quarantined"}
    out["quarantined"] = len(report.get("quarantined", ()))
    return out


def ratios(candidate: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float | None]:
    """candidate / baseline for every compared figure; None where the baseline is 0."""
    c, b = figures(candidate), figures(baseline)
    return {k: (round(c[k] / b[k], 3) if b.get(k) else None) for k in c}


def with_reset(settings: Settings) -> Settings:
    """``settings`` with jobs on the node (``validation.backend``), so that the gpu-reset rung is planned."""
    if settings.validation.runs_jobs:
        return settings
    return settings.model_copy(update={"validation": settings.validation.model_copy(update={"backend": "kubernetes"})})


def without_reset(settings: Settings) -> Settings:
    """``with_reset(settings)`` with the gpu-reset rung taken out of every ladder that starts with it: the
    same GPU check after every action, only the reset missing."""
    s = with_reset(settings)
    faults, wf = s.policy.faults, s.workflow
    ladders = {c: list(ladder(c, faults, wf, gpu_reset=False)) for c in FAULT_CLASSES
               if ladder(c, faults, wf, gpu_reset=True)[:1] == (GPU_RESET,)}
    faults = faults.model_copy(update={"ladders": {**faults.ladders, **ladders}})
    return s.model_copy(update={"policy": s.policy.model_copy(update={"faults": faults})})


def by_class(with_: dict[str, Any], without: dict[str, Any]) -> list[tuple[str, float, float]]:
    """Node-hours out per fault class with and without the reset, the classes of either, by name."""
    a, b = with_["node_hours_by_class"], without["node_hours_by_class"]
    return [(c, a.get(c, 0.0), b.get(c, 0.0)) for c in sorted(set(a) | set(b))]
