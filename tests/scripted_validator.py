"""A validator at our own port whose polls answer from a script, for the steps that run jobs on a node
(the GPU check, the GPU reset)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from remediation.evidence_collection.rules import PURPOSE as EVIDENCE
from remediation.validation.port import ValidationCheck, ValidationResult


@dataclass
class ScriptedValidator:
    """A validator whose polls answer from a script; records every call. An evidence job (which reads
    the node and changes nothing) is not the script's: it ends at once, with no output."""

    results: list[ValidationResult]
    backend: str = "scripted"
    calls: list[tuple[str, Any]] = field(default_factory=list)
    evidence: set[str] = field(default_factory=set)

    def start(self, check: ValidationCheck) -> dict[str, Any]:
        self.calls.append(("start", check))
        if check.purpose == EVIDENCE:
            self.evidence.add(check.name)
        return {"job_id": "42"}

    def poll(self, ref: dict[str, Any]) -> ValidationResult:
        self.calls.append(("poll", ref["name"]))
        if ref["name"] in self.evidence:
            return ValidationResult(True, 0, "", "COMPLETED")
        return self.results.pop(0)

    def finish(self, ref: dict[str, Any]) -> str:
        self.calls.append(("finish", ref["name"]))
        return "set-up undone"
