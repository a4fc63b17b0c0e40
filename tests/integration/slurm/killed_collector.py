"""A worker that dies right after it submitted the evidence job (``python -m`` this, with a JSON
argument).

It runs the ``collect_evidence`` step of one remediation through the real engine and validator; the
moment ``sbatch`` has answered it prints ``SUBMITTED <job id>`` and blocks, and the test SIGKILLs it
there: after the job was submitted, before the step could record it. Nothing here is a production
hook; the wrapper only marks the moment.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import NullPool

from remediation.adapters.memory import MemoryVM, MemoryWorld
from remediation.adapters.slurm.cli import CliSlurm
from remediation.adapters.slurm.validator import SlurmValidator
from remediation.clock import SystemClock
from remediation.domain.step_bodies import Adapters
from remediation.services.workflow import Workflow
from remediation.settings import load_settings
from remediation.validation.port import ValidationCheck


def main() -> None:
    cfg: dict[str, Any] = json.loads(sys.argv[1])
    submit = SlurmValidator.start

    def submit_then_wait_to_die(self: SlurmValidator, check: ValidationCheck) -> dict[str, Any]:
        ref = submit(self, check)
        print("SUBMITTED", ref["job_id"], flush=True)
        sys.stdin.read()  # killed here
        return ref

    SlurmValidator.start = submit_then_wait_to_die  # type: ignore[method-assign]
    settings = load_settings(slurm=cfg["slurm"], validation=cfg["validation"], workflow=cfg["workflow"])
    sessions = sessionmaker(create_engine(cfg["db"], poolclass=NullPool))
    world = MemoryWorld(nodes=[cfg["node"]])  # the machine, as the test's resumed worker has it
    adapters = Adapters(CliSlurm(settings.slurm), None, MemoryVM(world), SlurmValidator(settings.slurm, settings.validation))
    Workflow(sessions, adapters, settings, clock=SystemClock()).run(cfg["rid"], "collect_evidence")
    print("NOT KILLED", flush=True)


if __name__ == "__main__":
    main()
