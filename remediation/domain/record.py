"""Typed records kept as JSON: the remediation context and the ``control`` rows.

A subclass is a frozen dataclass whose fields are the keys it declares. :meth:`JsonRecord.load` reads
tolerantly (a missing or mistyped key reads as its default; undeclared keys are kept in ``extra`` and
written back); :meth:`JsonRecord.dump` writes what is set, leaving out None.

Why: docs/architecture.md#typed-records-kept-as-json
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from typing import Any, Self, get_args, get_type_hints


class JsonRecord:
    extra: Mapping[str, Any]

    @classmethod
    def load(cls, raw: Mapping[str, Any] | None) -> Self:
        raw = raw if isinstance(raw, Mapping) else {}
        types = _types(cls)
        known = {name: value for name, kind in types.items()
                 if (value := _read(raw.get(name), kind)) is not None}
        make: Callable[..., Self] = cls  # a dataclass: its fields are its keyword arguments
        return make(**known, extra={k: v for k, v in raw.items() if k not in types})

    def dump(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        for name in _types(type(self)):
            value = getattr(self, name)
            if value is not None:
                out[name] = value.dump() if isinstance(value, JsonRecord) else value
        return out


_TYPES: dict[type, dict[str, type]] = {}


def _types(cls: type) -> dict[str, type]:
    """Each declared key's type, from the annotations (``X | None`` gives X)."""
    if cls not in _TYPES:
        assert is_dataclass(cls)
        hints = get_type_hints(cls)
        _TYPES[cls] = {f.name: next((a for a in get_args(hints[f.name]) if a is not type(None)), hints[f.name])
                       for f in fields(cls) if f.name != "extra"}
    return _TYPES[cls]


def _read(value: object, kind: type) -> Any:
    if value is None:
        return None
    if isinstance(kind, type) and issubclass(kind, JsonRecord):
        return kind.load(value) if isinstance(value, Mapping) and value else None
    if kind is bool:
        return bool(value)
    if isinstance(value, bool):
        return None  # a flag where a number or a text belongs
    if kind is float and isinstance(value, int | float):
        return float(value)
    if kind is str and isinstance(value, int | float):
        return str(value)
    return value if isinstance(value, kind) else None
