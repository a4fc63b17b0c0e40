"""The repair request's pure rules: the payload's keys, evidence inline only when small, the delivery
backoff, the hardware items counted for repair time, and what counts as new hardware."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from remediation.repair_requests import rules
from remediation.repair_requests.rules import Gpu, Hardware

AT = datetime(2026, 11, 20, 9, tzinfo=UTC)


def facts(**extra: object) -> rules.Facts:
    base: dict[str, object] = dict(
        request_id=12, cluster="west", node="gpu-node-1", remediation_id=41, opened_at=AT,
        fault_class="gpu-memory", cause="slurm FAIL: xid 48", reason="ladder exhausted (RMA)",
        hardware=Hardware(provider="gce", instance_id="i-1", host="h-1", gpus=(Gpu("GPU-a", "165001"),)),
        lemon=rules.Lemon(2.5, 2, False, "2 failures"),
    )
    return rules.Facts(**{**base, **extra})  # type: ignore[arg-type]


def test_the_payload_names_everything_the_repair_system_needs() -> None:
    small = rules.EvidenceItem("remapped-rows", "ok", 0, 40, False, "ab" * 32, None, "gpu,rows\n0,2\n")
    big = rules.EvidenceItem("kernel-log", "ok", 0, 900_000, True, "cd" * 32, "dir:kernel-log", None)
    body = rules.payload(facts(follows=7, evidence=(small, big), fault_evidence="xid 48 (DBE)",
                               history=(rules.PastFault(AT, "gpu-memory"),)))
    assert body["schema_version"] == rules.SCHEMA_VERSION == 1
    assert body["request"] == {"id": 12, "follows": 7, "opened_at": AT.isoformat(), "dry_run": False,
                               "callback": "/api/v1/repair-requests/12/callback"}
    assert (body["cluster"], body["node"]) == ("west", "gpu-node-1")
    assert body["hardware"]["gpus"] == [{"uuid": "GPU-a", "serial": "165001"}]
    assert body["hardware"]["host"] == "h-1" and body["hardware"]["bmc_serial"] is None
    assert body["fault"] == {"class": "gpu-memory", "cause": "slurm FAIL: xid 48", "evidence": "xid 48 (DBE)",
                             "reason": "ladder exhausted (RMA)", "remediation": 41}
    assert body["evidence"][0]["content"] == "gpu,rows\n0,2\n"
    assert "content" not in body["evidence"][1] and body["evidence"][1]["location"] == "dir:kernel-log"
    assert body["history"] == [{"at": AT.isoformat(), "fault_class": "gpu-memory"}]
    assert body["lemon"] == {"score": 2.5, "failures": 2, "over_threshold": False, "explanation": "2 failures"}


@pytest.mark.parametrize(("content", "size", "sent"), [
    ("x" * 8192, 8192, True),
    ("x" * 8193, 8193, False),
    ("é" * 5000, 10000, False),  # 8 KiB of bytes, not of characters
    (None, 10, False),  # kept outside the database: named by its location only
], ids=["at-8KiB", "over-8KiB", "multibyte-over", "not-inline"])
def test_evidence_goes_inline_only_when_kept_in_the_database_and_small(content: str | None, size: int,
                                                                       sent: bool) -> None:
    assert (rules.inline(content, size) is not None) is sent


def test_backoff_doubles_up_to_its_cap() -> None:
    waits = [rules.backoff(n, base_s=30, max_s=600) for n in range(1, 8)]
    assert waits == [30, 60, 120, 240, 480, 600, 600]


@pytest.mark.parametrize(("asked", "seen", "why"), [
    (Hardware(host="h-1"), Hardware(host="h-2"), "host changed (h-1 -> h-2)"),
    (Hardware(instance_id="i-1", host="h-1"), Hardware(instance_id="i-1"), None),  # the re-check saw no host
    (Hardware(gpus=(Gpu("a", "1"), Gpu("b", "2"))), Hardware(gpus=(Gpu("a", "1"), Gpu("c", "3"))),
     "GPU serials changed (1 of 2 replaced)"),
    (Hardware(gpus=(Gpu("a", "1"),)), Hardware(), None),
    (Hardware(bmc_serial="S1"), Hardware(bmc_serial="S1", gpus=(Gpu("a", "1"),)), None),
], ids=["new-host", "host-unread", "gpu-replaced", "gpus-unread", "same"])
def test_new_hardware_is_a_field_both_name_differently(asked: Hardware, seen: Hardware, why: str | None) -> None:
    assert rules.changed(asked, seen) == why


def test_repair_time_counts_the_most_physical_machine_identity_and_each_gpu() -> None:
    hw = Hardware(instance_id="i-1", host="h-1", bmc_serial="S9", gpus=(Gpu("GPU-b", "2"), Gpu("GPU-a", None)))
    assert rules.items(hw) == ("serial:S9", "gpu:2", "gpu:GPU-a")
    assert rules.items(Hardware(instance_id="i-1")) == ("instance:i-1",)
    assert rules.items(Hardware()) == ()


@pytest.mark.parametrize("ticket", ["RMA-20931", "INC#42", "jira:HW-7", "a" * 128])
def test_a_ticket_is_one_word(ticket: str) -> None:
    assert rules.checked_ticket(ticket) == ticket


@pytest.mark.parametrize("ticket", ["", "two words", "a\nb", "a" * 129, "x;rm"])
def test_anything_else_is_refused(ticket: str) -> None:
    with pytest.raises(ValueError, match="a ticket is"):
        rules.checked_ticket(ticket)
