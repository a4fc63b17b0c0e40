"""``workflow``: the timeouts and retry budget of the remediation state machine
(``REMEDIATION_WORKFLOW__*``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from remediation.settings.base import Section
from remediation.vocabulary import FAULT_CLASSES

#: The signals a checkpoint request may send (``scancel --signal=NAME``): the ones a job can catch.
#: KILL and STOP cannot be caught, so they could never mean "save your work".
CHECKPOINT_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "ALRM", "CONT", "URG", "XCPU")


class WorkflowSettings(Section):
    """Timeouts and retry budget of the remediation state machine."""

    drain_timeout_s: int = Field(
        3600, ge=0, description="Seconds slurm_drain waits for the node's jobs to leave before "
        "workflow.on_jobs_timeout applies. Nothing destructive happens while jobs remain, however long.",
    )
    on_jobs_timeout: Literal["hold", "requeue", "cancel"] = Field(
        "hold",
        description="What slurm_drain does when jobs are still on the node after drain_timeout_s. "
        "hold (default): keep the node drained, page once and keep waiting for the jobs or a human; "
        "requeue: `scontrol requeue` the jobs; cancel: `scancel` them. Each is audited with the job "
        "ids. hold is the safe default: a researcher's job is never ended by the service unless a "
        "site chooses so.",
    )
    checkpoint_signal: str = Field(
        "",
        description="The signal a checkpoint request sends to the jobs the drain finds on a node (e.g. "
        "USR1; a leading SIG is accepted), once, before the wait on them; empty (default) = no request. "
        "Off by default: only a site whose jobs save their work on that signal should send it (an "
        "untrapped USR1 ends a job).",
    )
    checkpoint_wait_s: int = Field(
        300,
        ge=1,
        description="Seconds after the checkpoint request before on_jobs_timeout applies to the jobs "
        "still on the node, instead of waiting out drain_timeout_s. 300 s lets a large training run "
        "write a checkpoint; never longer than drain_timeout_s in effect.",
    )
    checkpoint_scope: Literal["batch", "full"] = Field(
        "batch",
        description="Who gets the signal: batch (`scancel --batch`: the job's batch script, which "
        "passes it on as it sees fit) or full (`scancel --full`: the batch script and every step).",
    )
    checkpoint_classes: list[str] | None = Field(
        None,
        description="The fault classes whose jobs get the checkpoint request; unset (default) = every "
        "class not marked urgent in the cause table (docs/policy.md says which and why).",
    )
    checkpoint_pods: bool = Field(
        False,
        description="Also ask the pods an eviction would remove: k8s_evict annotates them with the "
        "request (<kube.annotation_domain>/checkpoint-requested-at and checkpoint-deadline; no exec) "
        "and evicts checkpoint_wait_s later, or as soon as they have left. Needs checkpoint_signal set "
        "and the workers allowed to patch pods (deploy/components/checkpoint-pods); off by default.",
    )
    isolate_batch: int = Field(
        32,
        ge=1,
        le=1000,
        description="Newly opened remediations per remediation.isolate task: their isolation (slurm_drain, "
        "then k8s_cordon) runs in one task, many at once, so a mass failure is out of the schedulers' "
        "hands in seconds (their Slurm commands merge; docs/architecture.md). A worker process takes "
        "its next task only when the slowest remediation of this one is through, so small batches wait. "
        "A batch larger than isolate_threads adds nothing in flight and holds its process longer, and "
        "another cluster's ingest waits for a free process.",
    )
    isolate_threads: int = Field(
        32,
        ge=1,
        le=64,
        description="Remediations one remediation.isolate task takes through isolation at the same time "
        "(threads; each holds a database connection only inside a step's transactions).",
    )
    evict_timeout_s: int = Field(
        900,
        ge=0,
        description="How long k8s_evict retries PDB-blocked evictions before escalating (never force).",
    )
    vm_operation_timeout_s: int = Field(
        1800,
        ge=60,
        description="How long to wait on a provider operation (cloud reboots typically finish in <25 min).",
    )
    verify_timeout_s: int = Field(
        1200, ge=30, description="How long verify waits for Ready with a new bootID before escalating."
    )
    poll_interval_s: float = Field(
        15.0, gt=0, description="Countdown between two checks of a waiting step."
    )
    max_wait_s: float = Field(
        60.0,
        gt=0,
        description="Upper bound of any countdown; keeps every task well under the broker's "
        "visibility timeout.",
    )
    transient_retries: int = Field(
        8,
        ge=0,
        description="Transient errors (429, 5xx, timeouts) a step may meet back to back: the count "
        "restarts at every successful call, so a long operation polled through a noisy API never "
        "exhausts it. The step gives up only past this many consecutive errors *and* "
        "transient_budget_s of failing (see docs/policy.md, 'Transient errors').",
    )
    transient_budget_s: float = Field(
        240.0,
        ge=0,
        description="Seconds a step must have been failing without a single success before it gives "
        "up (together with more than transient_retries errors in a row). 240 s is what the default "
        "backoff takes for 8 errors in a row (2+4+8+16+32+60+60+60 s), so with defaults both bounds "
        "are reached together; the time bound is what stops a quick burst (a short Retry-After, "
        "several calls per attempt) from ending a step that a few more seconds would have finished.",
    )
    backoff_base_s: float = Field(
        2.0, gt=0, description="First retry delay; doubles with each consecutive transient error."
    )
    backoff_max_s: float = Field(300.0, gt=0, description="Retry delay cap.")
    lease_s: float = Field(
        300.0,
        gt=0,
        description="A step holds its remediation for this long; a worker that dies mid-step is "
        "superseded once its lease expires.",
    )
    sweep_interval_s: float = Field(30.0, gt=0, description="How often the sweeper looks for stuck work.")
    stale_event_s: float = Field(
        120.0,
        ge=0,
        description="Every event is confirmed against the live Slurm/Kubernetes state before the first "
        "action, and nothing is done if the node is healthy there. One older than this when its remediation "
        "starts is called stale in the outcome (a replay after an outage); a younger one unconfirmed.",
    )
    unproven: Literal["hold", "quarantine"] = Field(
        "hold",
        description="What return does with a node nothing at this site can prove healthy: no machine "
        "action (machine.backend none) and no GPU check (validation.backend none). hold (default): keep "
        "it drained, page once and wait until a human gives it back (cancel, or resume it in Slurm); "
        "quarantine: quarantine it now. Never a resume without evidence; docs/policy.md says why hold.",
    )
    ladder: list[str] = Field(
        ["restart", "reimage"],
        description="VM actions tried in order when verify fails; after the last one the node is "
        "quarantined. Values: restart, reimage, redeploy, stop_start. On GCE and AWS, which have no "
        "reimage or redeploy, those rungs become stop_start (a move to fresh hardware).",
    )

    @field_validator("checkpoint_signal")
    @classmethod
    def _catchable_signal(cls, value: str) -> str:
        name = value.strip().upper()
        name = name[3:] if name.startswith("SIG") else name
        if name and name not in CHECKPOINT_SIGNALS:
            raise ValueError(f"{value!r} is not a signal a job can catch to save its work; choose from "
                             f"{list(CHECKPOINT_SIGNALS)}, or leave it empty for no checkpoint request")
        return name

    @field_validator("checkpoint_classes")
    @classmethod
    def _known_classes(cls, value: list[str] | None) -> list[str] | None:
        bad = [c for c in value or () if c not in FAULT_CLASSES]
        if bad:
            raise ValueError(f"unknown fault class(es) {bad}; choose from {list(FAULT_CLASSES)}")
        return value

    @model_validator(mode="after")
    def _pods_need_a_signal(self) -> WorkflowSettings:
        if self.checkpoint_pods and not self.checkpoint_signal:
            raise ValueError("workflow.checkpoint_pods asks pods along with the jobs, and workflow.checkpoint_signal "
                             "is empty (no checkpoint request at all); set a signal, or checkpoint_pods: false")
        if self.checkpoint_pods and self.checkpoint_wait_s >= self.evict_timeout_s:
            # The pods' wait is part of k8s_evict, whose evict_timeout_s would run out before any eviction.
            raise ValueError(f"workflow.checkpoint_wait_s ({self.checkpoint_wait_s}) must be below "
                             f"workflow.evict_timeout_s ({self.evict_timeout_s}) with checkpoint_pods: the pods' "
                             "wait counts toward the eviction's timeout")
        return self

    @field_validator("ladder")
    @classmethod
    def _known_actions(cls, value: list[str]) -> list[str]:
        known = {"restart", "reimage", "redeploy", "stop_start"}
        bad = [v for v in value if v not in known]
        if bad or not value:
            raise ValueError(f"unknown VM action(s) {bad}; choose from {sorted(known)}")
        return value
