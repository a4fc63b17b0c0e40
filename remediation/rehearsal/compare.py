"""Two policies, one trace: the side-by-side rehearsal behind ``remediation simulate --baseline``.

The same faults (same seed, same outcome draws) go through :func:`remediation.rehearsal.run.rehearse`
once per policy. The comparison is made only on figures the world measured (VM actions that fixed
nothing, node-hours out, faults fixed automatically, quarantines, VM actions on fabric faults, pages),
and each ratio is candidate / baseline, so "0.25" reads "a quarter of the baseline's".
"""

from __future__ import annotations

from typing import Any

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
