"""What every settings section shares: a model that refuses unknown keys, so a misspelt key fails at
start-up instead of being ignored, and the one error bad configuration raises."""

from __future__ import annotations

from pydantic import BaseModel


class ConfigError(ValueError):
    """Raised when settings cannot be loaded; the message names each bad field."""


class Section(BaseModel):
    model_config = {"extra": "forbid"}
