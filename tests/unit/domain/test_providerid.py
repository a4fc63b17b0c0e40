"""providerID parsing over the formats the cloud controller managers really write, and bad ones."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remediation.domain.providerid import InvalidProviderID, parse_provider_id
from remediation.ports.cluster import VMRef
from remediation.ports.errors import PermanentError

SUB = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"

GOOD = [
    (
        "gke",
        "gce://my-project/us-central1-a/gke-train-gpu-pool-3f2a9c1e-x7k2",
        VMRef("gce", "gke-train-gpu-pool-3f2a9c1e-x7k2", zone="us-central1-a", account="my-project"),
    ),
    (
        "gce-domain-scoped-project",
        "gce://example.com:ml-prod/europe-west4-b/a3-highgpu-8g-001",
        VMRef("gce", "a3-highgpu-8g-001", zone="europe-west4-b", account="example.com:ml-prod"),
    ),
    (
        "azure-vm",
        f"azure:///subscriptions/{SUB}/resourceGroups/MC_ml_aks_eastus/providers/Microsoft.Compute/"
        "virtualMachines/aks-gpu-12345678-0",
        VMRef("azure", "aks-gpu-12345678-0", account=SUB, group="MC_ml_aks_eastus"),
    ),
    (
        "azure-vmss",
        f"azure:///subscriptions/{SUB}/resourceGroups/mc_rg/providers/Microsoft.Compute/"
        "virtualMachineScaleSets/aks-gpupool-41234567-vmss/virtualMachines/17",
        VMRef("azure", "17", account=SUB, group="mc_rg", scale_set="aks-gpupool-41234567-vmss"),
    ),
    (
        "azure-lowercase-segments",  # ARM is case-insensitive and some tools lower-case the path
        f"azure:///subscriptions/{SUB}/resourcegroups/rg1/providers/microsoft.compute/virtualmachines/vm1",
        VMRef("azure", "vm1", account=SUB, group="rg1"),
    ),
    (
        "aws",
        "aws:///us-east-1a/i-0abcdef1234567890",
        VMRef("aws", "i-0abcdef1234567890", zone="us-east-1a"),
    ),
    ("aws-short-id", "aws:///eu-west-1b/i-1234abcd", VMRef("aws", "i-1234abcd", zone="eu-west-1b")),
    ("aws-no-zone", "aws:////i-0abcdef1234567890", VMRef("aws", "i-0abcdef1234567890")),
    ("memory", "memory:///gpu-node-7", VMRef("memory", "gpu-node-7")),
    (
        "surrounding-whitespace",
        "  gce://p/us-east1-c/n1\n",
        VMRef("gce", "n1", zone="us-east1-c", account="p"),
    ),
]


@pytest.mark.parametrize(("provider_id", "expected"), [g[1:] for g in GOOD], ids=[g[0] for g in GOOD])
def test_parses_real_formats(provider_id: str, expected: VMRef) -> None:
    ref = parse_provider_id(provider_id)
    assert ref == VMRef(**{**expected.to_dict(), "provider_id": provider_id.strip()})


BAD = [
    ("empty", "", "no spec.providerID"),
    ("blank", "   ", "no spec.providerID"),
    ("gce-missing-instance", "gce://my-project/us-central1-a", "malformed gce"),
    ("gce-empty-project", "gce:///us-central1-a/n1", "malformed gce"),
    ("gce-extra-segment", "gce://p/us-central1-a/n1/extra", "malformed gce"),
    ("gce-uppercase-zone", "gce://p/US-CENTRAL1-A/n1", "malformed gce"),
    (
        "azure-vmss-non-numeric-id",
        f"azure:///subscriptions/{SUB}/resourceGroups/rg/providers/"
        "Microsoft.Compute/virtualMachineScaleSets/ss/virtualMachines/abc",
        "malformed azure",
    ),
    (
        "azure-wrong-provider",
        f"azure:///subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/nic1",
        "malformed azure",
    ),
    (
        "azure-two-slashes",
        f"azure://subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm1",
        "malformed azure",
    ),
    ("aws-not-an-instance", "aws:///us-east-1a/vol-0abcdef1234567890", "malformed aws"),
    ("aws-non-hex-id", "aws:///us-east-1a/i-zzzzzzzzzzzz", "malformed aws"),
    ("kind", "kind://docker/kind/kind-worker", "unsupported"),
    ("vsphere", "vsphere://4231a7e4-3c5b-2d1f-9e8a-0b1c2d3e4f50", "unsupported"),
    ("no-scheme", "gpu-node-7", "unsupported"),
    ("shell-metacharacters", "gce://p/z/n1;rm -rf /", "malformed gce"),
]


@pytest.mark.parametrize(("provider_id", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_rejects_bad_formats_with_a_clear_permanent_error(provider_id: str, message: str) -> None:
    with pytest.raises(InvalidProviderID, match=message) as info:
        parse_provider_id(provider_id)
    assert isinstance(info.value, PermanentError)  # the remediation escalates; nothing retries it
    if provider_id.strip():
        assert provider_id.strip() in info.value.message  # on-call sees the offending value


@pytest.mark.parametrize("value", [None, 42, b"gce://p/z/n"], ids=["none", "int", "bytes"])
def test_non_strings_are_invalid_not_a_crash(value: object) -> None:
    with pytest.raises(InvalidProviderID):
        parse_provider_id(value)  # type: ignore[arg-type]


PREFIXES = ["", "gce://", "aws:///", "azure:///subscriptions/", "memory:///", "gce://p/z/"]


@settings(max_examples=400, deadline=None)
@given(prefix=st.sampled_from(PREFIXES), tail=st.text(max_size=80))
def test_fuzz_only_invalid_provider_id_escapes(prefix: str, tail: str) -> None:
    try:
        ref = parse_provider_id(prefix + tail)
    except InvalidProviderID:
        return
    assert ref.provider in {"gce", "azure", "aws", "memory"}
    assert ref.name and ref.provider_id == (prefix + tail).strip()
