"""``slurm``: how the service reads and acts on slurmctld (``REMEDIATION_SLURM__*``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from remediation.settings.base import Section
from remediation.settings.transport import clear_to_remote


class SlurmSettings(Section):
    """How the service reads and acts on slurmctld."""
    backend: Literal["cli", "rest", "pyslurm", "memory", "noop"] = Field(
        "cli", description="How we talk to slurmctld: cli, rest or pyslurm; memory is the simulated world; "
        "noop is the dry-run twin, refused outside dry-run."
    )
    scontrol: str = Field("scontrol", description="Path of scontrol (cli backend).")
    sinfo: str = Field("sinfo", description="Path of sinfo (cli backend).")
    squeue: str = Field("squeue", description="Path of squeue (cli backend).")
    scancel: str = Field("scancel", description="Path of scancel (cli backend; workflow.on_jobs_timeout=cancel).")
    sbatch: str = Field("sbatch", description="Path of sbatch (validation.backend=slurm submits the check).")
    command_timeout_s: float = Field(30.0, gt=0, description="Timeout of one Slurm command.")
    slurm_conf: str | None = Field(None, description="SLURM_CONF passed to the Slurm commands.")
    rest_url: str | None = Field(
        None,
        description="slurmrestd URL (https://host:port, or unix:/path/to.sock), rest backend. With a "
        "rest_token, plain http:// is refused unless the host is loopback: the JWT would cross the "
        "network in clear.",
    )
    rest_token: SecretStr | None = Field(None, description="JWT for slurmrestd (X-SLURM-USER-TOKEN).")
    rest_ca_file: str | None = Field(
        None,
        description="PEM file of the CA that signed slurmrestd's certificate (an https rest_url); unset = "
        "the system trust store. The certificate and its name are always verified.",
    )
    rest_user: str | None = Field(None, description="X-SLURM-USER-NAME for slurmrestd JWT auth.")
    rest_api_version: str = Field("v0.0.38", description="slurmrestd API version path component.")
    topology_conf: str | None = Field(
        None,
        description="The cluster's topology file, read for switch and block domains "
        "(incidents.slurm_topology) instead of `scontrol show topology`: a topology.conf, a topology.yaml "
        "(Slurm 25.05+; told apart by its .yaml/.yml suffix) or the directory holding them (slurm.conf's). "
        "As in Slurm, a topology.yaml wins: in the directory, or beside the topology.conf named here. "
        "For the rest backend, where slurmrestd serves no switch list: unset, the rest backend's watcher "
        "uses scontrol if installed, else learns no switch domains and says so at start-up.",
    )
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
        60.0, gt=0, description="Watcher full resync: re-publishes the current bad set, and the nodes' "
        "inventory (the whole of it three times within policy.pool_stale_s, else the nodes whose own "
        "changed)."
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

    @model_validator(mode="after")
    def _token_never_in_clear(self) -> SlurmSettings:
        host = clear_to_remote(self.rest_url or "") if self.rest_token is not None else None
        if host is not None:
            raise ValueError(
                f"rest_token would be sent in clear over http:// to {host}: give rest_url as https:// "
                "(slurmrestd behind TLS; rest_ca_file for a private CA), a unix: socket, or a loopback host"
            )
        return self
