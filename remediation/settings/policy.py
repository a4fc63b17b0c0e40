"""``policy``: which signals open a remediation and how much automation may do at once
(``REMEDIATION_POLICY__*``).

Why: docs/policy.md#policy-defaults-and-why
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, field_validator

from remediation.settings.base import Section
from remediation.settings.faults import FaultSettings
from remediation.settings.lemon import LemonSettings


class PolicySettings(Section):
    """Which signals open a remediation and how much automation may do at once."""

    slurm_states: list[str] = Field(
        ["DOWN", "DRAIN", "FAIL", "NOT_RESPONDING"],
        description="Slurm base states or flags that open a remediation.",
    )
    kube_conditions: list[str] = Field(
        ["Ready=False", "Ready=Unknown", "GpuHealthy=False", "GpuXidError=True", "KernelDeadlock=True"],
        description="Kubernetes Node conditions (Type=Status) that open a remediation once they have "
        "held for kube.min_condition_s.",
    )
    our_reason_prefix: str = Field(
        "remediation:",
        description="Prefix of every Slurm reason we set. Drains carrying it are ours; any other drain "
        "belongs to a human and is never resumed by the service.",
    )
    ignore_reasons: list[str] = Field(
        [r"(?i)^\s*maint", r"(?i)planned", r"(?i)\bpsu\b", r"(?i)^\s*admin"],
        description="Regular expressions over a human's Slurm reason. A matching drain is recorded but "
        "never remediated (maintenance is a human's job).",
    )
    repeat_offender_count: int = Field(
        3,
        ge=1,
        description="N: a node with N failures (this one included) within the window is quarantined "
        "instead of restarted again.",
    )
    repeat_offender_window_s: int = Field(
        7 * 24 * 3600, ge=60, description="W, seconds: the repeat-offender window (7 days)."
    )
    settle_s: float = Field(
        600.0,
        ge=0,
        description="Seconds after a remediation closes during which signals its own actions cause "
        "(the reboot's Ready=Unknown/False, NOT_RESPONDING or DOWN in Slurm, our drain) are still "
        "attributed to it instead of counted as a new fault. The window itself is anchored to the "
        "remediation's VM action, however long the reboot takes (GPU VMs often need more than 5 "
        "minutes); this period only covers late delivery: a condition held for kube.min_condition_s "
        "(300 s) plus one watcher resync (300 s). Longer is safe: only a signal that began inside "
        "the remediation's disruption window can be attributed, so a new fault is never hidden by it.",
    )
    max_concurrent: int = Field(
        4,
        ge=1,
        description="At most this many remediations may be in their VM phase (restart and verify) at once.",
    )
    breaker_max_fraction: float = Field(
        0.10,
        gt=0,
        le=1,
        description="Storm breaker: open when more than this fraction of the pool has failed within "
        "breaker_window_s. While open, nodes are still drained in Slurm but VM actions wait.",
    )
    breaker_min_failures: int = Field(
        3, ge=1, description="The breaker never opens on fewer failed nodes than this (small pools)."
    )
    breaker_window_s: int = Field(600, ge=10, description="Sliding window of the storm breaker, seconds.")
    pool_stale_s: float = Field(
        900.0, gt=0,
        description="A node that the watcher resyncs of this many seconds before the latest one did not "
        "list leaves the pool the storm breaker divides by (its row and history stay; a stopped watcher "
        "confirms nobody, so nobody leaves). 900 s is 15 Slurm resyncs at the default 60 s "
        "and three Kubernetes relists at 300 s: a missed resync or a watcher restart never shrinks the "
        "pool, a node removed from the cluster stops diluting the breaker within a quarter hour.",
    )
    breaker_auto_close_s: float | None = Field(
        None,
        gt=0,
        description="Seconds, or unset (default: off). Once open, the storm breaker latches: it stays "
        "open until a human runs `remediation breaker close -r REASON`. With this set it also closes by "
        "itself once the window no longer trips it and no node has failed for this long. Off is the "
        "safe default: a correlated fault, a detector bug or an apiserver partition looks quiet too, "
        "and only a human can tell them from a storm that is over.",
    )
    min_restart_gap_s: float = Field(
        10.0, ge=0, description="Minimum seconds between two VM actions anywhere in the cluster."
    )
    faults: FaultSettings = Field(
        default_factory=FaultSettings,
        description="Cause classification: the class of each fault picks its first action and ladder.",
    )
    lemon: LemonSettings = Field(
        default_factory=LemonSettings,
        description="Lemon scoring: quarantine a node whose decayed, class-weighted failures add up.",
    )
    probe_successes: int = Field(
        3,
        ge=1,
        description="A pause caused by a fault that heals by itself (slurmctld unreachable, munge down) "
        "is lifted after the failed component answers this many health probes in a row (one per "
        "workflow.sweep_interval_s). Three answers in a row outlast a controller that flaps while it "
        "restarts; a credential, permission, quota or configuration fault is never lifted this way, "
        "only by a human's `remediation resume`.",
    )

    @field_validator("ignore_reasons")
    @classmethod
    def _regexes_compile(cls, value: list[str]) -> list[str]:
        import re

        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from exc
        return value

    @field_validator("kube_conditions")
    @classmethod
    def _conditions_have_status(cls, value: list[str]) -> list[str]:
        for item in value:
            if item.count("=") != 1 or not all(item.split("=")):
                raise ValueError(f"condition {item!r} must look like Type=Status, e.g. Ready=False")
        return value

    @property
    def repeat_offender_window(self) -> timedelta:
        return timedelta(seconds=self.repeat_offender_window_s)

    @property
    def breaker_window(self) -> timedelta:
        return timedelta(seconds=self.breaker_window_s)

    @property
    def pool_stale(self) -> timedelta:
        return timedelta(seconds=self.pool_stale_s)
