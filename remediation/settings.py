"""Typed settings: one place that maps environment, config file and defaults.

Precedence (highest first): constructor arguments, environment variables (``REMEDIATION_`` prefix,
``__`` between nested sections, e.g. ``REMEDIATION_POLICY__MAX_CONCURRENT=4``), the config file named
by ``REMEDIATION_CONFIG`` (YAML or TOML), then the defaults below.

Every default is chosen to be safe on a production GPU cluster: when in doubt the service waits, drains
and asks a human rather than restarting VMs. The reasons for the policy defaults are in ``docs/policy.md``
(drawn from the published failure traces of large GPU clusters).

Bad config fails at start-up with :class:`ConfigError`, whose message names the offending field.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

CONFIG_ENV = "REMEDIATION_CONFIG"


class ConfigError(ValueError):
    """Raised when settings cannot be loaded; the message names each bad field."""


class _Section(BaseModel):
    model_config = {"extra": "forbid"}


class DatabaseSettings(_Section):
    """Where the faulty-node database lives."""
    url: str = Field(
        "sqlite:///./remediation.db",
        description="SQLAlchemy URL. Postgres (postgresql+psycopg://...) in production; the SQLite "
        "default is only for a first run and the demo.",
    )
    pool_size: int = Field(5, ge=1, le=100, description="Connections kept open per process.")
    echo: bool = Field(False, description="Log every SQL statement (debugging only).")


class BrokerSettings(_Section):
    """Redis: the event stream and the Celery queues."""
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis holding the event stream and the Celery queues.",
    )
    key_prefix: str = Field(
        "remediation",
        description="Prefix of every Redis key we own, so several deployments (or test runs) can share "
        "one Redis without seeing each other's events.",
    )
    celery_broker_url: str | None = Field(
        None, description="Celery broker URL. Defaults to redis_url; 'memory://' for the embedded mode."
    )
    visibility_timeout_s: int = Field(
        900,
        ge=60,
        description="Seconds before Redis redelivers an unacknowledged task. Must exceed the longest "
        "countdown any step schedules (steps never sleep; see workflow.max_wait_s).",
    )
    ingest_batch: int = Field(
        500, ge=1, le=10_000, description="Events read from the stream per ingest transaction."
    )
    ingest_claim_idle_s: int = Field(
        60,
        ge=1,
        description="Seconds an event may sit read-but-unacknowledged (its consumer died) before "
        "another ingest task claims it.",
    )
    beat_state_dir: str | None = Field(
        None,
        description="Directory of Celery beat's schedule state (when each periodic task last ran), "
        "for `remediation beat` and `worker -B`; created if missing. Unset: node-remediation-KEY_PREFIX "
        "under the system's temporary directory, never the directory the process started in. Losing "
        "it is safe: each periodic task then first runs one interval after start.",
    )

    @property
    def celery_url(self) -> str:
        return self.celery_broker_url or self.redis_url

    @property
    def beat_schedule_file(self) -> Path:
        """The file beat keeps its state in (``celerybeat-schedule`` under :attr:`beat_state_dir`)."""
        state_dir = self.beat_state_dir or Path(tempfile.gettempdir()) / f"node-remediation-{self.key_prefix}"
        return Path(state_dir) / "celerybeat-schedule"


FAULT_CLASSES = ("gpu-transient", "gpu-memory", "gpu-hardware", "nvlink", "ib-link", "fabric", "host", "software",
                 "unknown")
# restart (same host), move-host (GCE/AWS stop+start, Azure redeploy), reimage, none (drain, page, hold
# for a human; only on its own), quarantine (the end of a ladder; RMA for hardware classes).
FAULT_ACTIONS = ("restart", "move-host", "reimage", "none", "quarantine")


class FaultSettings(_Section):
    """Cause classification: the signal names the cause, the cause's class picks the first
    action and the ladder. Defaults ship as data with their sources in ``remediation/data/causes.yaml``;
    each field here overrides part of that table (docs/policy.md, "Fault classes")."""

    classify: bool = Field(
        True,
        description="Read the cause from each signal and use its class's ladder. Off: every fault is "
        "`unknown` and climbs workflow.ladder, and application-level XIDs are remediated like any "
        "other fault (the behaviour before cause classification).",
    )
    ladders: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Per class, the actions tried in order, replacing the shipped ladder, e.g. "
        "{'gpu-memory': ['move-host', 'quarantine']}. Actions: restart, move-host, reimage, none "
        "(only on its own: drain, no VM action, page on-call, hold for a human), quarantine (only "
        "last; implied after the last action anyway). Class `unknown` follows workflow.ladder.",
    )
    xids: dict[int, str] = Field(
        default_factory=dict,
        description="XID code -> class (or 'app': application-level, recorded and not remediated "
        "unless it repeats), overriding NVIDIA's catalogue as shipped.",
    )
    conditions: dict[str, str] = Field(
        default_factory=dict,
        description="Kubernetes condition type -> class: aliases for a site's own detectors (a "
        "condition must also be listed in policy.kube_conditions to open anything).",
    )
    app_xid_repeat_count: int = Field(
        3,
        ge=1,
        description="An application-level XID (NVIDIA: RESTART_APP or IGNORE, e.g. 13, 31, 43, 45) is "
        "remediated only when it is this node's Nth within app_xid_repeat_window_s (this one "
        "included); before that it is recorded with decision `app_xid`. 1 = always remediate.",
    )
    app_xid_repeat_window_s: int = Field(
        24 * 3600, ge=60, description="Seconds: the window of app_xid_repeat_count (24 h)."
    )

    @field_validator("ladders")
    @classmethod
    def _ladders(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for name, ladder in value.items():
            if name not in FAULT_CLASSES:
                raise ValueError(f"unknown fault class {name!r}; choose from {list(FAULT_CLASSES)}")
            bad = [a for a in ladder if a not in FAULT_ACTIONS]
            if bad or not ladder:
                raise ValueError(f"{name}: unknown action(s) {bad}; choose from {list(FAULT_ACTIONS)}")
            if "none" in ladder and ladder != ["none"]:
                raise ValueError(f"{name}: 'none' holds for a human, so it must be the only action")
            if "quarantine" in ladder[:-1]:
                raise ValueError(f"{name}: 'quarantine' ends a ladder, so it can only be last")
        return value

    @field_validator("xids", "conditions")
    @classmethod
    def _classes(cls, value: dict[Any, str]) -> dict[Any, str]:
        for key, name in value.items():
            if name not in (*FAULT_CLASSES, "app"):
                raise ValueError(f"{key}: unknown fault class {name!r}; choose from {[*FAULT_CLASSES, 'app']}")
        return value


class LemonSettings(_Section):
    """Lemon scoring (Meta's RSC study, 2024, names such nodes "lemons"): a node's failures,
    decayed over time, weighted by class, with distinct causes counted. A score at or over the threshold
    quarantines the node as N-in-W does. Every number here is an assumption (docs/policy.md, "Lemons")."""

    enabled: bool = Field(True, description="Quarantine on the lemon score as well as on N-in-W.")
    threshold: float = Field(
        2.5, gt=0, description="Quarantine when the score (this failure included) reaches this. With "
        "the defaults: four unit-weight failures a week apart (2.7), or three GPU memory or "
        "hardware faults within three weeks (3.3); three unit-weight failures a week apart (2.2) "
        "are not a lemon.",
    )
    half_life_s: float = Field(
        14 * 86400.0, gt=0, description="Seconds after which a failure counts half (14 days)."
    )
    min_failures: int = Field(
        3, ge=1, description="A node is never a lemon on fewer counted failures than this, whatever "
        "their weight: two failures are N-in-W's business (and after a move-host the second may be on "
        "new hardware); the score is for the node that keeps coming back.",
    )
    horizon_s: float = Field(
        90 * 86400.0, gt=0, description="Failures older than this are not read at all (90 days: "
        "under 1/80 of their weight is left with the default half-life).",
    )
    distinct_bonus: float = Field(
        0.25, ge=0, description="Each distinct class beyond the first multiplies the score by (1 + "
        "this): a node failing in several ways is likelier a lemon than one with a known recurring cause.",
    )
    weights: dict[str, float] = Field(
        default_factory=dict,
        description="Class -> weight, overriding the shipped lemon_weight of each class "
        "(remediation/data/causes.yaml; fabric 0: a shared switch is not the node's fault).",
    )

    @field_validator("weights")
    @classmethod
    def _weights(cls, value: dict[str, float]) -> dict[str, float]:
        for name, w in value.items():
            if name not in FAULT_CLASSES or w < 0:
                raise ValueError(f"{name}: weights need a known class and a weight >= 0")
        return value


class PolicySettings(_Section):
    """Which signals open a remediation and how much automation may do at once."""

    slurm_states: list[str] = Field(
        ["DOWN", "DRAIN", "FAIL", "NOT_RESPONDING"],
        description="Slurm base states or flags that open a remediation.",
    )
    kube_conditions: list[str] = Field(
        ["Ready=False", "Ready=Unknown", "GpuHealthy=False", "GpuXidError=True", "KernelDeadlock=True"],
        description="Kubernetes Node conditions (Type=Status) that open a remediation once they have "
        "held for kube.min_condition_s.",
    )
    our_reason_prefix: str = Field(
        "remediation:",
        description="Prefix of every Slurm reason we set. Drains carrying it are ours; any other drain "
        "belongs to a human and is never resumed by the service.",
    )
    ignore_reasons: list[str] = Field(
        [r"(?i)^\s*maint", r"(?i)planned", r"(?i)\bpsu\b", r"(?i)^\s*admin"],
        description="Regular expressions over a human's Slurm reason. A matching drain is recorded but "
        "never remediated (maintenance is a human's job).",
    )
    repeat_offender_count: int = Field(
        3,
        ge=1,
        description="N: a node with N failures (this one included) within the window is quarantined "
        "instead of restarted again.",
    )
    repeat_offender_window_s: int = Field(
        7 * 24 * 3600, ge=60, description="W, seconds: the repeat-offender window (7 days)."
    )
    settle_s: float = Field(
        600.0,
        ge=0,
        description="Seconds after a remediation closes during which signals its own actions cause "
        "(the reboot's Ready=Unknown/False, NOT_RESPONDING or DOWN in Slurm, our drain) are still "
        "attributed to it instead of counted as a new fault. The window itself is anchored to the "
        "remediation's VM action, however long the reboot takes (GPU VMs often need more than 5 "
        "minutes); this period only covers late delivery: a condition held for kube.min_condition_s "
        "(300 s) plus one watcher resync (300 s). Longer is safe: only a signal that began inside "
        "the remediation's disruption window can be attributed, so a new fault is never hidden by it.",
    )
    max_concurrent: int = Field(
        4,
        ge=1,
        description="At most this many remediations may be in their VM phase (restart and verify) at once.",
    )
    breaker_max_fraction: float = Field(
        0.10,
        gt=0,
        le=1,
        description="Storm breaker: open when more than this fraction of the pool has failed within "
        "breaker_window_s. While open, nodes are still drained in Slurm but VM actions wait.",
    )
    breaker_min_failures: int = Field(
        3, ge=1, description="The breaker never opens on fewer failed nodes than this (small pools)."
    )
    breaker_window_s: int = Field(600, ge=10, description="Sliding window of the storm breaker, seconds.")
    breaker_auto_close_s: float | None = Field(
        None,
        gt=0,
        description="Seconds, or unset (default: off). Once open, the storm breaker latches: it stays "
        "open until a human runs `remediation breaker close -r REASON`. With this set it also closes by "
        "itself once the window no longer trips it and no node has failed for this long. Off is the "
        "safe default: a correlated fault, a detector bug or an apiserver partition looks quiet too, "
        "and only a human can tell them from a storm that is over.",
    )
    min_restart_gap_s: float = Field(
        10.0, ge=0, description="Minimum seconds between two VM actions anywhere in the cluster."
    )
    faults: FaultSettings = Field(
        default_factory=FaultSettings,
        description="Cause classification: the class of each fault picks its first action and ladder.",
    )
    lemon: LemonSettings = Field(
        default_factory=LemonSettings,
        description="Lemon scoring: quarantine a node whose decayed, class-weighted failures add up.",
    )
    probe_successes: int = Field(
        3,
        ge=1,
        description="A pause caused by a fault that heals by itself (slurmctld unreachable, munge down) "
        "is lifted after the failed component answers this many health probes in a row (one per "
        "workflow.sweep_interval_s). Three answers in a row outlast a controller that flaps while it "
        "restarts; a credential, permission, quota or configuration fault is never lifted this way, "
        "only by a human's `remediation resume`.",
    )

    @field_validator("ignore_reasons")
    @classmethod
    def _regexes_compile(cls, value: list[str]) -> list[str]:
        import re

        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from exc
        return value

    @field_validator("kube_conditions")
    @classmethod
    def _conditions_have_status(cls, value: list[str]) -> list[str]:
        for item in value:
            if item.count("=") != 1 or not all(item.split("=")):
                raise ValueError(f"condition {item!r} must look like Type=Status, e.g. Ready=False")
        return value

    @property
    def repeat_offender_window(self) -> timedelta:
        return timedelta(seconds=self.repeat_offender_window_s)

    @property
    def breaker_window(self) -> timedelta:
        return timedelta(seconds=self.breaker_window_s)


class WorkflowSettings(_Section):
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
        description="An event older than this when its remediation starts is confirmed against the live "
        "Slurm/Kubernetes state first, and nothing is done if the node is healthy again (a replay after "
        "an outage must not drain a good node). Younger events are the watchers' fresh observations.",
    )
    ladder: list[str] = Field(
        ["restart", "reimage"],
        description="VM actions tried in order when verify fails; after the last one the node is "
        "quarantined. Values: restart, reimage, redeploy, stop_start. On GCE and AWS, which have no "
        "reimage or redeploy, those rungs become stop_start (a move to fresh hardware).",
    )

    @field_validator("ladder")
    @classmethod
    def _known_actions(cls, value: list[str]) -> list[str]:
        known = {"restart", "reimage", "redeploy", "stop_start"}
        bad = [v for v in value if v not in known]
        if bad or not value:
            raise ValueError(f"unknown VM action(s) {bad}; choose from {sorted(known)}")
        return value


class SlurmSettings(_Section):
    """How the service reads and acts on slurmctld."""
    backend: Literal["cli", "rest", "pyslurm", "memory", "noop"] = Field(
        "cli", description="How we talk to slurmctld."
    )
    scontrol: str = Field("scontrol", description="Path of scontrol (cli backend).")
    sinfo: str = Field("sinfo", description="Path of sinfo (cli backend).")
    squeue: str = Field("squeue", description="Path of squeue (cli backend).")
    scancel: str = Field("scancel", description="Path of scancel (cli backend; workflow.on_jobs_timeout=cancel).")
    sbatch: str = Field("sbatch", description="Path of sbatch (validation.backend=slurm submits the check).")
    command_timeout_s: float = Field(30.0, gt=0, description="Timeout of one Slurm command.")
    slurm_conf: str | None = Field(None, description="SLURM_CONF passed to the Slurm commands.")
    rest_url: str | None = Field(
        None, description="slurmrestd URL (http://host:port or unix:/path/to.sock), rest backend."
    )
    rest_token: SecretStr | None = Field(None, description="JWT for slurmrestd (X-SLURM-USER-TOKEN).")
    rest_user: str | None = Field(None, description="X-SLURM-USER-NAME for slurmrestd JWT auth.")
    rest_api_version: str = Field("v0.0.38", description="slurmrestd API version path component.")
    poll_interval_s: float = Field(
        0.25,
        gt=0,
        description="Watcher poll interval, seconds (the shortest; see cpu_budget). Detection waits half "
        "of it on average plus the read of the bad set (one or two loads of the node table, ~30-60 ms "
        "at 10,000 nodes on an idle host). With the delta read "
        "strategy and its change probe a quiet poll costs under a millisecond of CPU and next to nothing "
        "in slurmctld, so 0.25 s is cheap; the sinfo_json strategy needs 2 s or more at 10,000 nodes.",
    )
    cpu_budget: float = Field(
        0.2,
        gt=0,
        le=1,
        description="Fraction of one core the Slurm watcher may spend, its Slurm commands included. "
        "While many nodes change, each poll reads more, and the interval stretches (up to 8x "
        "poll_interval_s) to stay within it; a quiet cluster stays at poll_interval_s.",
    )
    resync_interval_s: float = Field(
        60.0, gt=0, description="Watcher full resync (re-publishes the current bad set)."
    )
    read_strategy: Literal["delta", "sinfo_json"] = Field(
        "delta",
        description="How the cli backend's watcher reads slurmctld. 'delta': each poll reads only the "
        "bad set (sinfo -t down,drain,fail,no_respond -O ...StateComplete..., aggregated by slurmctld) "
        "and publishes new faults from its lines; nodes a line cannot describe (recoveries, a bare "
        "NOT_RESPONDING) are read in detail at once after (scontrol show node -o LIST); the whole table "
        "(scontrol show node -o) only at resync. 'sinfo_json': the whole table as sinfo --json every poll, which at 10,000 nodes "
        "costs ~0.45 s CPU and ~200 MB per call (kept to compare; see bench/slurm_watch_10k.py).",
    )
    change_probe: bool = Field(
        True,
        description="With read_strategy 'delta', ask slurmctld first whether any node changed since the "
        "last poll (slurm_load_node with an update time, through libslurm): a quiet cluster then costs "
        "under a millisecond per poll at both ends. Safe to leave on: without libslurm, or on any error, "
        "the poll simply runs sinfo.",
    )
    libslurm: str | None = Field(
        None, description="Path of libslurm for the change probe; unset = the one the Slurm commands use."
    )
    not_responding_grace_s: float = Field(
        5.0,
        ge=0,
        description="Seconds a node must stay NOT_RESPONDING (with no other bad state) before the "
        "watcher publishes it. slurmctld marks every resumed node NOT_RESPONDING until its next ping "
        "(~0.1-1 s, seen on 22.05), which must not look like a new failure; a dead slurmd stays so "
        "for SlurmdTimeout and then turns DOWN, so a few seconds' grace loses nothing.",
    )


class KubeSettings(_Section):
    """How the service reads Kubernetes Nodes, maps Slurm nodes to them and acts on them."""
    backend: Literal["kubernetes", "memory", "noop"] = Field("kubernetes", description="Kubernetes access.")
    host: str | None = Field(
        None,
        description="API server URL (https://...); unset = in-cluster config or kubeconfig. A host with a "
        "token must be https: a bearer token is never sent in clear (client-go refuses to, too).",
    )
    token: SecretStr | None = Field(None, description="Bearer token (with host).")
    ca_file: str | None = Field(
        None,
        description="PEM file of the cluster CA that signed the API server's certificate (a kubeconfig's "
        "certificate-authority, the in-cluster ca.crt), used with host. Unset = the system trust store. "
        "Safe either way: the server's certificate and name are always verified, never skipped; a "
        "missing or unreadable file is a configuration error (automation pauses), never a node's fault.",
    )
    mapping: Literal["pod", "node", "static"] = Field(
        "pod", description="How a Slurm node name resolves to a Kubernetes Node."
    )
    pod_namespace: str = Field("slurm", description="Namespace of the slurmd pods (mapping=pod).")
    pod_label_selector: str = Field(
        "app.kubernetes.io/component=slurmd", description="Label selector of slurmd pods (mapping=pod)."
    )
    static_map_file: str | None = Field(None, description="YAML {slurm_node: k8s_node} (mapping=static).")
    annotation_domain: str = Field(
        "remediation.gpu.io", description="Domain prefix of our annotations and taints."
    )
    min_condition_s: float = Field(
        300.0,
        ge=0,
        description="A bad condition must hold this long before it is published (flap suppression; "
        "MachineHealthCheck and NHC use 5 minutes).",
    )
    resync_interval_s: float = Field(300.0, gt=0, description="Watcher relist interval.")
    watch_timeout_s: int = Field(300, ge=1, description="timeoutSeconds of one watch request.")
    evict_backoff_s: float = Field(5.0, gt=0, description="Wait before retrying a 429 eviction.")
    request_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Timeout of one API request, seconds (watches use watch_timeout_s plus this). "
        "Bounds how long a worker can hang on an unresponsive API server.",
    )
    condition_skew_s: float = Field(
        5.0,
        ge=0,
        description="A condition's lastTransitionTime (another machine's clock, 1 s resolution) only "
        "shortens the min_condition_s hold when it is older than our first sighting by more than "
        "this many seconds; clock skew can therefore never make a flap look held.",
    )
    leader_ttl_s: float = Field(
        15.0,
        gt=1,
        description="TTL of the Kubernetes watcher's leader lock, seconds; a standby takes over this "
        "long after the leader dies. Renewed every third of it.",
    )

    @model_validator(mode="after")
    def _tls_for_tokens(self) -> KubeSettings:
        if self.host and self.token is not None and not self.host.lower().startswith("https://"):
            raise ValueError(f"host {self.host!r} must be https:// to carry a bearer token")
        return self


class VMSettings(_Section):
    """Which cloud provider restarts a Node's VM, and endpoint overrides."""
    backend: Literal["gce", "azure", "aws", "auto", "memory", "noop"] = Field(
        "auto", description="VM provider; 'auto' picks by the Node's providerID scheme."
    )
    gce_endpoint: str | None = Field(None, description="Override the Compute Engine endpoint (tests, PSC).")
    azure_endpoint: str | None = Field(None, description="Override the ARM endpoint (sovereign clouds).")
    azure_ca_file: str | None = Field(None, description="CA bundle for the ARM endpoint.")
    azure_polling_interval_s: float = Field(10.0, gt=0, description="LRO polling interval.")
    aws_endpoint: str | None = Field(None, description="Override the EC2 endpoint.")
    aws_region: str | None = Field(None, description="Default region when the providerID has none.")
    gce_anonymous: bool = Field(
        False,
        description="Send no Google credentials. Only for a local test endpoint: requires gce_endpoint, "
        "so a misconfigured production service fails at start-up instead of calling Google unsigned.",
    )
    azure_credential_scope: str | None = Field(
        None,
        description="OAuth scope of ARM tokens; unset = '<azure_endpoint>/.default' (right for the "
        "public, government and China clouds).",
    )
    azure_vmss_recent_s: float = Field(
        600.0,
        ge=0,
        description="Seconds. A scale-set VM whose last provisioning change is younger than this is "
        "taken as already acted on by a repeated start() (uniform scale-set instances cannot carry our "
        "idempotency tag). Must exceed workflow.lease_s so a crashed worker's restart is recognised; "
        "under-acting is caught by verify, a double restart is not.",
    )
    request_timeout_s: float = Field(
        30.0, gt=0, description="Seconds: timeout of one cloud API call (SDK retries are off; the workflow retries)."
    )
    azure_test_token: SecretStr | None = Field(
        None,
        description="A fixed bearer token sent to a local ARM test endpoint (the simulator) instead of "
        "asking Azure AD. Only allowed when azure_endpoint is https://127.0.0.1, localhost or [::1] "
        "(or azure_test_host), so it can never stand in for real credentials.",
    )
    azure_test_host: str | None = Field(
        None,
        pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
        description="Simulator only: one more host on which azure_test_token is accepted, for the "
        "docker-compose simulator service reached by its service name ('simulator'). It must be a "
        "single DNS label (no dots), so it can never name a real Azure endpoint. Unset (the default) = "
        "loopback only.",
    )

    @model_validator(mode="after")
    def _anonymous_needs_endpoint(self) -> VMSettings:
        if self.gce_anonymous and not self.gce_endpoint:
            raise ValueError("gce_anonymous is only allowed together with gce_endpoint (a local test endpoint)")
        if self.azure_test_token is not None:
            from urllib.parse import urlsplit

            host = urlsplit(self.azure_endpoint or "").hostname or ""
            if host not in ("127.0.0.1", "localhost", "::1") and host != self.azure_test_host:
                raise ValueError(
                    "azure_test_token is only allowed with an azure_endpoint on 127.0.0.1, localhost or "
                    f"[::1] (a local test endpoint) or on vm.azure_test_host, not {self.azure_endpoint!r}"
                )
        return self


class ApiToken(_Section):
    """One named bearer token. Its ``name`` is the actor every lever pulled with it is audited as."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][\w.@-]*$",
                      description="Who holds the token (a person or a team), recorded as the audit actor.")
    role: Literal["read", "admin"] = Field(description="read: every read; admin: reads and levers.")
    token_file: Path | None = Field(None, description="File holding the token (a mounted Secret); read at "
                                    "start-up, surrounding whitespace stripped.")
    token: SecretStr | None = Field(None, description="The token itself, when no file is used (e.g. "
                                    "from the environment); give exactly one of token and token_file.")

    @model_validator(mode="after")
    def _one_source(self) -> ApiToken:
        if (self.token is None) == (self.token_file is None):
            raise ValueError(f"token {self.name!r}: give exactly one of token and token_file")
        if self.token_file is not None:
            try:
                secret = self.token_file.read_text().strip()
            except OSError as exc:
                raise ValueError(f"token {self.name!r}: cannot read token_file {self.token_file}: "
                                 f"{exc.strerror}") from None
            self.token = SecretStr(secret)
        if len(self.secret()) < 16:
            raise ValueError(f"token {self.name!r}: a token must be at least 16 characters")
        return self

    def secret(self) -> str:
        return self.token.get_secret_value() if self.token is not None else ""


class ApiSettings(_Section):
    """The dashboard, JSON API and /metrics, and who may use them."""
    bind: str = Field("127.0.0.1", description="Address the API and dashboard listen on.")
    port: int = Field(8080, ge=1, le=65535, description="Port of the API and dashboard.")
    admin_tokens: list[SecretStr] = Field(
        default_factory=list, description="Bearer tokens allowed to read and to act (levers)."
    )
    read_tokens: list[SecretStr] = Field(default_factory=list, description="Read-only bearer tokens.")
    tokens: list[ApiToken] = Field(
        default_factory=list,
        description="Named tokens with a role ({name, role, token_file}): the audit actor of a lever is "
        "the token's name. The unnamed admin_tokens and read_tokens stay accepted; their names are "
        "derived (admin-<first 8 hex digits of the token's sha256>, read-<...>).",
    )
    metrics_require_token: bool = Field(
        False,
        description="Require a read or admin bearer token on /metrics. Off by default because "
        "/metrics carries only cluster-wide counts (no node names) and Prometheus scrapes it; turn it "
        "on when the port is reachable beyond the monitoring network.",
    )

    @model_validator(mode="after")
    def _distinct_names(self) -> ApiSettings:
        names = [t.name for t in self.tokens]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"api.tokens: each name must be unique (repeated: {', '.join(dup)})")
        return self


class RetentionSettings(_Section):
    """How long observed events are kept (``remediation db prune``, run by beat).

    Only events no remediation points to are pruned: every remediation keeps its own events, and
    audit rows are never pruned at all."""

    events_older_than: timedelta = Field(
        timedelta(days=90),
        description="Prune unlinked events observed longer ago than this (e.g. 90d, 12h, or seconds). "
        "90 days outlasts the repeat-offender and lemon windows, so no decision loses its evidence.",
    )
    prune_interval_s: float = Field(
        86400.0, ge=0, description="How often beat runs the prune, in seconds (default daily; 0: never).",
    )
    batch: int = Field(10000, ge=1, le=1_000_000,
                       description="Rows deleted per transaction, so a first prune of a big table "
                       "never holds one long lock.")

    @field_validator("events_older_than", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return parse_duration(value) if isinstance(value, str) else value

    @field_validator("events_older_than")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be a positive duration")
        return value


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """``90d``, ``12h``, ``30m``, ``45s``, ``2w`` or a bare number of seconds, as a timedelta."""
    raw = text.strip().lower()
    number, unit = (raw[:-1], raw[-1]) if raw and raw[-1] in _UNITS else (raw, "s")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration: use a number and a unit, e.g. 90d, 12h, 30m") from None
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"{text!r}: a duration must be a positive number")
    return timedelta(seconds=value * _UNITS[unit])


class NotifySettings(_Section):
    """Slack-compatible webhook notifications, rate-limited."""
    webhook_url: SecretStr | None = Field(None, description="Slack-compatible incoming webhook; unset = off.")
    min_interval_s: float = Field(
        300.0, ge=0, description="At most one message per kind and node within this many seconds."
    )
    max_per_pass: int = Field(
        5,
        ge=1,
        le=100,
        description="Messages posted per outbox pass (every 10 s); anything beyond is collapsed into one "
        "summary message, so a storm pages a handful of times, not hundreds.",
    )
    max_age_s: float = Field(
        3600.0,
        gt=0,
        description="Audit rows older than this (seconds) are skipped, not posted: after an outage or "
        "on first enabling the webhook, stale news is not worth a page.",
    )
    timeout_s: float = Field(
        10.0, gt=0, le=60, description="Seconds before one webhook POST gives up (retried next pass)."
    )
    dashboard_url: str | None = Field(
        None, description="Public base URL of the dashboard; when set, messages link to the node's page."
    )


class SimSettings(_Section):
    """The simulated cluster behind the ``memory`` backends (embedded default, demo, tests)."""

    nodes: str = Field("gpu-node-[0-15]", description="Hostlist of simulated nodes.")
    journal: str | None = Field(
        None,
        description="JSON file holding the simulated world, shared by every worker process; unset = "
        "in-process memory only.",
    )
    op_polls: int = Field(1, ge=1, description="Polls before a simulated VM operation completes.")
    call_delay_s: dict[str, float] = Field(
        default_factory=dict,
        description="Seconds a simulated call sleeps after acting (e.g. {'vm.start': 5}); for crash tests.",
    )


class IncidentSettings(_Section):
    """Topology-correlated incidents: when at least ``min_nodes`` nodes, or a fraction ``min_fraction``,
    of one failure domain (a Slurm switch, a Node label value such as a zone or an NVLink clique) fail
    within ``window_s``, they are one incident: drained in Slurm, no VM action, one page, never
    counted as repeat offenders. See docs/policy.md ("Correlated incidents")."""

    enabled: bool = Field(
        True, description="Open incidents at all. Off: every node is remediated on its own, as before."
    )
    min_nodes: int = Field(
        4,
        ge=2,
        description="K: an incident opens when at least this many nodes of one domain fail within "
        "window_s. 4 is a leaf switch's worth on most GPU fabrics (4-8 nodes per leaf); two nodes of a "
        "large domain failing together is chance, not a switch.",
    )
    min_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="F: ... or when at least this fraction of the domain's known nodes fail within "
        "window_s (and at least two do: one node is never a correlated fault). Half a leaf switch or "
        "half an NVLink domain going down together is the domain, not its nodes.",
    )
    window_s: float = Field(
        120.0,
        gt=0,
        description="T, seconds: failures of one domain this close together are one event. A switch "
        "that dies takes its nodes' slurmds out of reach within one SlurmdTimeout (300 s default), "
        "but slurmctld marks them in the same ping sweep; 120 s covers one sweep and a watcher poll.",
    )
    vm_grace_s: float = Field(
        120.0,
        ge=0,
        description="Seconds a remediation of a node that belongs to a domain waits after it opened "
        "before its first VM action, so that the failures of the same domain still to come can fold "
        "it into an incident first. Set it at least window_s: a remediation older than the window "
        "can no longer be part of a new incident. 0 turns the wait off.",
    )
    min_nodes_by_kind: dict[str, int] = Field(
        default_factory=dict,
        description="K for one kind of domain (a label key, or leaf-switch, switch, block), e.g. "
        '{"topology.kubernetes.io/zone": 64}: a zone holds thousands of nodes, and four of them failing '
        "in the same two minutes is chance, not the zone. Kinds not named use min_nodes.",
    )
    label_keys: list[str] = Field(
        default_factory=list,
        description="Node label keys whose values are failure domains; the Kubernetes watcher carries "
        "them to the service. Empty by default (only the Slurm topology is learnt): name the ones your "
        "cloud sets, e.g. nvidia.com/gpu.clique (NVIDIA GPU operator/DRA driver: the NVLink clique), "
        "cloud.google.com/gce-topology-subblock (GKE: the sub-block, the NVL72 domain on A4X), "
        "cloud.google.com/gce-topology-block (GKE: the reserved block) or topology.kubernetes.io/zone "
        "(well-known; give it a larger K in min_nodes_by_kind). See docs/policy.md.",
    )
    slurm_topology: bool = Field(
        True,
        description="Learn switch domains from `scontrol show topology` (topology/tree or "
        "topology/block). A cluster without a topology plugin simply has no switch domains.",
    )
    topology_refresh_s: float = Field(
        600.0, gt=0, description="How often the Slurm watcher re-reads the topology, seconds."
    )
#: Cause classes (the fault-intelligence classes; ``unknown`` when a remediation has none).
CAUSE_CLASSES = ("gpu-transient", "gpu-memory", "gpu-hardware", "nvlink", "ib-link", "fabric", "host",
                 "software", "unknown")
_DCGM_2 = ["dcgmi", "diag", "-r", "2"]  # "medium", about 2 minutes (DCGM's dcgmi diag reference)
_DCGM_3 = ["dcgmi", "diag", "-r", "3"]  # "long", about 15 minutes: the memory tests
_NCCL = ["all_reduce_perf", "-b", "8", "-e", "1G", "-f", "2", "-g", "8"]  # nccl-tests, one node, 8 GPUs


def _default_checks() -> dict[str, list[str]]:
    return {
        "gpu-transient": _DCGM_2, "gpu-hardware": _DCGM_2, "host": _DCGM_2, "software": _DCGM_2,
        "unknown": _DCGM_2, "gpu-memory": _DCGM_3, "nvlink": _NCCL, "ib-link": _NCCL, "fabric": _NCCL,
    }


class ValidationSettings(_Section):
    """The GPU health gate between verify and return (docs/policy.md, "Validate before return").

    The check runs on the node before any user job can land there: as a Slurm job in a maintenance
    reservation only the service's user may use (``slurm``), or as a Kubernetes Job bound to the Node
    that tolerates our cordon and taint (``kubernetes``). ``none`` returns a verified node at once."""

    backend: Literal["none", "slurm", "kubernetes"] = Field(
        "none",
        description="Where the check runs. Default none: a new install does not yet know whether its "
        "nodes carry dcgmi and nccl-tests (or which image does), and a check that cannot run must never "
        "be read as a verdict on every node; see docs/policy.md for when to turn it on.",
    )
    checks: dict[str, list[str]] = Field(
        default_factory=_default_checks,
        description="The check per cause class, an argument list (no shell). A class not listed uses "
        "'unknown'. Defaults: dcgmi diag -r 2 (GPU classes), -r 3 (gpu-memory), nccl-tests "
        "all_reduce_perf (nvlink, ib-link, fabric).",
    )
    timeout_s: dict[str, float] = Field(
        default_factory=lambda: {"default": 600.0, "gpu-memory": 1800.0},
        description="Deadline of the check per cause class, seconds ('default' for the rest). Level 2 "
        "normally takes about 2 minutes and level 3 about 15 (DCGM's documentation): the defaults allow "
        "several times that before the gate holds the node and pages.",
    )
    poll_interval_s: float = Field(
        2.0, gt=0, description="How often a running check is looked at, seconds: one scontrol show job or one Job "
        "read per validating node; half of it is, on average, added to every gate (bench/gate_overhead.py).")
    output_bytes: int = Field(4096, ge=256, le=65536, description="Bytes of the check's output kept (its end).")
    slurm_user: str | None = Field(
        None, description="The only user the maintenance reservation admits (slurm backend); unset = the "
        "user the service runs as, which submits the check.",
    )
    slurm_workdir: str = Field(
        "/var/lib/node-remediation/gate",
        description="Directory for the check job's script and output (slurm backend): on a file system "
        "the compute nodes write and the workers read.",
    )
    slurm_partition: str | None = Field(None, description="Partition of the check job (slurm backend); unset = "
                                        "the cluster's default.")
    kube_namespace: str = Field("node-remediation", description="Namespace of the check Jobs (kubernetes backend).")
    kube_image: str = Field(
        "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
        description="Image of the check Job (kubernetes backend): it must hold the configured commands.",
    )
    kube_gpus: int = Field(8, ge=0, description="nvidia.com/gpu the check Job requests (kubernetes backend).")

    @field_validator("checks")
    @classmethod
    def _checks_are_argv(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for name, argv in value.items():
            if name not in CAUSE_CLASSES:
                raise ValueError(f"{name!r} is not a cause class (one of {', '.join(CAUSE_CLASSES)})")
            if not argv or not all(isinstance(a, str) and a for a in argv):
                raise ValueError(f"the check of {name!r} must be a non-empty argument list")
        if "unknown" not in value:
            raise ValueError("checks must name a check for 'unknown' (the class of an unclassified cause)")
        return value

    @field_validator("timeout_s")
    @classmethod
    def _timeouts(cls, value: dict[str, float]) -> dict[str, float]:
        for name, seconds in value.items():
            if name != "default" and name not in CAUSE_CLASSES:
                raise ValueError(f"{name!r} is not a cause class or 'default'")
            if not seconds > 0:
                raise ValueError(f"timeout of {name!r} must be positive seconds")
        if "default" not in value:
            raise ValueError("timeout_s must have a 'default'")
        return value

    def check_for(self, cause_class: str | None) -> list[str]:
        return list(self.checks.get(cause_class or "unknown") or self.checks["unknown"])

    def timeout_for(self, cause_class: str | None) -> float:
        return self.timeout_s.get(cause_class or "unknown", self.timeout_s["default"])


class HealthSettings(_Section):
    """The small HTTP endpoint every long-running process other than the API serves (watchers, workers,
    beat): ``/livez`` (the process's own loop still turns: restart it if not), ``/readyz`` (it does its
    job: a watcher's leader polls successfully, a standby waits; a worker holds its broker connection)
    and ``/metrics``. Off unless ``port`` is set; deploy/ and docker-compose.yml set it."""
    bind: str = Field(
        "127.0.0.1", description="Address of the health endpoint (0.0.0.0 in a pod: kubelet and Prometheus)."
    )
    port: int | None = Field(
        None, ge=0, le=65535, description="Port of the health endpoint; unset = no endpoint (0: any free port)."
    )
    liveness_stale_s: float = Field(
        120.0, gt=0, description="/livez fails once the process's own loop has not turned for this long."
    )
    readiness_stale_s: float = Field(
        600.0,
        gt=0,
        description="/readyz of a leading watcher fails once its last successful poll or watch response "
        "is older than this (above kube.watch_timeout_s: a quiet watch answers once per request).",
    )


class Settings(BaseSettings):
    """All settings of node-remediation. See the class docstrings of each section."""

    model_config = SettingsConfigDict(
        env_prefix="REMEDIATION_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    dry_run: bool = Field(
        False,
        description="Swap every adapter that acts for its no-op twin: everything is recorded, nothing "
        "is changed in Slurm, Kubernetes or the cloud.",
    )
    actor: str = Field("remediation", description="Name recorded as the actor of automated actions.")
    log_level: str = Field("INFO", description="Python logging level of every process (DEBUG, INFO, "
                           "WARNING, ERROR); Celery's --loglevel and uvicorn's are this one.")
    log_format: Literal["text", "json"] = Field(
        "text", description="text: one readable line per record; json: one JSON object per line "
        "(level, message, logger, time and the record's fields), for a log pipeline.",
    )
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    workflow: WorkflowSettings = Field(default_factory=WorkflowSettings)
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    kube: KubeSettings = Field(default_factory=KubeSettings)
    vm: VMSettings = Field(default_factory=VMSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    notify: NotifySettings = Field(default_factory=NotifySettings)
    sim: SimSettings = Field(default_factory=SimSettings)
    incidents: IncidentSettings = Field(default_factory=IncidentSettings)
    validation: ValidationSettings = Field(default_factory=ValidationSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        level = value.strip().upper()
        if level not in ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"):
            raise ValueError("choose DEBUG, INFO, WARNING, ERROR or CRITICAL")
        return level

    @model_validator(mode="after")
    def _cross_checks(self) -> Settings:
        if self.workflow.max_wait_s >= self.broker.visibility_timeout_s:
            raise ValueError(
                "workflow.max_wait_s must be below broker.visibility_timeout_s, or Redis would "
                "deliver a waiting task twice"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = os.environ.get(CONFIG_ENV)
        if path:
            sources.append(_file_source(settings_cls, Path(path)))
        return tuple(sources)


def _file_source(settings_cls: type[BaseSettings], path: Path) -> PydanticBaseSettingsSource:
    if not path.is_file():
        raise ConfigError(f"{CONFIG_ENV}={path}: no such config file")
    if path.suffix in (".yaml", ".yml"):
        return YamlConfigSettingsSource(settings_cls, yaml_file=path)
    if path.suffix == ".toml":
        return TomlConfigSettingsSource(settings_cls, toml_file=path)
    raise ConfigError(f"{CONFIG_ENV}={path}: config file must end in .yaml, .yml or .toml")


def load_settings(**overrides: Any) -> Settings:
    """Load and validate settings, turning pydantic's report into one readable ConfigError."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "settings"
            value = err.get("input")
            # A section-level check's input is the whole section, tokens included: never echo it.
            got = "" if isinstance(value, dict) else f" (got {value!r})"
            lines.append(f"{field}: {err['msg']}{got}")
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None
    except Exception as exc:  # YAML/TOML syntax errors and non-JSON list values surface here
        if isinstance(exc, ConfigError):
            raise
        bad = _non_json_env()
        if bad:
            raise ConfigError("invalid configuration:\n  " + "\n  ".join(bad)) from None
        raise ConfigError(f"cannot read configuration: {exc}") from exc


def _non_json_env() -> list[str]:
    """Name the environment variables whose field wants a list or mapping but whose value is not JSON
    (pydantic-settings only names the section)."""
    out = []
    for key, value in sorted(os.environ.items()):
        if not key.startswith("REMEDIATION_") or key == CONFIG_ENV:
            continue
        model: Any = Settings
        path = key.removeprefix("REMEDIATION_").lower().split("__")
        for part in path:
            field = getattr(model, "model_fields", {}).get(part)
            if field is None:
                break
            model = field.annotation
        else:
            origin = getattr(model, "__origin__", None)
            if origin in (list, dict) or (isinstance(model, type) and issubclass(model, BaseModel)):
                try:
                    json.loads(value)
                except ValueError:
                    kind = "a JSON list, e.g. [\"a\", \"b\"]" if origin is list else "a JSON object"
                    out.append(f"{'.'.join(path)}: {key} must be {kind} (got {value[:60]!r})")
    return out


def overlay(base: Settings, path: Path) -> Settings:
    """``base`` with a second config file laid over it (a rehearsal's baseline policy): the file's
    sections replace the base's field by field, the rest stays as ``base`` has it."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    if path.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"{path}: a policy file must end in .yaml or .yml")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a policy file is a mapping of settings sections")

    def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out = dict(a)
        for key, value in b.items():
            out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out

    return load_settings(**merge(base.model_dump(), data))
