"""docker-compose.yml as compose reads it: its ``${VAR}`` references filled from an environment."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

COMPOSE = Path(__file__).resolve().parents[1] / "docker-compose.yml"
REFERENCE = re.compile(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?[?-])(?P<arg>[^}]*))?\}|\$(?P<bare>\w+)")


class MissingVariable(Exception):
    """What ``${VAR:?message}`` makes compose stop with when VAR is unset or empty."""


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's interpolation: ``$$`` is a literal ``$``; ``${VAR:?msg}`` refuses an unset or empty
    VAR with msg, ``${VAR:-default}`` falls back, ``${VAR}`` and ``$VAR`` are VAR or empty."""

    def fill(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("name") or m.group("bare")
        value, op = env.get(name), m.group("op") or ""
        unset = value is None or (op.startswith(":") and value == "")
        if op.endswith("?") and unset:
            raise MissingVariable(f"required variable {name} is missing a value: {m.group('arg')}")
        if op.endswith("-") and unset:
            return m.group("arg")
        return value or ""

    return REFERENCE.sub(fill, text)


def compose(env: Mapping[str, str]) -> dict[str, Any]:
    """The compose document, interpolated as ``docker compose`` would with ``env``."""
    (doc,) = [d for d in yaml.safe_load_all(interpolate(COMPOSE.read_text(), env)) if d]
    return dict(doc)
