"""Parse what Slurm says about its nodes, and diff two snapshots of it.

Inputs:
- ``sinfo --json`` (openapi v0.0.38 in Slurm 22.05) and slurmrestd ``GET /slurm/vX/nodes``: the same
  document, ``{"meta": ..., "errors": [...], "nodes": [...]}``. In v0.0.38 a node's ``state`` is the
  lower-case base state and ``state_flags`` the flags; v0.0.39+ put everything in a ``state`` list and
  wrap numbers as ``{"set": true, "number": N}``. Both are read.
- ``scontrol show node -o``: one ``Key=Value`` line per node, the reason last as
  ``Reason=TEXT [USER@TIME]``.

The watcher polls every second, so parsing must stay cheap at 10,000 nodes. A full ``json.loads`` of
such a document (13 MB) costs ~70 ms; most polls change a handful of nodes. :class:`NodesParser`
therefore splits Slurm's pretty-printed document at the node boundaries (a line ``    },`` followed by
``    {`` can only be a boundary of the ``nodes`` array: JSON strings cannot contain a raw newline) and
only decodes node objects whose text changed since the previous poll. Anything not laid out exactly as
expected goes through the plain full parse, so the shortcut can make a poll slower, never wrong.

Malformed input raises :class:`SlurmFormatError` naming the offending field; errors Slurm itself
reported in ``errors`` raise :class:`SlurmReportedError` carrying Slurm's messages.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from remediation.domain.events import NODE_NAME
from remediation.ports.cluster import SlurmNode

#: Base states a v0.0.39+ ``state`` list may hold; everything else in that list is a flag.
BASE_STATES = frozenset({"INVALID", "UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE", "END"})

#: States that make a node "bad" for the watcher, most telling first: the first one a node has is the
#: state its event carries. FAIL and DOWN say more than DRAIN (a researcher's or slurmctld's verdict),
#: and NOT_RESPONDING alone is usually the first step towards DOWN.
BAD_PRIORITY = ("FAIL", "DOWN", "DRAIN", "NOT_RESPONDING")


class SlurmFormatError(ValueError):
    """Slurm's output is not what the parser understands; the message names the field."""


class SlurmReportedError(SlurmFormatError):
    """The document is well formed but carries Slurm's own ``errors``."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("slurm reported: " + "; ".join(errors))
        self.errors = errors


class NodeStatus(NamedTuple):
    """The part of a node the service cares about, as cheap to build and compare as possible.
    Times are Unix seconds, 0 when Slurm has none."""

    name: str
    state: str  # upper-case base state
    flags: frozenset[str]
    reason: str = ""
    reason_user: str | None = None
    reason_changed_at: int = 0
    slurmd_start_time: int = 0

    @property
    def states(self) -> frozenset[str]:
        return self.flags | {self.state}

    def to_slurm_node(self) -> SlurmNode:
        return SlurmNode(
            name=self.name,
            state=self.state,
            flags=self.flags,
            reason=self.reason,
            reason_user=self.reason_user,
            reason_time=datetime.fromtimestamp(self.reason_changed_at, UTC) if self.reason_changed_at else None,
            slurmd_start_time=(
                datetime.fromtimestamp(self.slurmd_start_time, UTC) if self.slurmd_start_time else None
            ),
        )


# ------------------------------------------------------------------------------------- sinfo --json


def parse_nodes_json(text: str | bytes) -> dict[str, NodeStatus]:
    """Parse a whole ``sinfo --json`` / slurmrestd nodes document (no memo)."""
    return {s.name: s for s in _statuses(_loads(text, "document"))}


class NodesParser:
    """:func:`parse_nodes_json` with a memo of the previous document's node objects (see module
    docstring). One instance per watcher; not thread-safe."""

    def __init__(self) -> None:
        self._memo: dict[str, NodeStatus] = {}
        self.last_decoded = 0  # node objects decoded by the last parse (for tests and benchmarks)

    def parse(self, text: str | bytes) -> dict[str, NodeStatus]:
        if isinstance(text, bytes):
            text = _decode(text)
        split = _split_pretty(text)
        if split is None:
            self._memo = {}
            result = parse_nodes_json(text)
            self.last_decoded = len(result)
            return result
        envelope, chunks = split
        try:
            return self._incremental(envelope, chunks)
        except SlurmFormatError:
            pass  # the full parse below gives the authoritative result or error
        self._memo = {}
        result = parse_nodes_json(text)
        self.last_decoded = len(result)
        return result

    def _incremental(self, envelope: str, chunks: list[str]) -> dict[str, NodeStatus]:
        _check_envelope(_loads(envelope, "document"))
        memo = self._memo
        new_memo: dict[str, NodeStatus] = {}
        out: dict[str, NodeStatus] = {}
        decoded = 0
        for index, chunk in enumerate(chunks):
            status = memo.get(chunk)
            if status is None:
                # One node's objects at a time: peak memory stays small even on the first poll.
                status = _status(_loads("{" + chunk + "}", f"nodes[{index}]"), index)
                decoded += 1
            new_memo[chunk] = status
            out[status.name] = status
        self._memo = new_memo
        self.last_decoded = decoded
        return out


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SlurmFormatError(f"document is not UTF-8: {exc}") from None


def _loads(text: str | bytes, where: str) -> Any:
    if isinstance(text, bytes):
        text = _decode(text)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmFormatError(f"{where} is not valid JSON: {exc}") from None
    except RecursionError:
        raise SlurmFormatError(f"{where} is nested too deeply") from None


_NODES_OPEN = '\n  "nodes": [\n'
_NODES_CLOSE = "\n  ]\n}"
_NODE_OPEN = "    {\n"
_NODE_CLOSE = "\n    }"
_NODE_SEP = "\n    },\n    {\n"


def _split_pretty(text: str) -> tuple[str, list[str]] | None:
    """Split Slurm's pretty-printed document into the envelope (with an empty node list) and the
    member text of each node object; None if the layout is not exactly Slurm's."""
    start = text.find(_NODES_OPEN)
    end = text.rfind(_NODES_CLOSE)
    if start < 0 or end < start or text[end + len(_NODES_CLOSE) :].strip():
        return None
    body = text[start + len(_NODES_OPEN) : end]
    if not (body.startswith(_NODE_OPEN) and body.endswith(_NODE_CLOSE)):
        return None
    chunks = body[len(_NODE_OPEN) : -len(_NODE_CLOSE)].split(_NODE_SEP)
    envelope = text[:start] + '\n  "nodes": []\n}'
    return envelope, chunks


def _check_envelope(doc: Any) -> list[Any]:
    if not isinstance(doc, dict):
        raise SlurmFormatError(f"document: expected an object, got {type(doc).__name__}")
    errors = doc.get("errors") or []
    if not isinstance(errors, list):
        raise SlurmFormatError(f"errors: expected a list, got {type(errors).__name__}")
    if errors:
        raise SlurmReportedError([_error_text(e) for e in errors])
    nodes = doc.get("nodes")
    if not isinstance(nodes, list):
        raise SlurmFormatError(f"nodes: expected a list, got {type(nodes).__name__}")
    return nodes


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        text = error.get("error") or error.get("description") or "unspecified error"
        errno = error.get("errno", error.get("error_number"))
        return f"{text} (errno {errno})" if errno is not None else str(text)
    return str(error)


def _statuses(doc: Any) -> list[NodeStatus]:
    return [_status(node, index) for index, node in enumerate(_check_envelope(doc))]


def _status(node: Any, index: int) -> NodeStatus:
    where = f"nodes[{index}]"
    if not isinstance(node, dict):
        raise SlurmFormatError(f"{where}: expected an object, got {type(node).__name__}")
    name = node.get("name")
    if not isinstance(name, str) or not NODE_NAME.fullmatch(name):
        raise SlurmFormatError(f"{where}.name: not a valid node name: {name!r:.80}")
    where = f"nodes[{index}] ({name})"
    raw_state = node.get("state")
    flags = _strings(node.get("state_flags") or [], f"{where}.state_flags")
    if isinstance(raw_state, str) and raw_state:
        state = raw_state.upper()
    elif isinstance(raw_state, list) and raw_state:
        # v0.0.39+: ["IDLE", "DRAIN"]; the base state is the member that is one.
        members = _strings(raw_state, f"{where}.state")
        bases = [m for m in members if m in BASE_STATES]
        state = bases[0] if bases else "UNKNOWN"
        flags = flags | frozenset(m for m in members if m != state)
    else:
        raise SlurmFormatError(f"{where}.state: expected a state, got {raw_state!r:.80}")
    reason = node.get("reason") or ""
    if not isinstance(reason, str):
        raise SlurmFormatError(f"{where}.reason: expected a string, got {type(reason).__name__}")
    user = node.get("reason_set_by_user") or None
    if user is not None and not isinstance(user, str):
        raise SlurmFormatError(f"{where}.reason_set_by_user: expected a string, got {type(user).__name__}")
    if not reason:
        user = None  # 24.11 names a user even when no reason is set; scontrol -o names none
    return NodeStatus(
        name,
        state,
        flags,
        reason,
        user,
        _number(node.get("reason_changed_at"), f"{where}.reason_changed_at"),
        _number(node.get("slurmd_start_time"), f"{where}.slurmd_start_time"),
    )


def _strings(value: Any, where: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SlurmFormatError(f"{where}: expected a list of strings, got {value!r:.80}")
    return frozenset(v.upper() for v in value)


def _number(value: Any, where: str) -> int:
    if value is None:
        return 0
    if isinstance(value, dict):  # v0.0.40+: {"set": true, "infinite": false, "number": N}
        if not value.get("set") or value.get("infinite"):
            return 0
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SlurmFormatError(f"{where}: expected a number, got {value!r:.80}")
    if value != value or value < 0 or value > 2**53:  # NaN, negative or absurd
        raise SlurmFormatError(f"{where}: out of range: {value!r}")
    return int(value)


# --------------------------------------------------------------------------- scontrol show node -o

_NAME = re.compile(r"NodeName=(\S+)")
_STATE = re.compile(r"(?:^| )State=(\S+)")
_REASON = re.compile(r" Reason=(.*?) \[([^@\]\s]*)@(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d|Unknown|None)\]")
_REASON_BARE = re.compile(r" Reason=(.*)$")
_START = re.compile(r" SlurmdStartTime=(\S+)")


def parse_scontrol_line(line: str) -> NodeStatus:
    """Parse one line of ``scontrol show node -o``. Slurm prints its times in local time."""
    line = line.rstrip("\n")
    match = _NAME.match(line)
    if match is None:
        raise SlurmFormatError(f"scontrol line does not start with NodeName=: {line!r:.80}")
    name = match.group(1)
    if not NODE_NAME.fullmatch(name):
        raise SlurmFormatError(f"NodeName: not a valid node name: {name!r:.80}")
    state_match = _STATE.search(line)
    if state_match is None:
        raise SlurmFormatError(f"{name}: no State= in scontrol line")
    # "IDLE+DRAIN+NOT_RESPONDING"; strip sinfo-style suffix marks in case a version adds them.
    parts = [p.rstrip("*~#!%$@^-") for p in state_match.group(1).upper().split("+")]
    if not parts[0]:
        raise SlurmFormatError(f"{name}: empty State= in scontrol line")
    reason, user, changed = "", None, 0
    reason_match = _REASON.search(line)
    if reason_match is not None:
        reason, user_text, when = reason_match.groups()
        user = user_text or None
        changed = _local_time(when, f"{name}: reason time")
    else:
        bare = _REASON_BARE.search(line)
        if bare is not None:
            reason = bare.group(1).strip()
    start_match = _START.search(line)
    started = _local_time(start_match.group(1), f"{name}: SlurmdStartTime") if start_match else 0
    return NodeStatus(name, parts[0], frozenset(p for p in parts[1:] if p), reason, user, changed, started)


def parse_scontrol_nodes(text: str) -> dict[str, NodeStatus]:
    out = {}
    for line in text.splitlines():
        if line.strip():
            status = parse_scontrol_line(line)
            out[status.name] = status
    return out


def _local_time(text: str, where: str) -> int:
    if text in ("Unknown", "None", "(null)", "n/a"):
        return 0
    try:
        return int(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))
    except (ValueError, OverflowError):
        raise SlurmFormatError(f"{where}: not a time: {text!r:.40}") from None


# ---------------------------------------------------------------------------------------------- diff


def bad_state(status: NodeStatus, bad: frozenset[str]) -> str | None:
    """The state an event about this node carries, or None if the node is healthy."""
    states = status.flags | {status.state}
    if states.isdisjoint(bad):
        return None
    for state in BAD_PRIORITY:
        if state in bad and state in states:
            return state
    return min(states & bad)


def condition_key(status: NodeStatus, state: str) -> str:
    """Identity of one bad condition, stable across polls, resyncs and watcher restarts.

    Slurm stamps every reason change (``reason_changed_at``), so state + reason time + reason names
    one condition. A bare NOT_RESPONDING has no reason; the slurmd start time then tells one outage of
    a slurmd from the next. The reason's hash tells apart two reasons set within the same second."""
    digest = hashlib.blake2s(status.reason.encode(), digest_size=4).hexdigest()
    stamp = status.reason_changed_at or f"s{status.slurmd_start_time}"
    return f"slurm:{status.name}:{state}:{stamp}:{digest}"


@dataclass
class SnapshotDiff:
    """What the watcher publishes for one poll."""

    unhealthy: list[tuple[NodeStatus, str]] = field(default_factory=list)  # (node, its bad state)
    healthy: list[tuple[NodeStatus, NodeStatus, str]] = field(default_factory=list)  # (now, before, bad state before)
    added: list[NodeStatus] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.unhealthy or self.healthy or self.added or self.removed)


def _condition(status: NodeStatus, bad: frozenset[str]) -> tuple[str, str, int, int] | None:
    state = bad_state(status, bad)
    if state is None:
        return None
    start = 0 if status.reason_changed_at else status.slurmd_start_time
    return state, status.reason, status.reason_changed_at, start


def diff(previous: Mapping[str, NodeStatus], current: Mapping[str, NodeStatus], bad: Iterable[str]) -> SnapshotDiff:
    """Transitions from ``previous`` to ``current``: nodes that entered a bad condition (or moved to
    another one), nodes that returned to health, nodes first seen and nodes gone. A node first seen
    in a bad state counts as a transition into it (the watcher has no earlier knowledge)."""
    bad_set = frozenset(s.upper() for s in bad)
    out = SnapshotDiff()
    for name, now in current.items():
        before = previous.get(name)
        if before is now:  # the memoised parser hands back the same object for unchanged nodes
            continue
        if before is None:
            out.added.append(now)
            state = bad_state(now, bad_set)
            if state is not None:
                out.unhealthy.append((now, state))
            continue
        if before == now:
            continue
        cond_now = _condition(now, bad_set)
        cond_before = _condition(before, bad_set)
        if cond_now == cond_before:
            continue
        if cond_now is not None:
            out.unhealthy.append((now, cond_now[0]))
        elif cond_before is not None:
            out.healthy.append((now, before, cond_before[0]))
    out.removed = [name for name in previous if name not in current]
    return out
