"""The whole settings, and the one place that maps environment, config file and defaults onto them.

Precedence (highest first): constructor arguments, environment variables (``REMEDIATION_`` prefix,
``__`` between nested sections, e.g. ``REMEDIATION_POLICY__MAX_CONCURRENT=4``), the config file named
by ``REMEDIATION_CONFIG`` (YAML or TOML), then the defaults below.

Every default is chosen to be safe on a production GPU cluster: when in doubt the service waits, drains
and asks a human rather than restarting VMs. The reasons for the policy defaults are in ``docs/policy.md``
(drawn from the published failure traces of large GPU clusters).

Bad config fails at start-up with :class:`SettingsError`, whose message names the offending field and
never echoes a secret's value. The sections themselves live in the modules beside this one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from remediation.settings.api import ApiSettings
from remediation.settings.base import SettingsError
from remediation.settings.broker import BrokerSettings
from remediation.settings.database import DatabaseSettings
from remediation.settings.health import HealthSettings
from remediation.settings.incidents import IncidentSettings
from remediation.settings.kube import KubeSettings
from remediation.settings.notify import NotifySettings
from remediation.settings.policy import PolicySettings
from remediation.settings.retention import RetentionSettings
from remediation.settings.sim import SimSettings
from remediation.settings.slurm import SlurmSettings
from remediation.settings.validation import ValidationSettings
from remediation.settings.vm import VMSettings
from remediation.settings.workflow import WorkflowSettings

CONFIG_ENV = "REMEDIATION_CONFIG"


class Settings(BaseSettings):
    """All settings of node-remediation. See the class docstrings of each section."""

    model_config = SettingsConfigDict(
        env_prefix="REMEDIATION_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    dry_run: bool = Field(
        False,
        description="Swap every adapter that acts for its no-op twin: everything is recorded, nothing "
        "is changed in Slurm, Kubernetes or the cloud.",
    )
    actor: str = Field("remediation", description="Name recorded as the actor of automated actions.")
    log_level: str = Field("INFO", description="Python logging level of every process (DEBUG, INFO, "
                           "WARNING, ERROR); Celery's --loglevel and uvicorn's are this one.")
    log_format: Literal["text", "json"] = Field(
        "text", description="text: one readable line per record; json: one JSON object per line "
        "(level, message, logger, time and the record's fields), for a log pipeline.",
    )
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    workflow: WorkflowSettings = Field(default_factory=WorkflowSettings)
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    kube: KubeSettings = Field(default_factory=KubeSettings)
    vm: VMSettings = Field(default_factory=VMSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    notify: NotifySettings = Field(default_factory=NotifySettings)
    sim: SimSettings = Field(default_factory=SimSettings)
    incidents: IncidentSettings = Field(default_factory=IncidentSettings)
    validation: ValidationSettings = Field(default_factory=ValidationSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        level = value.strip().upper()
        if level not in ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"):
            raise ValueError("choose DEBUG, INFO, WARNING, ERROR or CRITICAL")
        return level

    @model_validator(mode="after")
    def _cross_checks(self) -> Settings:
        if self.workflow.max_wait_s >= self.broker.visibility_timeout_s:
            raise ValueError(
                "workflow.max_wait_s must be below broker.visibility_timeout_s, or Redis would "
                "deliver a waiting task twice"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = os.environ.get(CONFIG_ENV)
        if path:
            sources.append(_file_source(settings_cls, Path(path)))
        return tuple(sources)


def _file_source(settings_cls: type[BaseSettings], path: Path) -> PydanticBaseSettingsSource:
    if not path.is_file():
        raise SettingsError(f"{CONFIG_ENV}={path}: no such config file")
    if path.suffix in (".yaml", ".yml"):
        return YamlConfigSettingsSource(settings_cls, yaml_file=path)
    if path.suffix == ".toml":
        return TomlConfigSettingsSource(settings_cls, toml_file=path)
    raise SettingsError(f"{CONFIG_ENV}={path}: config file must end in .yaml, .yml or .toml")


def load_settings(**overrides: Any) -> Settings:
    """Load and validate settings, turning pydantic's report into one readable SettingsError."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "settings"
            value = err.get("input")
            # A section-level check's input is the whole section, tokens included: never echo it.
            got = "" if isinstance(value, dict) else f" (got {value!r})"
            lines.append(f"{field}: {err['msg']}{got}")
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(lines)) from None
    except Exception as exc:  # YAML/TOML syntax errors and non-JSON list values surface here
        if isinstance(exc, SettingsError):
            raise
        bad = _non_json_env()
        if bad:
            raise SettingsError("invalid configuration:\n  " + "\n  ".join(bad)) from None
        raise SettingsError(f"cannot read configuration: {exc}") from exc


def _non_json_env() -> list[str]:
    """Name the environment variables whose field wants a list or mapping but whose value is not JSON
    (pydantic-settings only names the section)."""
    out = []
    for key, value in sorted(os.environ.items()):
        if not key.startswith("REMEDIATION_") or key == CONFIG_ENV:
            continue
        model: Any = Settings
        path = key.removeprefix("REMEDIATION_").lower().split("__")
        for part in path:
            field = getattr(model, "model_fields", {}).get(part)
            if field is None:
                break
            model = field.annotation
        else:
            origin = getattr(model, "__origin__", None)
            if origin in (list, dict) or (isinstance(model, type) and issubclass(model, BaseModel)):
                try:
                    json.loads(value)
                except ValueError:
                    kind = "a JSON list, e.g. [\"a\", \"b\"]" if origin is list else "a JSON object"
                    out.append(f"{'.'.join(path)}: {key} must be {kind} (got {value[:60]!r})")
    return out


def overlay(base: Settings, path: Path) -> Settings:
    """``base`` with a second config file laid over it (a rehearsal's baseline policy): the file's
    sections replace the base's field by field, the rest stays as ``base`` has it."""
    if not path.is_file():
        raise SettingsError(f"{path}: no such config file")
    if path.suffix not in (".yaml", ".yml"):
        raise SettingsError(f"{path}: a policy file must end in .yaml or .yml")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path}: not valid YAML ({exc.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: a policy file is a mapping of settings sections")

    def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out = dict(a)
        for key, value in b.items():
            out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out

    return load_settings(**merge(base.model_dump(), data))
