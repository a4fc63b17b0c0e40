"""``evidence``: what the node's state is kept as before a machine action or a quarantine
(``REMEDIATION_EVIDENCE__*``).

Why: docs/policy.md#collected-evidence-the-nodes-state-before-the-hammer
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import Field, field_validator, model_validator

from remediation.settings.base import Section
from remediation.vocabulary import FAULT_CLASSES

#: A command's name: it names its item, its file and its key in the store.
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
#: What a command's argument may say for the time of the fault (epoch seconds), filled in as a whole
#: argument or inside one, never through a shell.
SINCE = "{since}"


class StoreBackend(StrEnum):
    """Where an item larger than ``store.inline_bytes`` is kept."""

    DATABASE = "database"  # every item in the database, each cut at inline_bytes
    DIRECTORY = "directory"
    S3 = "s3"


class EvidenceCommand(Section):
    """One command the evidence job runs on the node, with its own deadline and output cap."""

    name: str = Field(description="The item's name (lower case, digits, dashes): nvidia-smi-q, kernel-log...")
    argv: list[str] = Field(min_length=1, description="The command and its arguments, run as they are "
                            "(no shell). An argument may hold {since}: the fault's time, epoch seconds.")
    deadline_s: float = Field(30.0, gt=0, le=3600, description="Seconds it may run before it is stopped.")
    max_bytes: int = Field(262144, ge=256, le=64 * 1024 * 1024, description="Bytes of its output kept (its start).")
    enabled: bool = Field(True, description="Run it. nvidia-bug-report is listed but off: it takes minutes.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.fullmatch(value):
            raise ValueError(f"{value!r}: lower-case letters, digits and dashes, at most 63")
        return value


def default_commands() -> list[EvidenceCommand]:
    """The four the issue names: what NVIDIA support and the clouds' hardware teams ask for first."""
    remapped = ("gpu_bus_id,gpu_uuid,remapped_rows.correctable,remapped_rows.uncorrectable,"
                "remapped_rows.pending,remapped_rows.failure")
    return [
        EvidenceCommand(name="nvidia-smi-q", argv=["nvidia-smi", "-q"], deadline_s=30, max_bytes=1048576),
        EvidenceCommand(name="remapped-rows", argv=["nvidia-smi", f"--query-remapped-rows={remapped}",
                                                    "--format=csv"], deadline_s=15, max_bytes=65536),
        EvidenceCommand(name="kernel-log", argv=["journalctl", "-k", "--no-pager", "-o", "short-iso",
                                                 "--since", "@" + SINCE], deadline_s=15, max_bytes=1048576),
        EvidenceCommand(name="nvidia-bug-report", argv=["nvidia-bug-report.sh", "--safe-mode",
                                                        "--extra-system-data", "--output-file",
                                                        "/tmp/nr-nvidia-bug-report.log"],
                        deadline_s=600, max_bytes=8 * 1048576, enabled=False),
    ]


class EvidenceStore(Section):
    """Where the items are kept: small ones in the database, large ones in a directory or a bucket."""

    backend: StoreBackend = Field(StoreBackend.DATABASE, description="database, directory or s3.")
    inline_bytes: int = Field(65536, ge=1024, le=1048576, description="An item up to this size is kept in "
                              "the database; a larger one goes to the directory or the bucket (database: is cut).")
    path: str = Field("/var/lib/node-remediation/evidence", description="directory: where items are written.")
    bucket: str = Field("", description="s3: the bucket.")
    prefix: str = Field("node-remediation/evidence/", description="s3: the keys' prefix.")
    endpoint_url: str | None = Field(None, description="s3: an S3-compatible endpoint (MinIO, Ceph); unset: AWS.")
    region: str | None = Field(None, description="s3: the bucket's region.")

    @model_validator(mode="after")
    def _named(self) -> EvidenceStore:
        if self.backend is StoreBackend.S3 and not self.bucket:
            raise ValueError("evidence.store.backend s3 needs evidence.store.bucket")
        return self


class EvidenceSettings(Section):
    """Collected evidence: a job on the node (through the validation backend) before the first machine
    action and before a quarantine, for the classes a site chooses; and a line in the node's journal
    before a reboot. See docs/policy.md ("Collected evidence")."""

    enabled: bool = Field(True, description="Collect at all (it needs validation.backend slurm or kubernetes; "
                          "without one, the remediation records 'no evidence: no validation backend').")
    classes: list[str] = Field(
        default_factory=lambda: ["gpu-transient", "gpu-memory", "gpu-hardware", "gpu-rma", "nvlink"],
        description="The fault classes whose node's state is collected: by default the GPU classes and nvlink.")
    commands: list[EvidenceCommand] = Field(default_factory=default_commands,
                                            description="What the job runs, in order, each on its own deadline.")
    max_wait_s: float = Field(
        90.0, gt=0, le=3600, description="The longest the evidence step holds back the hammer, seconds, "
        "from the step's start: the job is stopped and what it wrote is kept. An urgent class is never "
        "delayed longer for evidence.")
    journal: bool = Field(True, description="Before a reboot, write one line to the node's journal "
                          "(logger -t node-remediation): the remediation, the cause and the action.")
    store: EvidenceStore = Field(default_factory=EvidenceStore)

    @field_validator("classes")
    @classmethod
    def _classes(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(FAULT_CLASSES) - {"unknown"})
        if unknown:
            raise ValueError(f"unknown fault class(es) {unknown}; known: {', '.join(FAULT_CLASSES)}")
        return value

    @field_validator("commands")
    @classmethod
    def _unique(cls, value: list[EvidenceCommand]) -> list[EvidenceCommand]:
        names = [c.name for c in value]
        if len(set(names)) != len(names):
            raise ValueError(f"a command name is used twice: {names}")
        return value
