"""``validation``: the GPU check between verify and return (``REMEDIATION_VALIDATION__*``)."""

from __future__ import annotations

import os
import stat
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from remediation.settings.base import Section
from remediation.vocabulary import FAULT_CLASSES

_DCGM_2 = ["dcgmi", "diag", "-r", "2"]  # "medium", about 2 minutes (DCGM's dcgmi diag reference)
_DCGM_3 = ["dcgmi", "diag", "-r", "3"]  # "long", about 15 minutes: the memory tests
_NCCL = ["all_reduce_perf", "-b", "8", "-e", "1G", "-f", "2", "-g", "8"]  # nccl-tests, one node, 8 GPUs
#: nccl-tests across the domain: one MPI rank per GPU (srun starts 4 per tray, a GB200 tray's GPUs) on
#: every node of the one job, 8 B to 8 GiB doubling; built with MPI=1 (the nccl-tests README).
_NCCL_DOMAIN = ["srun", "--ntasks-per-node=4", "all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "1"]
#: The NVLink-domain fault classes a domain check is chosen by, ``unknown`` for the rest.
DOMAIN_CLASSES = ("nvswitch", "imex", "nvlink", "unknown")


def loose_mode(path: str) -> int | None:
    """The permission bits of directory ``path`` when its group or others may write it (None when only
    its owner may, or when it does not exist yet). Whoever may write there may replace the script every
    check runs on the nodes, or the output the verdict is read from."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return stat.S_IMODE(mode) if mode & (stat.S_IWGRP | stat.S_IWOTH) else None


def loose_mode_message(path: str, mode: int) -> str:
    return (f"{path} is writable by group or others (mode {mode:04o}); it holds the script the check runs "
            "on the nodes: make it writable by its owner only (chmod go-w)")


def _default_checks() -> dict[str, list[str]]:
    return {
        "gpu-transient": _DCGM_2, "gpu-hardware": _DCGM_2, "host": _DCGM_2, "software": _DCGM_2,
        "unknown": _DCGM_2, "gpu-memory": _DCGM_3, "gpu-rma": _DCGM_3, "nvlink": _NCCL, "ib-link": _NCCL,
        "fabric": _NCCL, "nvswitch": _NCCL,
    }


def _default_domain_checks() -> dict[str, list[str]]:
    return {cls: list(_NCCL_DOMAIN) for cls in DOMAIN_CLASSES}


def _argv(what: str, argv: object) -> list[str]:
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a for a in argv):
        raise ValueError(f"{what} must be a non-empty argument list (no shell)")
    return argv


class ValidationSettings(Section):
    """The GPU validation between verify and return (docs/policy.md, "Validate before return").

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
        "'unknown'. Defaults: dcgmi diag -r 2 (GPU classes), -r 3 (gpu-memory, gpu-rma), nccl-tests "
        "all_reduce_perf (nvlink, nvswitch, ib-link, fabric).",
    )
    timeout_s: dict[str, float] = Field(
        default_factory=lambda: {"default": 600.0, "gpu-memory": 1800.0},
        description="Deadline of the check per cause class, seconds ('default' for the rest). Level 2 "
        "normally takes about 2 minutes and level 3 about 15 (DCGM's documentation): the defaults allow "
        "several times that before the validation holds the node and pages.",
    )
    poll_interval_s: float = Field(
        2.0, gt=0, description="How often a running check is looked at, seconds: one scontrol show job or one Job "
        "read per validating node; half of it is, on average, added to every validation (bench/validation_overhead.py).")
    output_bytes: int = Field(4096, ge=256, le=65536, description="Bytes of the check's output kept (its end).")
    slurm_user: str | None = Field(
        None, description="The only user the maintenance reservation admits (slurm backend); unset = the "
        "user the service runs as, which submits the check.",
    )
    slurm_workdir: str = Field(
        "/var/lib/node-remediation/gate",
        description="Directory for the check job's script and output (slurm backend): on a file system "
        "the compute nodes write and the workers read. Writable by its owner only (the service's user): a "
        "directory group or others may write stops the start, since its script runs on the nodes.",
    )
    slurm_partition: str | None = Field(None, description="Partition of the check job (slurm backend); unset = "
                                        "the cluster's default.")
    kube_namespace: str = Field(
        "node-remediation-validation",
        description="Namespace of the check Jobs (kubernetes backend). The check runs privileged (DCGM, GPU "
        "reset), which the service's own restricted namespace refuses: this one is shipped at the privileged "
        "Pod Security level (deploy/components/validation-kubernetes), with the workers' grants in it.",
    )
    kube_image: str = Field(
        "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
        description="Image of the check Job (kubernetes backend): it must hold the configured commands.",
    )
    kube_gpus: int = Field(8, ge=0, description="nvidia.com/gpu the check Job requests (kubernetes backend).")
    gpu_reset_timeout_s: float = Field(
        300.0, gt=0,
        description="Deadline of the GPU reset job (the gpu-reset rung, run through this backend), seconds. "
        "nvidia-smi -r takes seconds to a minute; a reset still pending or running after five minutes "
        "(slurmd not answering, the GPU not letting go) is ended and the ladder climbs to its next rung.",
    )

    domain_checks: dict[str, list[str]] = Field(
        default_factory=_default_domain_checks,
        description="The check one job runs across every node of an NVLink domain at once, per domain fault "
        "class (nvswitch, imex, nvlink; 'unknown' for the rest, required), an argument list (no shell). "
        "Default: nccl-tests all_reduce_perf, one rank per GPU on every node (srun, 4 per tray), 8 B to 8 GiB: "
        "a healthy fabric carries it and a broken switch, link or IMEX domain fails it. On the kubernetes "
        "backend each node's pod runs the command (its index in JOB_COMPLETION_INDEX): name your launcher.",
    )
    domain_check_timeout_s: float = Field(
        900.0, gt=0,
        description="Deadline of the domain check, seconds. A sweep to 8 GiB over 72 GPUs takes minutes; "
        "fifteen leave room for the job to start on every tray before the domain is held and on-call paged.",
    )
    fabric_restart: list[str] = Field(
        default_factory=lambda: ["sudo", "-n", "systemctl", "restart", "nvidia-imex"],
        description="What the per-tray fabric-restart job runs, an argument list (no shell). Default: "
        "restart the IMEX daemon (the nvidia-imex systemd unit). The job runs as the check's user "
        "(validation.slurm_user or the service's user; root in the kubernetes Job): that user needs the "
        "right to restart the unit without a password (a sudoers line for exactly this command); sudo -n "
        "fails at once rather than waiting for one. Where nvidia-fabricmanager runs on the tray (HGX), "
        "restart it too, e.g. systemctl restart nvidia-fabricmanager nvidia-imex.",
    )
    fabric_restart_timeout_s: float = Field(
        300.0, gt=0,
        description="Deadline of the fabric-restart job, seconds: a unit restart takes seconds; one not done "
        "in five minutes (slurmd silent, IMEX hanging on its peers) ends and the ladder climbs.",
    )
    domain_check_on_return: bool = Field(
        False,
        description="A tray's own remediation in a multi-node NVLink domain ends with the domain check too: "
        "once its own GPU check passes, its return hands it to a domain repair that drains the domain, runs "
        "the domain check and returns every tray on a pass (a failure climbs the domain ladder). Off by "
        "default: the check takes the whole domain out of service. See docs/policy.md (\"The domain ladder\").",
    )

    @field_validator("domain_checks")
    @classmethod
    def _domain_checks_are_argv(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for name, argv in value.items():
            if name not in DOMAIN_CLASSES:
                raise ValueError(f"{name!r} is not a domain fault class (one of {', '.join(DOMAIN_CLASSES)})")
            _argv(f"the domain check of {name!r}", argv)
        if "unknown" not in value:
            raise ValueError("domain_checks must name a check for 'unknown' (a domain fault of no known class)")
        return value

    @field_validator("fabric_restart")
    @classmethod
    def _fabric_restart_is_argv(cls, value: list[str]) -> list[str]:
        return _argv("fabric_restart", value)

    @field_validator("checks")
    @classmethod
    def _checks_are_argv(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for name, argv in value.items():
            if name not in FAULT_CLASSES:
                raise ValueError(f"{name!r} is not a cause class (one of {', '.join(FAULT_CLASSES)})")
            if not argv or not all(isinstance(a, str) and a for a in argv):
                raise ValueError(f"the check of {name!r} must be a non-empty argument list")
        if "unknown" not in value:
            raise ValueError("checks must name a check for 'unknown' (the class of an unclassified cause)")
        return value

    @field_validator("slurm_workdir")
    @classmethod
    def _workdir_is_ours(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("backend") == "slurm" and (mode := loose_mode(value)) is not None:
            raise ValueError(loose_mode_message(value, mode))
        return value

    @field_validator("timeout_s")
    @classmethod
    def _timeouts(cls, value: dict[str, float]) -> dict[str, float]:
        for name, seconds in value.items():
            if name != "default" and name not in FAULT_CLASSES:
                raise ValueError(f"{name!r} is not a cause class or 'default'")
            if not seconds > 0:
                raise ValueError(f"timeout of {name!r} must be positive seconds")
        if "default" not in value:
            raise ValueError("timeout_s must have a 'default'")
        return value

    @property
    def runs_jobs(self) -> bool:
        """A job can run on a node (the GPU check, a GPU reset): any backend but none."""
        return self.backend != "none"

    def check_for(self, cause_class: str | None) -> list[str]:
        return list(self.checks.get(cause_class or "unknown") or self.checks["unknown"])

    def domain_check_for(self, cause_class: str | None) -> list[str]:
        """The domain check of a domain fault class; ``unknown``'s for any other."""
        return list(self.domain_checks.get(cause_class or "unknown") or self.domain_checks["unknown"])

    def timeout_for(self, cause_class: str | None) -> float:
        return self.timeout_s.get(cause_class or "unknown", self.timeout_s["default"])
