"""Hardware identity: GPU lines from a check's output, eras of a node name, serials under two names."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from remediation.domain.hardware import Gpu, Sighting, eras, failed_elsewhere, parse_gpus, shared_serials

T0 = datetime(2026, 11, 1, tzinfo=UTC)
Q_OUTPUT = """\
| Memory           | Pass   |
GPU 00000000:18:00.0
    Serial Number                         : 1652823054321
    GPU UUID                              : GPU-aaaaaaaa-1111-2222-3333-444444444444
GPU 00000000:19:00.0
    Serial Number                         : N/A
    GPU UUID                              : GPU-bbbbbbbb-1111-2222-3333-444444444444
"""


def test_gpus_from_nvidia_smi_q_and_the_csv_query() -> None:
    assert parse_gpus(Q_OUTPUT) == (
        Gpu("GPU-aaaaaaaa-1111-2222-3333-444444444444", "1652823054321"),
        Gpu("GPU-bbbbbbbb-1111-2222-3333-444444444444", None),
    )
    csv = "0, GPU-cccccccc-1111-2222-3333-444444444444, 1650000000001\n"
    assert parse_gpus(csv) == (Gpu("GPU-cccccccc-1111-2222-3333-444444444444", "1650000000001"),)
    assert parse_gpus("| Memory | Fail |\n") == ()


def at(h: float) -> datetime:
    return T0 + timedelta(hours=h)


def test_a_move_without_a_host_is_new_hardware_and_a_reset_is_not() -> None:
    rows = [
        Sighting("n1", at(0), "vm_restart", provider="azure", instance_id="vm-1", sku="ND96"),
        Sighting("n1", at(1), "vm_restart", action="restart", provider="azure", instance_id="vm-1"),
        Sighting("n1", at(2), "vm_restart", action="redeploy", provider="azure", instance_id="vm-1"),
    ]
    (first, second) = eras(rows)
    assert (first.since, first.until, first.why) == (at(0), at(2), "first seen")
    assert second.why == "moved by redeploy (the provider exposes no host)"
    assert first.key != second.key and second.sku is None and first.sku == "ND96"


def test_other_host_bmc_or_gpus_start_an_era_and_checks_fill_it_in() -> None:
    g1, g2 = (Gpu("GPU-1", "s1"),), (Gpu("GPU-2", "s2"),)
    rows = [
        Sighting("n1", at(0), "vm_restart", provider="gce", instance_id="42", host="/h/1"),
        Sighting("n1", at(1), "validate", gpus=g1),
        Sighting(
            "n1", at(2), "vm_restart", action="stop_start", provider="gce", instance_id="42", host="/h/1"
        ),
        Sighting("n1", at(3), "validate", gpus=g2),
        Sighting("n1", at(4), "quarantine", provider="redfish", bmc_serial="SN1"),
    ]
    got = eras(rows)
    assert [e.why.split(" (")[0] for e in got] == ["first seen", "GPU serials changed"]
    assert got[0].serials == {"s1"} and got[0].host == "/h/1" and got[1].bmc_serial == "SN1"
    assert got[1].key == "serial:SN1"


def test_a_gpu_serial_failing_under_two_names_is_flagged() -> None:
    gpu = (Gpu("GPU-1", "s1"),)
    rows = [
        Sighting("n1", at(0), "validate", gpus=gpu, remediation_id=1),
        Sighting("n2", at(5), "validate", gpus=gpu + (Gpu("GPU-9", "s9"),), remediation_id=2),
        Sighting("n3", at(6), "validate", gpus=(Gpu("GPU-9", "s9"),)),  # no remediation: not a failure
    ]
    assert shared_serials(rows) == {"s1": ["n1", "n2"]}


class _Machine:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def start(self, *a: object) -> None: ...
    def poll(self, *a: object) -> None: ...

    def identify(self, vm: object) -> None:
        raise self.error


def test_an_identity_read_never_hides_a_retry_after_but_a_gone_machine_is_only_noted() -> None:
    from remediation.domain.hardware import read_identity
    from remediation.domain.outcomes import Adapters
    from remediation.ports.cluster import VMRef
    from remediation.ports.errors import CredentialError, NotFound, TransientError

    vm = VMRef("gce", "i-1", "z", "p")

    def read(error: Exception, strict: bool = True) -> dict[str, object]:
        return read_identity(Adapters(None, None, _Machine(error)), vm, strict=strict).dump()  # type: ignore[arg-type]

    with pytest.raises(TransientError):  # the machine step is retried after the provider's Retry-After
        read(TransientError("429", retry_after=5))
    with pytest.raises(CredentialError):  # ours to fix: automation pauses
        read(CredentialError("403", component="cloud"))
    assert read(NotFound("instance gone")) == {"hardware_error": "instance gone"}
    assert read(TransientError("429"), strict=False) == {"hardware_error": "429"}  # a quarantine never waits


def test_hardware_is_named_by_gpu_serials_bmc_and_host_never_by_instance() -> None:
    s = Sighting("n1", at(0), "quarantine", instance_id="i-1", host="h1", bmc_uuid="u1", bmc_serial="s1",
                 gpus=(Gpu("GPU-a", "SN1"), Gpu("GPU-b", None)))
    assert s.identities == frozenset({"gpu:SN1", "gpu:GPU-b", "host:h1", "bmc:u1", "serial:s1"})
    assert Sighting("n1", at(0), "vm_restart", instance_id="i-1").identities == frozenset()


def test_failed_elsewhere_is_a_failure_in_another_cluster_before_the_hardware_was_seen_here() -> None:
    here = eras([Sighting("n1", at(10), "validate", gpus=(Gpu("GPU-a", "SN1"),), cluster="east")])[-1]
    before = Sighting("n1", at(1), "validate", gpus=(Gpu("GPU-a", "SN1"),), remediation_id=7, cluster="west")
    seen = [
        before,
        Sighting("n9", at(2), "validate", gpus=(Gpu("GPU-z", "SN9"),), remediation_id=8, cluster="west"),  # other GPU
        Sighting("n2", at(3), "validate", gpus=(Gpu("GPU-a", "SN1"),), cluster="west"),  # read, never failed
        Sighting("n3", at(4), "validate", gpus=(Gpu("GPU-a", "SN1"),), remediation_id=9, cluster="east"),  # here
        Sighting("n1", at(11), "validate", gpus=(Gpu("GPU-a", "SN1"),), remediation_id=10, cluster="west"),  # later
    ]
    assert failed_elsewhere(here, "east", seen, last_seen=at(10)) == [before]
    assert failed_elsewhere(here, "west", seen, last_seen=at(10)) == [seen[3]]


FABRIC_OUTPUT = """\
GPU 00000009:01:00.0
    Serial Number                         : 1654324000001
    GPU UUID                              : GPU-dddddddd-1111-2222-3333-444444444444
    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : 7
        ClusterUUID                       : 5f1e2d3c-0000-4000-8000-00000000a0b1
        Health
            Bandwidth                     : Full
    Processes                             : None
GPU 00000019:01:00.0
    Serial Number                         : 1654324000002
    GPU UUID                              : GPU-eeeeeeee-1111-2222-3333-444444444444
    Fabric
        State                             : In Progress
        Status                            : N/A
        CliqueId                          : 7
        ClusterUUID                       : 5f1e2d3c-0000-4000-8000-00000000a0b1
GPU 00000029:01:00.0
    Serial Number                         : 1654324000003
    GPU UUID                              : GPU-ffffffff-1111-2222-3333-444444444444
    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : 0
        ClusterUUID                       : 00000000-0000-0000-0000-000000000000
"""


def test_a_gpus_nvlink_domain_from_its_fabric_section() -> None:
    """Only a completed registration names the domain; a GPU in none (the zero ClusterUUID) has none."""
    assert parse_gpus(FABRIC_OUTPUT) == (
        Gpu("GPU-dddddddd-1111-2222-3333-444444444444", "1654324000001",
            "5f1e2d3c-0000-4000-8000-00000000a0b1.7"),
        Gpu("GPU-eeeeeeee-1111-2222-3333-444444444444", "1654324000002", None),
        Gpu("GPU-ffffffff-1111-2222-3333-444444444444", "1654324000003", None),
    )
    # The last section of the output ends the Fabric section as well as a following block would.
    last = FABRIC_OUTPUT.split("GPU 00000019")[0].replace("    Processes                             : None\n", "")
    assert parse_gpus(last)[0].clique == "5f1e2d3c-0000-4000-8000-00000000a0b1.7"
