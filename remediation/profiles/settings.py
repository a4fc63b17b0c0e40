"""``profiles``: policy per node group, an ordered list.

Each profile selects nodes (Slurm partitions, features, a hostlist, a Node label selector) and
overrides the fields :data:`OVERRIDABLE` lists, validated by each section's own model
(:func:`effective`). :class:`EffectivePolicy` is what one node is governed by; a remediation records it
when it opens and reads it back until it ends.

Why: docs/policy.md#profiles-policy-per-node-group
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from remediation.hostlist import HostlistError, expand
from remediation.incidents.settings import IncidentSettings
from remediation.settings.base import Section
from remediation.settings.machine import MachineSettings
from remediation.settings.policy import PolicySettings
from remediation.settings.selector import parse_selector
from remediation.settings.workflow import WorkflowSettings
from remediation.validation.settings import ValidationSettings
from remediation.vocabulary import FAULT_CLASSES


class Mode(StrEnum):
    """What a profile does with its nodes' faults (see :class:`Profile`)."""

    ACT = "act"
    SHADOW = "shadow"
    DRAIN_ONLY = "drain-only"
    OFF = "off"

#: A profile's name: a metric label value and part of its breaker's control row, so short and plain.
PROFILE_NAME = r"^[a-z0-9]([a-z0-9_-]{0,46}[a-z0-9])?$"
MODES: tuple[Mode, ...] = tuple(Mode)

#: Section -> the fields a profile may override. Adding a field here is all it takes to make it
#: per profile: the recorded policy, ``policy explain`` and the checks follow.
OVERRIDABLE: dict[str, tuple[str, ...]] = {
    "policy": (
        "repeat_offender_count",
        "repeat_offender_window_s",
        "max_concurrent",
        "breaker_max_fraction",
        "breaker_min_failures",
        "breaker_window_s",
        "breaker_auto_close_s",
        "faults",
        "lemon",
    ),
    "workflow": (
        "drain_timeout_s",
        "on_jobs_timeout",
        "evict_timeout_s",
        "vm_operation_timeout_s",
        "verify_timeout_s",
        "unproven",
        "ladder",
        "checkpoint_signal",
        "checkpoint_wait_s",
        "checkpoint_scope",
        "checkpoint_classes",
        "checkpoint_pods",
    ),
    "machine": ("backend",),
    "validation": ("backend", "checks", "timeout_s", "slurm_partition"),
    "incidents": ("enabled", "min_nodes", "min_fraction", "min_nodes_by_kind"),
}
SECTIONS = tuple(OVERRIDABLE)


class ProfileSelect(Section):
    """Which nodes a profile selects. Every criterion given must hold (a node in one of the partitions
    *and* carrying all the features ...); at least one must be given."""

    partitions: list[str] = Field(
        default_factory=list, description="Slurm partitions: a node in any of them."
    )
    features: list[str] = Field(
        default_factory=list,
        description="Slurm node features (AvailableFeatures): a node carrying all of them.",
    )
    hostlist: str | None = Field(None, description="A Slurm hostlist of node names, e.g. gpu-[001-128].")
    labels: str | None = Field(
        None,
        description="A Kubernetes Node label selector, e.g. 'pool=inference,nvidia.com/gpu.product in "
        "(NVIDIA-H100-80GB-HBM3)'; needs the Kubernetes watcher (it reads the Node's labels).",
    )

    @field_validator("hostlist")
    @classmethod
    def _hostlist(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                expand(value)
            except HostlistError as exc:
                raise ValueError(f"malformed hostlist {value!r}: {exc}") from None
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_selector(value)
            except ValueError as exc:
                raise ValueError(f"malformed label selector {value!r}: {exc}") from None
        return value

    @model_validator(mode="after")
    def _something(self) -> ProfileSelect:
        if not (self.partitions or self.features or self.hostlist or self.labels):
            raise ValueError("select names no node: give partitions, features, hostlist or labels")
        return self


class ProfileSettings(Section):
    """One node group and what it overrides."""

    name: str = Field(
        pattern=PROFILE_NAME,
        description="Shown everywhere (CLI, API, dashboard, the metrics' profile label).",
    )
    select: ProfileSelect
    mode: Mode = Field(
        Mode.ACT,
        description="act: remediate; shadow: record what would be done (dry-run, for this group "
        "only, marked as such); drain-only: drain in Slurm and hold for a human, no machine action; "
        "off: record events, open nothing.",
    )
    policy: dict[str, Any] = Field(default_factory=dict, description="Overrides of the policy section.")
    workflow: dict[str, Any] = Field(default_factory=dict, description="Overrides of the workflow section.")
    machine: dict[str, Any] = Field(
        default_factory=dict,
        description="Overrides of the machine section: "
        "backend, the hammer, over what the providerID or BMC inventory implies.",
    )
    validation: dict[str, Any] = Field(
        default_factory=dict, description="Overrides of the validation section."
    )
    incidents: dict[str, Any] = Field(default_factory=dict, description="Overrides of the incidents section.")

    @field_validator(*SECTIONS)
    @classmethod
    def _overridable(cls, value: dict[str, Any], info: Any) -> dict[str, Any]:
        allowed = OVERRIDABLE[info.field_name]
        unknown = [k for k in value if k not in allowed]
        if unknown:
            raise ValueError(
                f"unknown field(s) {unknown}; a profile may override {info.field_name}: {', '.join(allowed)}"
            )
        return value

    def overrides(self) -> dict[str, dict[str, Any]]:
        """Section -> the fields this profile sets (the sections it leaves alone are left out). A
        drain-only profile holds every fault class for a human: its ladders are all ``hold``."""
        out = {s: dict(getattr(self, s)) for s in SECTIONS if getattr(self, s)}
        if self.mode == Mode.DRAIN_ONLY:
            policy = out.setdefault("policy", {})
            policy["faults"] = {**policy.get("faults", {}), "ladders": {c: ["hold"] for c in FAULT_CLASSES}}
        return out


@dataclass(frozen=True)
class EffectivePolicy:
    """What governs one node: the base sections with its profile's overrides merged in."""

    profile: str | None
    mode: Mode
    policy: PolicySettings
    workflow: WorkflowSettings
    machine: MachineSettings
    validation: ValidationSettings
    incidents: IncidentSettings

    def dump(self) -> dict[str, Any]:
        """The record a remediation keeps: every field's value, never a secret (the machine section is
        recorded by its backend only; its endpoints and test token are the service's, not the policy's)."""
        return {
            "profile": self.profile,
            "mode": self.mode,
            "policy": self.policy.model_dump(mode="json"),
            "workflow": self.workflow.model_dump(mode="json"),
            "machine": {"backend": self.machine.backend},
            "validation": self.validation.model_dump(mode="json"),
            "incidents": self.incidents.model_dump(mode="json"),
        }

    @classmethod
    def load(cls, record: dict[str, Any], machine: MachineSettings) -> EffectivePolicy:
        """Read a recorded policy back. ``machine`` is today's section (endpoints, credentials), under
        the recorded backend. A field a later release dropped is ignored; one it added takes its default."""

        def section(model: type[Section], data: dict[str, Any]) -> Any:
            return model.model_validate({k: v for k, v in data.items() if k in model.model_fields})

        return cls(
            record.get("profile"),
            Mode(record.get("mode", Mode.ACT)),
            section(PolicySettings, record["policy"]),
            section(WorkflowSettings, record["workflow"]),
            machine.model_copy(update={"backend": record["machine"]["backend"]}),
            section(ValidationSettings, record["validation"]),
            section(IncidentSettings, record["incidents"]),
        )


def effective(base: EffectivePolicy, profile: ProfileSettings | None) -> EffectivePolicy:
    """``base`` with ``profile``'s overrides merged in (nested sections field by field), each section
    validated by its own model. Raises ValueError naming ``profiles.NAME.SECTION.FIELD``."""
    if profile is None:
        return base
    merged: dict[str, Any] = {}
    overrides = profile.overrides()
    for name in SECTIONS:
        current: Section = getattr(base, name)
        override = overrides.get(name)
        if not override:
            merged[name] = current
            continue
        try:
            merged[name] = type(current).model_validate(deep_merge(current.model_dump(), override))
        except ValidationError as exc:
            errors = [
                f"profiles.{profile.name}.{name}.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                for e in exc.errors()
            ]
            raise ValueError("\n  ".join(errors)) from None
    return EffectivePolicy(profile.name, profile.mode, **merged)


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` laid over it: mappings merge key by key, anything else is replaced."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
