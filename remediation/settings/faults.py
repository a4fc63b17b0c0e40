"""``policy.faults``: cause classification, the class of each fault and its ladder
(``REMEDIATION_POLICY__FAULTS__*``). The class and action names are checked against
:mod:`remediation.vocabulary`."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from remediation.settings.base import Section
from remediation.vocabulary import APP, FAULT_ACTIONS, FAULT_CLASSES, GPU_RESET, RENAMED_ACTIONS


class FaultSettings(Section):
    """Cause classification: the signal names the cause, the cause's class picks the first
    action and the ladder. Defaults ship as data with their sources in ``remediation/data/causes.yaml``;
    each field here overrides part of that table (docs/policy.md, "Fault classes")."""

    classify: bool = Field(
        True,
        description="Read the cause from each signal and use its class's ladder. Off: every fault is "
        "`unknown` and climbs workflow.ladder, and application-level XIDs are remediated like any "
        "other fault (the behaviour before cause classification).",
    )
    ladders: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Per class, the actions tried in order, replacing the shipped ladder, e.g. "
        "{'gpu-memory': ['move-host', 'quarantine']}. Actions: gpu-reset (nvidia-smi -r as a job on "
        "the node; before any reboot; left out where validation.backend is none), restart, move-host, "
        "reimage, hold (only on its own: drain, no VM action, page on-call, hold for a human; 'none' is "
        "read as its old name), quarantine (only last; implied after the last action anyway). Class "
        "`unknown` follows workflow.ladder.",
    )
    xids: dict[int, str] = Field(
        default_factory=dict,
        description="XID code -> class (or 'app': application-level, recorded and not remediated "
        "unless it repeats), overriding NVIDIA's catalogue as shipped.",
    )
    conditions: dict[str, str] = Field(
        default_factory=dict,
        description="Kubernetes condition type -> class: aliases for a site's own detectors (a "
        "condition must also be listed in policy.kube_conditions to open anything).",
    )
    app_xid_repeat_count: int = Field(
        3,
        ge=1,
        description="An application-level XID (NVIDIA: RESTART_APP or IGNORE, e.g. 13, 31, 43, 45) is "
        "remediated only when it is this node's Nth within app_xid_repeat_window_s (this one "
        "included); before that it is recorded with decision `app_xid`. 1 = always remediate.",
    )
    app_xid_repeat_window_s: int = Field(
        24 * 3600, ge=60, description="Seconds: the window of app_xid_repeat_count (24 h)."
    )

    @field_validator("ladders")
    @classmethod
    def _ladders(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        value = {name: [RENAMED_ACTIONS.get(a, a) for a in ladder] for name, ladder in value.items()}
        for name, ladder in value.items():
            if name not in FAULT_CLASSES:
                raise ValueError(f"unknown fault class {name!r}; choose from {list(FAULT_CLASSES)}")
            bad = [a for a in ladder if a not in FAULT_ACTIONS]
            if bad or not ladder:
                raise ValueError(f"{name}: unknown action(s) {bad}; choose from {list(FAULT_ACTIONS)}")
            if "hold" in ladder and ladder != ["hold"]:
                raise ValueError(f"{name}: 'hold' holds for a human, so it must be the only action")
            if "quarantine" in ladder[:-1]:
                raise ValueError(f"{name}: 'quarantine' ends a ladder, so it can only be last")
            if GPU_RESET in ladder and ladder.index(GPU_RESET) > 0:
                raise ValueError(f"{name}: '{GPU_RESET}' comes before any reboot (a reboot resets every GPU), "
                                 "so it can only be first")
        return value

    @field_validator("xids", "conditions")
    @classmethod
    def _classes(cls, value: dict[Any, str]) -> dict[Any, str]:
        for key, name in value.items():
            if name not in (*FAULT_CLASSES, APP):
                raise ValueError(f"{key}: unknown fault class {name!r}; choose from {[*FAULT_CLASSES, APP]}")
        return value
