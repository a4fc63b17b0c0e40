"""Typed settings, one module per section.

Each section is a pydantic model in a module of its own, with every field's unit and the reason its
default is safe; :mod:`remediation.settings.loader` puts them together as :class:`Settings`. The names
below are the package's public face: ``from remediation.settings import PolicySettings`` works for
every one of them.

Why: docs/architecture.md#settings-one-section-a-module-bad-config-fails-loudly
"""

from remediation.settings.api import ApiSettings, ApiToken
from remediation.settings.base import Section, SettingsError
from remediation.settings.broker import BrokerSettings
from remediation.settings.database import DatabaseSettings
from remediation.settings.faults import FaultSettings
from remediation.settings.health import HealthSettings
from remediation.settings.incidents import IncidentSettings
from remediation.settings.kube import KubeSettings
from remediation.settings.lemon import LemonSettings
from remediation.settings.loader import CONFIG_ENV, Settings, load_settings, overlay
from remediation.settings.machine import MachineSettings
from remediation.settings.memory import MemoryWorldSettings
from remediation.settings.notify import NotifySettings
from remediation.settings.policy import PolicySettings
from remediation.settings.profiles import EffectivePolicy, ProfileSelect, ProfileSettings
from remediation.settings.redfish import RedfishSettings
from remediation.settings.retention import RetentionSettings, parse_duration
from remediation.settings.slurm import SlurmSettings
from remediation.settings.validation import ValidationSettings
from remediation.settings.workflow import WorkflowSettings

__all__ = [
    "CONFIG_ENV",
    "ApiSettings",
    "ApiToken",
    "BrokerSettings",
    "SettingsError",
    "DatabaseSettings",
    "FaultSettings",
    "HealthSettings",
    "IncidentSettings",
    "KubeSettings",
    "LemonSettings",
    "NotifySettings",
    "PolicySettings",
    "EffectivePolicy",
    "ProfileSelect",
    "ProfileSettings",
    "RedfishSettings",
    "MemoryWorldSettings",
    "RetentionSettings",
    "Section",
    "Settings",
    "SlurmSettings",
    "ValidationSettings",
    "MachineSettings",
    "WorkflowSettings",
    "load_settings",
    "overlay",
    "parse_duration",
]
