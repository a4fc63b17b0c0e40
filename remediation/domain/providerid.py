"""Parse a Kubernetes Node's ``spec.providerID`` into the VM it names.

Formats (as the cloud controller managers write them):
- GCE:   ``gce://PROJECT/ZONE/INSTANCE``
- Azure: ``azure:///subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachines/NAME``
         ``azure:///subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachineScaleSets/SS/virtualMachines/ID``
- AWS:   ``aws:///ZONE/i-ID`` (the zone may be empty: ``aws:////i-ID``)
- memory: ``memory:///NAME`` (the simulated cluster)

Azure path segments are matched case-insensitively, as ARM does. Anything else raises
:class:`InvalidProviderID`, a permanent error: the remediation that needed it fails with this message,
and nothing crashes.
"""

from __future__ import annotations

import re

from remediation.ports.cluster import VMRef
from remediation.ports.errors import PermanentError


class InvalidProviderID(PermanentError):
    """A providerID we cannot map to a VM."""


_SEG = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_GCE = re.compile(rf"^gce://(?P<project>[a-z0-9.:-]+)/(?P<zone>[a-z0-9-]+)/(?P<name>{_SEG})$")
_AZURE_VM = re.compile(
    rf"^azure:///subscriptions/(?P<sub>[0-9A-Fa-f-]+)/resourceGroups/(?P<rg>[A-Za-z0-9._()-]+)"
    rf"/providers/Microsoft\.Compute/virtualMachines/(?P<name>{_SEG})$",
    re.IGNORECASE,
)
_AZURE_VMSS = re.compile(
    rf"^azure:///subscriptions/(?P<sub>[0-9A-Fa-f-]+)/resourceGroups/(?P<rg>[A-Za-z0-9._()-]+)"
    rf"/providers/Microsoft\.Compute/virtualMachineScaleSets/(?P<ss>{_SEG})/virtualMachines/(?P<id>[0-9]+)$",
    re.IGNORECASE,
)
_AWS = re.compile(r"^aws:///(?P<zone>[a-z0-9-]*)/(?P<id>i-[0-9a-f]{8,17})$")
_MEMORY = re.compile(rf"^memory:///(?P<name>{_SEG})$")


def parse_provider_id(provider_id: str) -> VMRef:
    """Return the VMRef a providerID names, or raise InvalidProviderID with the reason."""
    if not isinstance(provider_id, str) or not provider_id.strip():
        raise InvalidProviderID("the Node has no spec.providerID; cannot find its VM")
    raw = provider_id.strip()
    if m := _GCE.match(raw):
        return VMRef("gce", m["name"], zone=m["zone"], account=m["project"], provider_id=raw)
    if m := _AZURE_VMSS.match(raw):
        return VMRef(
            "azure", m["id"], account=m["sub"], group=m["rg"], scale_set=m["ss"], provider_id=raw
        )
    if m := _AZURE_VM.match(raw):
        return VMRef("azure", m["name"], account=m["sub"], group=m["rg"], provider_id=raw)
    if m := _AWS.match(raw):
        return VMRef("aws", m["id"], zone=m["zone"], provider_id=raw)
    if m := _MEMORY.match(raw):
        return VMRef("memory", m["name"], provider_id=raw)
    scheme = raw.split(":", 1)[0] if ":" in raw else ""
    if scheme in {"gce", "azure", "aws", "memory"}:
        raise InvalidProviderID(f"malformed {scheme} providerID {raw!r}")
    raise InvalidProviderID(f"unsupported providerID {raw!r} (expected gce://, azure:// or aws://)")
