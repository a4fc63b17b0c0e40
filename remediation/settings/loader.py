"""The whole settings, and the one place that maps environment, config file and defaults onto them.

Precedence (highest first): constructor arguments, environment variables (``REMEDIATION_`` prefix,
``__`` between sections; ``REMEDIATION_CLUSTERS__<NAME>__...`` for one field of a ``clusters`` entry),
the config file named by ``REMEDIATION_CONFIG`` (YAML or TOML), the defaults. Renamed sections are still read under their old names (``RENAMED_SECTIONS``). Bad config
raises :class:`SettingsError`, naming the field and never echoing a secret's value.

Why: docs/architecture.md#settings-one-section-a-module-bad-config-fails-loudly
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from remediation.evidence_collection.settings import EvidenceSettings
from remediation.incidents.settings import IncidentSettings
from remediation.profiles.settings import EffectivePolicy, Mode, ProfileSettings, deep_merge, effective
from remediation.repair_requests.settings import RepairSettings
from remediation.settings import backends
from remediation.settings.api import ApiSettings
from remediation.settings.base import SettingsError
from remediation.settings.broker import BrokerSettings
from remediation.settings.clusters import CLUSTER_SECTIONS, ClusterEntry, ClusterSettings
from remediation.settings.database import DatabaseSettings
from remediation.settings.health import HealthSettings
from remediation.settings.kube import KubeSettings
from remediation.settings.machine import MachineSettings
from remediation.settings.memory import MemoryWorldSettings
from remediation.settings.notify import NotifySettings
from remediation.settings.policy import PolicySettings
from remediation.settings.redfish import RedfishSettings
from remediation.settings.retention import RetentionSettings
from remediation.settings.slurm import SlurmSettings
from remediation.settings.workflow import WorkflowSettings
from remediation.validation.settings import ValidationSettings

CONFIG_ENV = "REMEDIATION_CONFIG"

#: Sections renamed, old name -> new name. Each source (arguments, environment, config file) reads the
#: old name as the new one, so a site's configuration outlives the rename.
RENAMED_SECTIONS = {"sim": "memory", "vm": "machine"}


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
    log_level: str = Field(
        "INFO",
        description="Python logging level of every process (DEBUG, INFO, "
        "WARNING, ERROR); Celery's --loglevel and uvicorn's are this one.",
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="text: one readable line per record; json: one JSON object per line "
        "(level, message, logger, time and the record's fields), for a log pipeline.",
    )
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    workflow: WorkflowSettings = Field(default_factory=WorkflowSettings)
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    kube: KubeSettings = Field(default_factory=KubeSettings)
    machine: MachineSettings = Field(default_factory=MachineSettings)
    redfish: RedfishSettings = Field(default_factory=RedfishSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    notify: NotifySettings = Field(default_factory=NotifySettings)
    memory: MemoryWorldSettings = Field(default_factory=MemoryWorldSettings)
    incidents: IncidentSettings = Field(default_factory=IncidentSettings)
    validation: ValidationSettings = Field(default_factory=ValidationSettings)
    evidence: EvidenceSettings = Field(default_factory=EvidenceSettings)
    repair: RepairSettings = Field(default_factory=RepairSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    profiles: list[ProfileSettings] = Field(
        default_factory=list,
        description="Policy per node group, in order: a node is governed by the first profile that "
        "selects it, and by the sections above when none does (docs/policy.md, 'Profiles').",
    )
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    clusters: list[ClusterEntry] = Field(
        default_factory=list,
        description="The clusters the workers serve, each with its own slurm, kube, machine, validation, "
        "redfish, profiles and memory sections (docs/running.md, 'Many clusters'). Empty: one cluster, "
        "`cluster.name`, with the sections above.",
    )

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
        refused = _twice("clusters", [c.name for c in self.clusters])
        for name, one in self.fleet().items():
            whose = f"clusters.{name}: " if self.clusters else ""
            refused += [whose + why for why in one._refusals()]
        if refused:
            raise ValueError("\n  ".join(refused))
        return self

    def _refusals(self) -> list[str]:
        """What this one cluster's settings cannot serve, base policy and every profile's."""
        def refusals(p: EffectivePolicy) -> list[str]:
            return [*backends.noop_outside_dry_run(self.dry_run, self.slurm, self.kube, machine=p.machine),
                    *backends.without_kubernetes(self.kube, p.machine, p.validation),
                    *backends.ladders_beyond_the_machine(p.machine, p.workflow, p.policy.faults),
                    *backends.checkpoint_without_signals(self.slurm, p.workflow)]

        refused = refusals(self.base_policy()) + _twice("profiles", [p.name for p in self.profiles])
        for profile in self.profiles:
            try:
                eff = effective(self.base_policy(), profile)
            except ValueError as exc:
                refused.append(str(exc))
                continue
            refused += [f"profiles.{profile.name}: {why}" for why in refusals(eff)]
        return refused

    def fleet(self) -> dict[str, Settings]:
        """Each cluster the workers serve, by name, with the settings that act on it."""
        if not self.clusters:
            return {self.cluster.name: self}
        return {entry.name: self._as(entry) for entry in self.clusters}

    def for_cluster(self, name: str) -> Settings:
        """The settings of cluster ``name`` (a watcher's: ``cluster.name``); SettingsError if none."""
        fleet = self.fleet()
        if name not in fleet:
            raise SettingsError(f"cluster.name: {name!r} is not among the clusters configured "
                                f"({', '.join(sorted(fleet))})")
        return fleet[name]

    def _as(self, entry: ClusterEntry) -> Settings:
        sections = {key: getattr(entry, key) for key in CLUSTER_SECTIONS}
        return self.model_copy(update={**sections, "clusters": [],
                                       "cluster": self.cluster.model_copy(update={"name": entry.name})})

    def base_policy(self) -> EffectivePolicy:
        """What governs a node no profile selects."""
        return EffectivePolicy(
            None, Mode.ACT, self.policy, self.workflow, self.machine, self.validation, self.incidents
        )

    def profile(self, name: str | None) -> ProfileSettings | None:
        """The profile called ``name`` (None for none, or for a name the config no longer has)."""
        return next((p for p in self.profiles if p.name == name), None)

    def policy_of(self, name: str | None) -> EffectivePolicy:
        """The effective policy of profile ``name`` as configured now (the base for None)."""
        return effective(self.base_policy(), self.profile(name))

    def under(self, policy: EffectivePolicy) -> Settings:
        """These settings with ``policy``'s sections in place of the base ones: what a remediation
        governed by ``policy`` reads, whatever the config says now."""
        return self.model_copy(
            update={
                "policy": policy.policy,
                "workflow": policy.workflow,
                "machine": policy.machine,
                "validation": policy.validation,
                "incidents": policy.incidents,
            }
        )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The old names' environment sits just below the new names', so the new name wins.
        sources: list[PydanticBaseSettingsSource] = [
            _Renamed(init_settings),
            _ListsWhole(env_settings),
            _Renamed(EnvSettingsSource(_OldNamesInEnv)),
        ]
        path = os.environ.get(CONFIG_ENV)
        if path:
            sources.append(_EntryFields(_Renamed(_file_source(settings_cls, Path(path)))))
        elif named := sorted(k for k in os.environ if k.upper().startswith(ENTRY_ENV)):
            raise SettingsError(f"{named[0]}: a field of a clusters entry, but {CONFIG_ENV} names no "
                                "config file to hold the entry")
        return tuple(sources)


def _twice(where: str, names: list[str]) -> list[str]:
    return [f"{where}: the name {n!r} is given twice" for n in sorted({n for n in names if names.count(n) > 1})]


class _OldNamesInEnv(BaseSettings):
    """The environment under the renamed sections' old names (``REMEDIATION_SIM__*``,
    ``REMEDIATION_VM__*``), parsed exactly as the new names are (JSON for lists and mappings)."""

    model_config = SettingsConfigDict(env_prefix="REMEDIATION_", env_nested_delimiter="__", extra="ignore")

    sim: MemoryWorldSettings | None = None
    vm: MachineSettings | None = None


class _Wrapped(PydanticBaseSettingsSource):
    """A source that reads another and changes what it read (:meth:`__call__`)."""

    def __init__(self, inner: PydanticBaseSettingsSource) -> None:
        super().__init__(inner.settings_cls)
        self.inner = inner

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self.inner.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        return self.inner()


class _Renamed(_Wrapped):
    """A source whose renamed sections are read under their new names (``RENAMED_SECTIONS``)."""

    def __call__(self) -> dict[str, Any]:
        return new_names(self.inner())


#: ``REMEDIATION_CLUSTERS__<NAME>__<SECTION>__<FIELD>``: one field of the config file's entry ``<name>``
#: (upper case, ``_`` for ``-``), e.g. its Slurm token from a Secret (docs/running.md, "Many clusters").
ENTRY_ENV = "REMEDIATION_CLUSTERS__"


class _ListsWhole(_Wrapped):
    """The environment, but ``clusters`` only as a whole JSON list: its per-entry variables
    (``ENTRY_ENV``) are fields of the config file's entries, laid on them by :class:`_EntryFields`."""

    def __call__(self) -> dict[str, Any]:
        data = self.inner()
        if isinstance(data.get("clusters"), dict):
            data.pop("clusters")
        return data


class _EntryFields(_Wrapped):
    """The config file with each ``ENTRY_ENV`` variable laid on the field of the entry it names."""

    def __call__(self) -> dict[str, Any]:
        return entry_fields(self.inner(), os.environ)


def entry_fields(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """``data`` with every ``ENTRY_ENV`` variable of ``environ`` set on its entry of ``clusters``;
    SettingsError naming the variable (never its value) when no entry or no field path is named."""
    entries = {str(e.get("name")).upper().replace("-", "_"): e
               for e in data.get("clusters") or [] if isinstance(e, dict)}  # fmt: skip
    for key in sorted(k for k in environ if k.upper().startswith(ENTRY_ENV)):
        name, *path = key[len(ENTRY_ENV):].split("__")
        if name.upper() not in entries or len(path) < 2:
            raise SettingsError(f"{key}: names no field of an entry of clusters in {CONFIG_ENV} "
                                f"(entries: {', '.join(sorted(entries)) or 'none'})")
        section = entries[name.upper()]
        for part in path[:-1]:
            section = section.setdefault(part.lower(), {})
            if not isinstance(section, dict):
                raise SettingsError(f"{key}: {part.lower()} is no section")
        section[path[-1].lower()] = environ[key]
    return data


def new_names(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every renamed section under its new name; where both names are given, the new
    one's fields win and the old one's fill the rest."""
    out = dict(data)
    for old, new in RENAMED_SECTIONS.items():
        if old not in out:
            continue
        value = out.pop(old)
        if isinstance(value, dict) and isinstance(out.get(new), dict):
            value = {**value, **out[new]}
        elif new in out:
            value = out[new]
        out[new] = value
    return out


def _file_source(settings_cls: type[BaseSettings], path: Path) -> PydanticBaseSettingsSource:
    if not path.is_file():
        raise SettingsError(f"{CONFIG_ENV}={path}: no such config file")
    if path.suffix in (".yaml", ".yml"):
        return YamlConfigSettingsSource(settings_cls, yaml_file=path)
    if path.suffix == ".toml":
        return TomlConfigSettingsSource(settings_cls, toml_file=path)
    raise SettingsError(f"{CONFIG_ENV}={path}: config file must end in .yaml, .yml or .toml")


def load_watched(**overrides: Any) -> Settings:
    """A watcher's settings: those of the one cluster ``cluster.name`` names (SettingsError if none)."""
    settings = load_settings(**overrides)
    return settings.for_cluster(settings.cluster.name)


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
            shown = not isinstance(value, dict) and not _secret(err["loc"])
            got = f" (got {value!r})" if shown else ""
            lines.append(f"{field}: {err['msg']}{got}")
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(lines)) from None
    except Exception as exc:  # YAML/TOML syntax errors and non-JSON list values surface here
        if isinstance(exc, SettingsError):
            raise
        bad = _non_json_env()
        if bad:
            raise SettingsError("invalid configuration:\n  " + "\n  ".join(bad)) from None
        if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
            # PyYAML's own message quotes the lines around the error: a token may stand there.
            mark = exc.problem_mark
            raise SettingsError(
                f"cannot read configuration: {mark.name}, line {mark.line + 1}, column "
                f"{mark.column + 1}: {exc.problem}"
            ) from None
        raise SettingsError(f"cannot read configuration: {type(exc).__name__}: {exc}") from None


def _carries_secret(annotation: Any) -> bool:
    """Whether a value of this type may hold a secret: a ``SecretStr`` in it, at any depth."""
    if annotation is SecretStr:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return any(_carries_secret(f.annotation) for f in annotation.model_fields.values())
    return any(_carries_secret(arg) for arg in get_args(annotation))


def _secret(loc: Sequence[int | str]) -> bool:
    """Whether the value at ``loc`` (a path such as ``api.tokens.0.token``) may hold a secret: the
    field it reaches carries one in its type, or is a URL (``user:password@host``). A key that is no
    field (a misspelt ``admin_token``) counts as secret: nothing says what its value is."""
    model: Any = Settings
    leaf: tuple[str, Any] | None = None
    for part in loc:
        if isinstance(part, int) or part.isdigit():
            continue  # an index into a list: the element is judged by the list's field
        fields = getattr(model, "model_fields", None)
        if fields is None:
            break  # inside a leaf's value (a mapping's key): judged by the leaf
        if part not in fields:
            return True
        leaf = (part, fields[part].annotation)
        models = [
            a for a in (leaf[1], *get_args(leaf[1])) if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        model = models[0] if models else leaf[1]
    if leaf is None:
        return False
    return _carries_secret(leaf[1]) or leaf[0].endswith("url")


def _non_json_env() -> list[str]:
    """Name the environment variables whose field wants a list or mapping but whose value is not JSON
    (pydantic-settings only names the section)."""
    out = []
    for key, value in sorted(os.environ.items()):
        if not key.startswith("REMEDIATION_") or key == CONFIG_ENV:
            continue
        model: Any = Settings
        path = key.removeprefix("REMEDIATION_").lower().split("__")
        path[0] = RENAMED_SECTIONS.get(path[0], path[0])
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
                    kind = 'a JSON list, e.g. ["a", "b"]' if origin is list else "a JSON object"
                    got = "" if _secret(path) else f" (got {value[:60]!r})"
                    out.append(f"{'.'.join(path)}: {key} must be {kind}{got}")
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
    return load_settings(**deep_merge(base.model_dump(), new_names(data)))
