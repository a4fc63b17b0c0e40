"""``cluster`` and ``clusters``: which cluster a process is, and what the workers serve.

A watcher watches one cluster, named by ``cluster.name`` (``REMEDIATION_CLUSTER__NAME``). Workers serve
one cluster when ``clusters`` is empty (today's configuration, under ``cluster.name``), and every entry
of ``clusters`` when it is not. An entry's adapter sections are its own: one it leaves out takes the
section's defaults, never another cluster's, so no credential or endpoint is shared by accident.

Why: docs/architecture.md#one-service-many-clusters
"""

from __future__ import annotations

from pydantic import Field, field_validator

from remediation.profiles.settings import ProfileSettings
from remediation.settings.base import Section
from remediation.settings.kube import KubeSettings
from remediation.settings.machine import MachineSettings
from remediation.settings.memory import MemoryWorldSettings
from remediation.settings.redfish import RedfishSettings
from remediation.settings.slurm import SlurmSettings
from remediation.validation.settings import ValidationSettings
from remediation.vocabulary import DEFAULT_CLUSTER, checked_cluster

#: The sections each cluster has its own of; every other section is the fleet's.
CLUSTER_SECTIONS = ("slurm", "kube", "machine", "validation", "redfish", "profiles", "memory")


class ClusterSettings(Section):
    """This process's cluster, and whether one cluster's latch holds them all."""

    name: str = Field(DEFAULT_CLUSTER, description="The cluster a watcher watches (and the workers serve "
                      "when `clusters` is empty); a DNS label. Unset: `default`.")
    fleet_latch: bool = Field(False, description="A storm breaker opened, or automation paused, in any "
                              "cluster holds every cluster's disruptive steps too. Off: each cluster "
                              "is held by its own latch and pause only.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return checked_cluster(value)


class ClusterEntry(Section):
    """One cluster the workers serve, with its own adapters and profiles."""

    name: str = Field(description="The cluster's name, on every row, event and metric; a DNS label.")
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    kube: KubeSettings = Field(default_factory=KubeSettings)
    machine: MachineSettings = Field(default_factory=MachineSettings)
    validation: ValidationSettings = Field(default_factory=ValidationSettings)
    redfish: RedfishSettings = Field(default_factory=RedfishSettings)
    profiles: list[ProfileSettings] = Field(default_factory=list)
    memory: MemoryWorldSettings = Field(default_factory=MemoryWorldSettings)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return checked_cluster(value)
