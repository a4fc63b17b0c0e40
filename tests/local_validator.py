"""A validator at our own port that runs each job's argument list as a process on this machine: the
evidence job's real script against the stand-in tools a test puts on the PATH, and the GPU check's
command. A look waits for the process to end (a job that is done by the time anyone looks), so an
engine on a fake clock sees each job end at its first poll."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from typing import Any

from remediation.validation.port import ValidationCheck, ValidationResult


@dataclass
class LocalJobs:
    backend: str = "local"
    started: list[ValidationCheck] = field(default_factory=list)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, check: ValidationCheck) -> dict[str, Any]:
        if check.name not in self.procs:  # a used name finds the job its first start made
            self.started.append(check)
            self.procs[check.name] = subprocess.Popen(list(check.command), stdout=subprocess.PIPE,
                                                      stderr=subprocess.STDOUT)
        return {"job_ref": check.name}

    def poll(self, ref: dict[str, Any]) -> ValidationResult:
        proc = self.procs[ref["name"]]
        out, _ = proc.communicate(timeout=60)
        return ValidationResult(True, proc.returncode, (out or b"").decode("utf-8", "replace"), "COMPLETED")

    def finish(self, ref: dict[str, Any]) -> str:
        return "job ended"
