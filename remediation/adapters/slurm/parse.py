"""Parse what Slurm says about its nodes into :class:`NodeRecord` (comparing two snapshots:
:mod:`remediation.adapters.slurm.diff`).

Reads ``sinfo --json`` and slurmrestd's nodes document (v0.0.38 and v0.0.39+ shapes) and ``scontrol show
node -o`` lines. :class:`NodesParser` decodes only the node objects whose text changed. Malformed input
raises :class:`SlurmFormatError`; errors Slurm reported raise :class:`SlurmReportedError`.

Why: docs/slurm-releases.md#parsing-the-node-table
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any, NamedTuple

from remediation.domain.events import NODE_NAME
from remediation.ports.cluster import SlurmNode

#: Base states a v0.0.39+ ``state`` list may hold; everything else in that list is a flag.
BASE_STATES = frozenset({"INVALID", "UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE", "END"})

class SlurmFormatError(ValueError):
    """Slurm's output is not what the parser understands; the message names the field."""


class SlurmReportedError(SlurmFormatError):
    """The document is well formed but carries Slurm's own ``errors``."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("slurm reported: " + "; ".join(errors))
        self.errors = errors


class NodeRecord(NamedTuple):
    """The part of a node the service cares about, as cheap to build and compare as possible.
    Times are Unix seconds, 0 when Slurm has none."""

    name: str
    state: str  # upper-case base state
    flags: frozenset[str]
    reason: str = ""
    reason_user: str | None = None
    reason_changed_at: int = 0
    slurmd_start_time: int = 0
    # When the node's machine last booted (``BootTime``, ``boot_time``): slurmd reports its uptime and
    # slurmctld subtracts, so the same boot may read a second apart from one registration to the next.
    boot_time: int = 0
    # What a profile selects on (remediation.profiles.rules): the node's partitions and its available
    # features, in Slurm's order. Empty where the reading does not carry them (sinfo -O's delta lines keep
    # the last ones known).
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()

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
            partitions=self.partitions,
            features=self.features,
        )


# ------------------------------------------------------------------------------------- sinfo --json


def parse_nodes_json(text: str | bytes) -> dict[str, NodeRecord]:
    """Parse a whole ``sinfo --json`` / slurmrestd nodes document (no memo)."""
    return {s.name: s for s in _statuses(_loads(text, "document"))}


class NodesParser:
    """:func:`parse_nodes_json` with a memo of the previous document's node objects (see module
    docstring). One instance per watcher; not thread-safe."""

    def __init__(self) -> None:
        self._memo: dict[str, NodeRecord] = {}
        self.last_decoded = 0  # node objects decoded by the last parse (for tests and benchmarks)

    def parse(self, text: str | bytes) -> dict[str, NodeRecord]:
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

    def _incremental(self, envelope: str, chunks: list[str]) -> dict[str, NodeRecord]:
        _check_envelope(_loads(envelope, "document"))
        memo = self._memo
        new_memo: dict[str, NodeRecord] = {}
        out: dict[str, NodeRecord] = {}
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


def _statuses(doc: Any) -> list[NodeRecord]:
    return [_status(node, index) for index, node in enumerate(_check_envelope(doc))]


def _status(node: Any, index: int) -> NodeRecord:
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
    return NodeRecord(
        name,
        state,
        flags,
        reason,
        user,
        _number(node.get("reason_changed_at"), f"{where}.reason_changed_at"),
        _number(node.get("slurmd_start_time"), f"{where}.slurmd_start_time"),
        _number(node.get("boot_time"), f"{where}.boot_time"),
        _names(node.get("partitions"), f"{where}.partitions"),
        _names(node.get("features"), f"{where}.features"),
    )


def _names(value: Any, where: str) -> tuple[str, ...]:
    """A list of names, as a list (23.02+) or a comma-separated string (22.05's v0.0.38), case kept."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SlurmFormatError(f"{where}: expected a list of names, got {value!r:.80}")
    return tuple(v.strip() for v in value if v.strip())


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
_BOOT = re.compile(r" BootTime=(\S+)")
_PARTITIONS = re.compile(r" Partitions=(\S+)")
_FEATURES = re.compile(r" AvailableFeatures=(\S+)")


def parse_scontrol_line(line: str) -> NodeRecord:
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
    state, flags = _complete_state(state_match.group(1), f"{name}: State= in scontrol line")
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
    boot_match = _BOOT.search(line)
    booted = _local_time(boot_match.group(1), f"{name}: BootTime") if boot_match else 0
    lists = [m.group(1) if m and m.group(1) not in ("(null)", "N/A") else None
             for m in (_PARTITIONS.search(line), _FEATURES.search(line))]
    return NodeRecord(name, state, flags, reason, user, changed, started, booted,
                      _names(lists[0], f"{name}: Partitions"), _names(lists[1], f"{name}: AvailableFeatures"))


def _complete_state(text: str, where: str) -> tuple[str, frozenset[str]]:
    """``IDLE+DRAIN+NOT_RESPONDING`` (scontrol) or ``idle+drain+not_responding`` (sinfo's StateComplete)
    -> the base state and the flags; sinfo-style suffix marks are stripped in case a version adds them."""
    parts = [p.rstrip("*~#!%$@^-") for p in text.upper().split("+")]
    if not parts[0]:
        raise SlurmFormatError(f"{where}: empty state")
    return parts[0], frozenset(p for p in parts[1:] if p)


def parse_scontrol_nodes(text: str) -> dict[str, NodeRecord]:
    out = {}
    for line in text.splitlines():
        if line.strip():
            status = parse_scontrol_line(line)
            out[status.name] = status
    return out


# ------------------------------------------------- sinfo -O NodeList,StateComplete,Reason,Timestamp,User

#: The bad set's ``sinfo -O`` fields, each closed by ``|``. Size 0: printed in full, never cut or padded.
SINFO_LINE_FORMAT = "NodeList:0|,StateComplete:0|,Reason:0|,Timestamp:0|,User:0|"
#: What sinfo prints for "no user" / "no time", where scontrol prints nothing.
_NO_USER = frozenset({"", "Unk", "Unknown", "N/A", "(null)"})


class SinfoLine(NamedTuple):
    """One line of ``sinfo -O`` in :data:`SINFO_LINE_FORMAT`: every node of ``nodes`` (a hostlist) has
    these fields. ``record`` gives what ``scontrol show node -o`` would say of one of them, bar the
    slurmd start and boot times, which this line does not print (the caller supplies the last ones it
    knew)."""

    nodes: str
    state: str
    flags: frozenset[str]
    reason: str
    reason_user: str | None
    reason_changed_at: int

    def record(self, name: str, known: NodeRecord) -> NodeRecord:
        return NodeRecord(name, self.state, self.flags, self.reason, self.reason_user, self.reason_changed_at,
                          known.slurmd_start_time, known.boot_time, known.partitions, known.features)


def parse_sinfo_line(line: str) -> SinfoLine:
    """Parse one line; a reason may itself hold ``|`` (every other field cannot), so the reason is what
    lies between the state and the last two fields. A reason time that cannot be read is 0, as for a
    node with no reason: the delta reader then reads such a node with scontrol, which is authoritative."""
    body = line.rstrip("\n")
    if not body.endswith("|") or body.count("|") < 5:
        raise SlurmFormatError(f"sinfo printed a line without its five fields: {line!r:.80}")
    nodes, state_text, rest = body[:-1].split("|", 2)
    reason, when, user = rest.rsplit("|", 2)
    state, flags = _complete_state(state_text.strip(), f"sinfo state of {nodes.strip()!r:.40}")
    try:
        changed = _local_time(when.strip(), f"sinfo reason time of {nodes.strip()!r:.40}")
    except SlurmFormatError:
        changed = 0  # a time sinfo prints otherwise (SLURM_TIME_FORMAT): the caller asks scontrol instead
    user = user.strip()
    if not reason or user in _NO_USER:
        user = ""
    return SinfoLine(nodes.strip(), state, flags, reason, user or None, changed)


def _local_time(text: str, where: str) -> int:
    if text in ("Unknown", "None", "(null)", "n/a", "N/A"):
        return 0
    try:
        return int(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))
    except (ValueError, OverflowError):
        raise SlurmFormatError(f"{where}: not a time: {text!r:.40}") from None


# ---------------------------------------------------------------------------------------------- diff
