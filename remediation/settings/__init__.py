"""Typed settings, one module per section.

Each section is a pydantic model in a module of its own, with every field's unit and the reason its
default is safe; :mod:`remediation.settings.loader` puts them together as :class:`Settings`. The names
below are the package's public face: ``from remediation.settings import PolicySettings`` works for
every one of them. They load on first use, so a feature's own section (``remediation/profiles``) can
import the base without a cycle through the loader.

Why: docs/architecture.md#settings-one-section-a-module-bad-config-fails-loudly
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from remediation.incidents.settings import IncidentSettings as IncidentSettings
    from remediation.profiles.settings import EffectivePolicy as EffectivePolicy
    from remediation.profiles.settings import ProfileSelect as ProfileSelect
    from remediation.profiles.settings import ProfileSettings as ProfileSettings
    from remediation.settings.api import ApiSettings as ApiSettings
    from remediation.settings.api import ApiToken as ApiToken
    from remediation.settings.base import Section as Section
    from remediation.settings.base import SettingsError as SettingsError
    from remediation.settings.broker import BrokerSettings as BrokerSettings
    from remediation.settings.clusters import ClusterEntry as ClusterEntry
    from remediation.settings.clusters import ClusterSettings as ClusterSettings
    from remediation.settings.database import DatabaseSettings as DatabaseSettings
    from remediation.settings.faults import FaultSettings as FaultSettings
    from remediation.settings.health import HealthSettings as HealthSettings
    from remediation.settings.kube import KubeSettings as KubeSettings
    from remediation.settings.lemon import LemonSettings as LemonSettings
    from remediation.settings.loader import CONFIG_ENV as CONFIG_ENV
    from remediation.settings.loader import Settings as Settings
    from remediation.settings.loader import load_settings as load_settings
    from remediation.settings.loader import load_watched as load_watched
    from remediation.settings.loader import overlay as overlay
    from remediation.settings.machine import MachineSettings as MachineSettings
    from remediation.settings.memory import MemoryWorldSettings as MemoryWorldSettings
    from remediation.settings.notify import NotifySettings as NotifySettings
    from remediation.settings.policy import PolicySettings as PolicySettings
    from remediation.settings.redfish import RedfishSettings as RedfishSettings
    from remediation.settings.retention import RetentionSettings as RetentionSettings
    from remediation.settings.retention import parse_duration as parse_duration
    from remediation.settings.slurm import SlurmSettings as SlurmSettings
    from remediation.settings.workflow import WorkflowSettings as WorkflowSettings
    from remediation.validation.settings import ValidationSettings as ValidationSettings

# Where each public name is defined.
_WHERE = {
    "ApiSettings": "remediation.settings.api",
    "ApiToken": "remediation.settings.api",
    "BrokerSettings": "remediation.settings.broker",
    "CONFIG_ENV": "remediation.settings.loader",
    "ClusterEntry": "remediation.settings.clusters",
    "ClusterSettings": "remediation.settings.clusters",
    "DatabaseSettings": "remediation.settings.database",
    "EffectivePolicy": "remediation.profiles.settings",
    "FaultSettings": "remediation.settings.faults",
    "HealthSettings": "remediation.settings.health",
    "IncidentSettings": "remediation.incidents.settings",
    "KubeSettings": "remediation.settings.kube",
    "LemonSettings": "remediation.settings.lemon",
    "MachineSettings": "remediation.settings.machine",
    "MemoryWorldSettings": "remediation.settings.memory",
    "NotifySettings": "remediation.settings.notify",
    "PolicySettings": "remediation.settings.policy",
    "ProfileSelect": "remediation.profiles.settings",
    "ProfileSettings": "remediation.profiles.settings",
    "RedfishSettings": "remediation.settings.redfish",
    "RetentionSettings": "remediation.settings.retention",
    "Section": "remediation.settings.base",
    "Settings": "remediation.settings.loader",
    "SettingsError": "remediation.settings.base",
    "SlurmSettings": "remediation.settings.slurm",
    "ValidationSettings": "remediation.validation.settings",
    "WorkflowSettings": "remediation.settings.workflow",
    "load_settings": "remediation.settings.loader",
    "load_watched": "remediation.settings.loader",
    "overlay": "remediation.settings.loader",
    "parse_duration": "remediation.settings.retention",
}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    """Load a public name from its section module on first use (PEP 562)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
