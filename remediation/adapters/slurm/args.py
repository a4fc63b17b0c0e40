"""Checks on what we hand to Slurm, shared by every Slurm backend and done before anything runs.

A node name must be one plain node (letters, digits, ``.``, ``_``, ``-``; not ``ALL``). A reason must have
no control characters and a bounded length.

Why: docs/slurm-releases.md#what-we-hand-to-slurm
"""

from __future__ import annotations

import re

from remediation.domain.events import NODE_NAME
from remediation.ports.errors import PermanentError
from remediation.settings.workflow import CHECKPOINT_SIGNALS

#: Longer reasons are refused rather than cut, so that what Slurm shows is what we meant.
MAX_REASON = 1024

# Words Slurm treats as a node set rather than a node. (fullmatch below: NODE_NAME ends in "$",
# which re.match lets match before a trailing newline.)
_RESERVED = frozenset({"ALL"})


class InvalidSlurmArgument(PermanentError, ValueError):
    """A node name or reason we refuse to pass to Slurm."""


def check_node_name(name: object) -> str:
    if not isinstance(name, str) or not NODE_NAME.fullmatch(name):
        raise InvalidSlurmArgument(
            f"invalid Slurm node name {name!r:.80}: expected one plain node name (letters, digits, "
            "'.', '_', '-'; no hostlist brackets, commas, spaces or shell characters)"
        )
    if name.upper() in _RESERVED:
        raise InvalidSlurmArgument(f"invalid Slurm node name {name!r}: Slurm reads it as every node")
    return name


def check_reason(reason: object) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidSlurmArgument("a Slurm reason must be a non-empty string")
    if len(reason) > MAX_REASON:
        raise InvalidSlurmArgument(f"Slurm reason is {len(reason)} characters; the limit is {MAX_REASON}")
    if not reason.isprintable():
        bad = next(c for c in reason if not c.isprintable())
        raise InvalidSlurmArgument(
            f"Slurm reason contains the control character {bad!r}; newlines, tabs and NUL are refused"
        )
    return reason


# A job id as squeue prints it: 12345, 12345_7 for one task of an array job, or 12345+0 for one
# component of a heterogeneous job.
_JOB_ID = re.compile(r"[0-9]{1,20}(_[0-9]{1,10}|\+[0-9]{1,10})?")


def check_job_id(job: object) -> str:
    if not isinstance(job, str) or not _JOB_ID.fullmatch(job):
        raise InvalidSlurmArgument(
            f"invalid Slurm job id {job!r:.80}: expected digits, e.g. 12345, 12345_7 or 12345+0"
        )
    return job


def whole_job(job: object) -> str:
    """The job a requeue or a cancel acts on: a heterogeneous job's component (``12345+1``) is requeued
    and cancelled as the whole job (``12345``), which is what Slurm does with its components anyway."""
    return check_job_id(job).partition("+")[0]


def check_signal(signal: object) -> str:
    """One of the signals a checkpoint request may send (the names ``workflow.checkpoint_signal`` is
    checked against at start-up): the argument is guarded here as every value handed to Slurm is."""
    if signal not in CHECKPOINT_SIGNALS:
        raise InvalidSlurmArgument(f"invalid signal name {signal!r:.40}: expected one of {list(CHECKPOINT_SIGNALS)}")
    assert isinstance(signal, str)
    return signal
