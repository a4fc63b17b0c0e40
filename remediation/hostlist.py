"""Slurm hostlist expressions: ``gpu-node-[0-3,7]`` <-> ``gpu-node-0 ... gpu-node-3, gpu-node-7``.

Every place that reads a node set from Slurm goes through :func:`expand`. The grammar is Slurm's
(comma-separated terms, bracket ranges that keep ``lo``'s zero padding, several groups as a cartesian
product), made strict: whitespace, bad brackets, empty terms or ranges, and expansions too large to
build raise :class:`HostlistError`.

Why: docs/architecture.md#slurms-hostlist-grammar-made-strict
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

#: Expansions larger than this are refused; the largest Slurm clusters have ~10^5 nodes.
MAX_HOSTS = 1_000_000

_LITERAL = re.compile(r"[A-Za-z0-9._-]*")
_TRAILING_DIGITS = re.compile(r"^(.*?)(\d+)$")


class HostlistError(ValueError):
    """A hostlist expression that cannot be expanded; the message says where and why."""


def expand(expr: str, limit: int = MAX_HOSTS) -> list[str]:
    """Expand a hostlist expression into names, in Slurm's order (duplicates kept)."""
    if not isinstance(expr, str):
        raise HostlistError(f"hostlist must be a string, not {type(expr).__name__}")
    if expr == "":
        return []
    terms = _split_terms(expr)
    parsed: list[list[_Part]] = []
    total = 0
    for term in terms:
        parts = _parse_term(term, expr)
        size = 1
        for part in parts:
            if isinstance(part, list):
                size *= sum(len(r) for r in part)
                # Checked inside the loop so that a long chain of big groups stops early.
                if size > limit:
                    break
        total += size
        if total > limit:
            raise HostlistError(f"hostlist {_show(expr)} expands to more than {limit} names")
        parsed.append(parts)
    names: list[str] = []
    for parts in parsed:
        names.extend(_generate(parts))
    return names


def compress(names: Iterable[str]) -> str:
    """The shortest-ish hostlist of a set of names: duplicates dropped, numeric suffixes merged into
    ranges (``gpu-node-[0-3,7]``). ``expand(compress(x))`` gives back exactly the set ``x``."""
    groups: dict[tuple[str, int], set[int]] = {}
    plain: set[str] = set()
    for name in names:
        if not name or not _LITERAL.fullmatch(name):
            raise HostlistError(f"{_show(name)} is not a plain host name")
        match = _TRAILING_DIGITS.match(name)
        if match is None:
            plain.add(name)
            continue
        prefix, digits = match.groups()
        # A leading zero means a fixed width; "7" and "07" are different hosts.
        width = len(digits) if digits[0] == "0" and len(digits) > 1 else 0
        groups.setdefault((prefix, width), set()).add(int(digits))
    out = sorted(plain)
    for (prefix, width), numbers in sorted(groups.items()):
        if len(numbers) == 1:
            out.append(f"{prefix}{_fmt(next(iter(numbers)), width)}")
            continue
        ranges = []
        for lo, hi in _runs(sorted(numbers)):
            ranges.append(_fmt(lo, width) if lo == hi else f"{_fmt(lo, width)}-{_fmt(hi, width)}")
        out.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(out)


# ------------------------------------------------------------------------------------------ internals


def _show(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _split_terms(expr: str) -> list[str]:
    terms = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            if depth:
                raise HostlistError(f"nested '[' at position {i} in {_show(expr)}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostlistError(f"unbalanced ']' at position {i} in {_show(expr)}")
            depth = 0
        elif ch == "," and not depth:
            terms.append(expr[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"unclosed '[' in {_show(expr)}")
    terms.append(expr[start:])
    for term in terms:
        if not term:
            raise HostlistError(f"empty host name in {_show(expr)}")
    return terms


class _PaddedRange:
    """A numeric range that formats its members with Slurm's zero padding."""

    __slots__ = ("start", "stop", "width")

    def __init__(self, start: int, stop: int, width: int) -> None:
        self.start, self.stop, self.width = start, stop, width

    def __len__(self) -> int:
        return self.stop - self.start

    def strings(self) -> list[str]:
        width = self.width
        return [str(n).zfill(width) for n in range(self.start, self.stop)]


# A parsed term: literal text and bracket groups, in order.
_Part = str | list[_PaddedRange]


def _parse_term(term: str, expr: str) -> list[_Part]:
    parts: list[_Part] = []
    pos = 0
    while pos < len(term):
        open_at = term.find("[", pos)
        literal = term[pos:] if open_at < 0 else term[pos:open_at]
        if not _LITERAL.fullmatch(literal):
            bad = next(c for c in literal if not _LITERAL.fullmatch(c))
            raise HostlistError(f"invalid character {bad!r} in {_show(expr)}")
        if literal:
            parts.append(literal)
        if open_at < 0:
            break
        close_at = term.index("]", open_at)  # balanced: checked by _split_terms
        parts.append(_parse_group(term[open_at + 1 : close_at], expr))
        pos = close_at + 1
    return parts


def _parse_group(body: str, expr: str) -> list[_PaddedRange]:
    if not body:
        raise HostlistError(f"empty brackets in {_show(expr)}")
    group: list[_PaddedRange] = []
    for item in body.split(","):
        lo_s, sep, hi_s = item.partition("-")
        if not lo_s.isascii() or not lo_s.isdigit() or (sep and not (hi_s.isascii() and hi_s.isdigit())):
            raise HostlistError(f"invalid range {item!r} in {_show(expr)} (expected N or N-M)")
        lo = int(lo_s)
        hi = int(hi_s) if sep else lo
        if hi < lo:
            raise HostlistError(f"range {item!r} in {_show(expr)} runs backwards")
        width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
        group.append(_PaddedRange(lo, hi + 1, width))
    return group


def _generate(parts: list[_Part]) -> Iterable[str]:
    pools: list[Iterable[str]] = []
    for part in parts:
        if isinstance(part, str):
            pools.append((part,))
        else:
            pools.append([s for r in part for s in r.strings()])
    return ("".join(combo) for combo in itertools.product(*pools))


def _fmt(number: int, width: int) -> str:
    return str(number).zfill(width)


def _runs(numbers: list[int]) -> Iterable[tuple[int, int]]:
    start = prev = numbers[0]
    for n in numbers[1:]:
        if n != prev + 1:
            yield start, prev
            start = n
        prev = n
    yield start, prev
