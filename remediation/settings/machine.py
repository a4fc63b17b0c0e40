"""``machine``: what acts on a node's machine, a cloud's VM API or nothing (``REMEDIATION_MACHINE__*``;
the section's old name ``vm`` is still read)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from remediation.settings.base import Section


class MachineSettings(Section):
    """What restarts, moves or reimages a node's machine (the ladder's machine rungs), and the clouds'
    endpoint overrides."""
    backend: Literal["gce", "azure", "aws", "auto", "redfish", "slurm", "memory", "noop",
                     "none"] = Field(
        "auto", description="What acts on a node's machine: a cloud (gce, azure, aws; 'auto' picks by the "
        "Node's providerID scheme); slurm: the Slurm node itself is rebooted with `scontrol reboot` (the "
        "cluster's RebootProgram; no providerID, no cloud credentials), which can do nothing heavier, so "
        "a shipped move-host or reimage rung is a reboot there (NVIDIA's RESTART_BM); redfish: bare-metal power actions through each "
        "node's BMC (the redfish section); or none: this site has nothing that can "
        "restart, move or reimage a machine, so the ladder's machine rungs and verify are skipped and a "
        "node returns only on a passed GPU check (validation), or is held or quarantined "
        "(workflow.unproven). A ladder written with a rung the backend cannot do is refused at start-up. "
        "memory is the simulated world; noop is the dry-run twin, refused outside dry-run.",
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
    def _anonymous_needs_endpoint(self) -> MachineSettings:
        if self.gce_anonymous and not self.gce_endpoint:
            raise ValueError("gce_anonymous is only allowed together with gce_endpoint (a local test endpoint)")
        if self.azure_test_token is not None:
            from urllib.parse import urlsplit

            host = urlsplit(self.azure_endpoint or "").hostname or ""
            if host not in ("127.0.0.1", "localhost", "::1") and host != self.azure_test_host:
                raise ValueError(
                    "azure_test_token is only allowed with an azure_endpoint on 127.0.0.1, localhost or "
                    f"[::1] (a local test endpoint) or on machine.azure_test_host, not {self.azure_endpoint!r}"
                )
        return self
