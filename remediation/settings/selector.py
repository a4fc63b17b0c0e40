"""Kubernetes label selectors, as ``kubectl get nodes -l`` reads them: the syntax of a profile's
``select.labels``, parsed once at start-up into typed requirements.

The grammar is the apiserver's set-based one (``key``, ``!key``, ``key=value``, ``key!=value``,
``key in (a,b)``, ``key notin (a,b)``, comma-separated, all must hold), with the apiserver's rules for
Node label keys and values: a malformed selector is a start-up error naming it.

Why: docs/policy.md#profiles-policy-per-node-group
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
KEY = re.compile(rf"^({_PREFIX}/)?{_NAME}$")
VALUE = re.compile(rf"^({_NAME})?$")
_SET = re.compile(r"^(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_EQUALITY = re.compile(r"^(?P<key>[^=!\s]+)\s*(?P<op>==|=|!=)\s*(?P<value>.*?)\s*$")


class Operator(StrEnum):
    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    ABSENT = "!"


@dataclass(frozen=True)
class Requirement:
    key: str
    op: Operator
    values: frozenset[str] = frozenset()

    def holds(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op is Operator.EXISTS:
            return present
        if self.op is Operator.ABSENT:
            return not present
        if self.op in (Operator.EQUALS, Operator.IN):
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values  # != and notin, as the apiserver reads them


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """The requirements of a label selector; ValueError naming the part that is wrong."""
    if not text.strip():
        raise ValueError("an empty label selector selects every node; leave labels out instead")
    return tuple(_requirement(part.strip()) for part in _split(text))


def matches(requirements: tuple[Requirement, ...], labels: Mapping[str, str]) -> bool:
    return all(r.holds(labels) for r in requirements)


def _split(text: str) -> list[str]:
    """Split at the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ')' in {text!r}")
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '(' in {text!r}")
    parts.append(text[start:])
    return parts


def _requirement(part: str) -> Requirement:
    if not part:
        raise ValueError("an empty requirement (two commas in a row, or a trailing comma)")
    if m := _SET.match(part):
        values = [v.strip() for v in m["values"].split(",")]
        return Requirement(
            _key(m["key"]),
            Operator.IN if m["op"] == "in" else Operator.NOT_IN,
            frozenset(_value(v, part) for v in values),
        )
    if m := _EQUALITY.match(part):
        op = Operator.NOT_EQUALS if m["op"] == "!=" else Operator.EQUALS
        return Requirement(_key(m["key"]), op, frozenset({_value(m["value"], part)}))
    if part.startswith("!"):
        return Requirement(_key(part[1:].strip()), Operator.ABSENT)
    return Requirement(_key(part), Operator.EXISTS)


def _key(key: str) -> str:
    if not KEY.fullmatch(key) or len(key) > 316:
        raise ValueError(
            f"{key!r} is not a label key (an optional DNS prefix and '/', then 1-63 letters, "
            "digits, '-', '_' or '.')"
        )
    return key


def _value(value: str, part: str) -> str:
    if not VALUE.fullmatch(value):
        raise ValueError(
            f"{value!r} in {part!r} is not a label value (at most 63 letters, digits, '-', '_' "
            "or '.', starting and ending with a letter or digit)"
        )
    return value
