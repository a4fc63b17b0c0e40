"""Collected evidence, the pure part: what the evidence job runs, and what its output says.

One job on the node runs ``evidence.commands`` in order, each under ``timeout`` with its own deadline,
keeps the start of each output up to its cap, base64-encoded (no output can pass for a marker, and
a binary one survives), framed between markers that carry the step's nonce. The commands are arguments of a fixed
script, never shell text. Before a reboot the same job writes one line to the node's journal.

Why: docs/policy.md#collected-evidence-the-nodes-state-before-the-hammer
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from remediation.evidence_collection.settings import SINCE, EvidenceCommand, EvidenceSettings
from remediation.vocabulary import MACHINE_ACTIONS

#: What a check's ``purpose`` says for the evidence job (the dry-run twin records it).
PURPOSE = "collect evidence"
#: The tag of the line in the node's journal.
JOURNAL_TAG = "node-remediation"
#: Seconds ``timeout`` waits after its signal before it kills; and the job's own slack over its commands.
KILL_AFTER_S = 5
JOB_SLACK_S = 15
#: ``bash -c SCRIPT nr-evidence NONCE JOURNAL [NAME DEADLINE CAP N ARG1..ARGN]...``
SCRIPT = r"""
nonce=$1 journal=$2; shift 2
while [ $# -ge 4 ]; do
  name=$1 deadline=$2 cap=$3 n=$4; shift 4
  cmd=("${@:1:$n}"); shift "$n"
  out=$(mktemp) || exit 70
  t0=$(date +%s%N)
  timeout -k 5 "$deadline" "${cmd[@]}" >"$out" 2>&1 </dev/null
  rc=$?
  t1=$(date +%s%N)
  size=$(wc -c <"$out")
  printf '==nr-evidence %s begin %s==\n' "$nonce" "$name"
  head -c "$cap" "$out" | base64 -w 0
  printf '\n==nr-evidence %s end %s rc=%s bytes=%s ms=%s==\n' "$nonce" "$name" "$rc" "$size" "$(( (t1 - t0) / 1000000 ))"
  rm -f "$out"
done
if [ -n "$journal" ]; then
  if logger -t node-remediation -- "$journal"; then
    printf '==nr-evidence %s journal written==\n' "$nonce"
  else
    printf '==nr-evidence %s journal failed rc=%s==\n' "$nonce" "$?"
  fi
fi
exit 0
"""
#: Exit codes: ``timeout``'s own when the deadline ended the command, and a shell's for one it could not run.
TIMED_OUT_CODES = frozenset({124, 137})
CANNOT_RUN_CODES = frozenset({126, 127})


class EvidenceStatus(StrEnum):
    """How one command of the evidence job ended."""

    COLLECTED = "collected"  # exit 0
    FAILED = "failed"  # another exit code: its output is kept all the same
    TIMED_OUT = "timed-out"  # stopped at its deadline
    MISSING = "missing"  # not on the node (exit 126/127)
    CUT = "cut"  # the job was stopped (evidence.max_wait_s), or ended, before this command did


class JournalLine(StrEnum):
    """What became of the line for the node's journal."""

    WRITTEN = "written"
    FAILED = "failed"
    NOT_WRITTEN = "not written"  # the job ended before it got there


@dataclass(frozen=True)
class Item:
    """One command's output as the job kept it: ``content`` is at most the command's ``max_bytes``;
    ``total_bytes`` is what the command wrote (more: ``truncated``)."""

    name: str
    status: EvidenceStatus
    content: bytes
    total_bytes: int
    exit_code: int | None = None
    duration_s: float | None = None

    @property
    def truncated(self) -> bool:
        return self.total_bytes > len(self.content)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


@dataclass(frozen=True)
class Plan:
    """What one evidence job does: the commands it runs, and the journal line it writes ("" none)."""

    commands: tuple[EvidenceCommand, ...]
    journal: str = ""

    def __bool__(self) -> bool:
        return bool(self.commands or self.journal)

    @property
    def timeout_s(self) -> float:
        """The job's deadline: every command's own, with the kill grace, and the slack of the job."""
        return sum(c.deadline_s + KILL_AFTER_S for c in self.commands) + JOB_SLACK_S

    @property
    def output_bytes(self) -> int:
        """The most output the job can write: every cap in base64, and room for the markers."""
        return sum(-(-c.max_bytes // 3) * 4 + 256 for c in self.commands) + 1024


@dataclass(frozen=True)
class Occasion:
    """Why a remediation would collect now: its class, the action that comes next, and the remediation
    the journal line names."""

    fault_class: str | None
    action: str | None
    remediation_id: int
    cause: str
    quarantine: bool = False  # before a quarantine, not a machine action


def plan(occasion: Occasion, cfg: EvidenceSettings) -> Plan:
    """The job for ``occasion``: the site's commands for a class it chose, and the journal line
    before a reboot (a machine action; a GPU reset reboots nothing)."""
    if not cfg.enabled:
        return Plan(())
    chosen = (occasion.fault_class or "unknown") in cfg.classes
    commands = tuple(c for c in cfg.commands if c.enabled) if chosen else ()
    reboots = not occasion.quarantine and occasion.action in MACHINE_ACTIONS
    return Plan(commands, journal_line(occasion) if cfg.journal and reboots else "")


def journal_line(occasion: Occasion) -> str:
    """``remediation 12: cause "...": action restart``, one printable line of at most 400 characters."""
    cause = " ".join("".join(c if c.isprintable() else " " for c in occasion.cause).split())[:300]
    return f'remediation {occasion.remediation_id}: cause "{cause}": action {occasion.action}'


def job_command(job: Plan, *, nonce: str, since: int) -> tuple[str, ...]:
    """The job's argument list. ``{since}`` in a command's argument becomes the fault's time."""
    args: list[str] = ["/bin/bash", "-c", SCRIPT, "nr-evidence", nonce, job.journal]
    for c in job.commands:
        argv = [a.replace(SINCE, str(since)) for a in c.argv]
        args += [c.name, f"{c.deadline_s:g}", str(c.max_bytes), str(len(argv)), *argv]
    return tuple(args)


def _status(code: int) -> EvidenceStatus:
    if code == 0:
        return EvidenceStatus.COLLECTED
    if code in TIMED_OUT_CODES:
        return EvidenceStatus.TIMED_OUT
    return EvidenceStatus.MISSING if code in CANNOT_RUN_CODES else EvidenceStatus.FAILED


def parse(output: str, *, nonce: str, names: Sequence[str]) -> tuple[list[Item], JournalLine]:
    """The items ``output`` frames with the job's nonce, in the order of ``names``; a name without its
    frame reads as cut. A frame whose name was not asked for is ignored."""
    mark = re.escape(f"==nr-evidence {nonce} ")
    frame = re.compile(mark + r"begin ([a-z0-9-]+)==\n([A-Za-z0-9+/=]*)\n" + mark
                       + r"end \1 rc=(\d+) bytes=(\d+) ms=(\d+)==$", re.M)
    found: dict[str, Item] = {}
    for m in frame.finditer(output):
        name, body, code, size, ms = m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5))
        if name in names and name not in found and (content := _decoded(body)) is not None:
            found[name] = Item(name, _status(code), content, max(size, len(content)), code, ms / 1000)
    items = [found.get(n) or Item(n, EvidenceStatus.CUT, b"", 0) for n in names]
    journal = (JournalLine.WRITTEN if f"==nr-evidence {nonce} journal written==" in output
               else JournalLine.FAILED if f"==nr-evidence {nonce} journal failed" in output
               else JournalLine.NOT_WRITTEN)
    return items, journal


def _decoded(body: str) -> bytes | None:
    try:
        return base64.b64decode(body, validate=True)
    except binascii.Error:
        return None


def summary(items: Sequence[Item]) -> str:
    """``nvidia-smi-q 12.3 KiB, kernel-log 2.0 KiB (truncated), remapped-rows missing``."""
    def one(item: Item) -> str:
        if item.status is EvidenceStatus.COLLECTED:
            return f"{item.name} {_size(len(item.content))}{' (truncated)' if item.truncated else ''}"
        return f"{item.name} {item.status.value}"
    return ", ".join(one(i) for i in items)


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB" if n < 1048576 else f"{n / 1048576:.1f} MiB"
