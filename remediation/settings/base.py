"""What every settings section shares: a model that refuses unknown keys, so a misspelt key fails at
start-up instead of being ignored, and the one error bad settings raise at start-up."""

from __future__ import annotations

from pydantic import BaseModel


class SettingsError(ValueError):
    """Raised when settings cannot be loaded; the message names each bad field. It stops a process at
    start-up, before anything acts. A configuration that loads but that a backend cannot serve (a
    missing binary, an action a cloud lacks) is found later, while acting, and is the systemic
    :class:`remediation.ports.errors.ConfigError` instead: automation pauses, the process runs on."""


class Section(BaseModel):
    model_config = {"extra": "forbid"}
