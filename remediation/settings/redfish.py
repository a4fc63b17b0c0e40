"""``redfish``: where the ``redfish`` machine backend finds each node's BMC, and how it trusts and signs
in to it (``REMEDIATION_REDFISH__*``).

Only file paths live here, never a credential: the passwords stay in their own file (a Kubernetes
Secret mounted as a file), read when a BMC is called, so no settings dump, error or log can carry one.
"""

from __future__ import annotations

from pydantic import Field

from remediation.settings.base import Section


class RedfishSettings(Section):
    """The inventory, credentials and CA of the BMCs ``vm.backend: redfish`` acts through."""

    inventory_file: str | None = Field(
        None,
        description="YAML or JSON mapping each node (its Kubernetes Node's name; its Slurm node's where "
        "there is no Kubernetes) to {bmc: https URL, system: Redfish system id or path, credentials: a "
        "name in credentials_file (default 'default')}. Re-read when it changes.",
    )
    node_annotation: str | None = Field(
        None,
        description="A Kubernetes Node annotation picking the node's system as JSON {bmc, system}, read "
        "for nodes the inventory does not list (needs kube.backend kubernetes): the BMC must be one the "
        "inventory lists, whose login it uses; the node's kubelet writes its Node, so the BMC host and the "
        "credentials never come from it. Unset = the inventory only.",
    )
    credentials_file: str | None = Field(
        None,
        description="YAML or JSON mapping a credentials name (one BMC's, or a group's) to {username, "
        "password}; a Secret mounted as a file. Required to act: Redfish resets need a login.",
    )
    ca_file: str | None = Field(
        None,
        description="PEM bundle of the CA(s) that signed the BMCs' certificates. Unset = the system "
        "trust store. Verification is never turned off: a BMC whose certificate does not chain to it "
        "is refused, and that pauses automation as a configuration error.",
    )
    connect_timeout_s: float = Field(
        5.0, gt=0, description="Seconds to wait for a BMC to accept a connection (unreachable: retried)."
    )
    request_timeout_s: float = Field(
        20.0,
        gt=0,
        description="Seconds to wait for a BMC's answer. A reset sent but not answered in time counts as "
        "sent and is never sent again for the same attempt.",
    )
    unobserved_after_s: float = Field(
        300.0,
        gt=0,
        description="Seconds after a restart or power cycle request that a system seen On throughout is "
        "taken as done (a warm reset need not drop power, and an Off shorter than the poll interval is "
        "missed); the verify step's new bootID or slurmd registration is then the only proof.",
    )
