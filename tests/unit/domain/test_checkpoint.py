"""The recorded checkpoint request: what a later run and every on-call surface read back from the
step row. A malformed or foreign ``provider_op`` reads as no request; the sentence on-call sees is
rendered from the typed fields."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from remediation.domain.checkpoint import CheckpointRequest

AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_a_request_survives_the_row() -> None:
    request = CheckpointRequest(("123", "124_7"), "USR1", "full", AT, 300, sent=True)
    assert CheckpointRequest.load(request.dump()) == request
    pods = CheckpointRequest(("ml/trainer-0",), "USR1", "batch", AT, 60, None, "pods")
    assert CheckpointRequest.load(pods.dump()) == pods


@pytest.mark.parametrize(
    "op",
    [
        None,
        {},
        {"kind": "restart", "ref": "op-1"},
        {"kind": "checkpoint", "jobs": ["1"]},
        {
            "kind": "checkpoint",
            "jobs": ["1"],
            "signal": "USR1",
            "scope": "steps",
            "at": AT.isoformat(),
            "wait_s": 3,
        },
        {
            "kind": "checkpoint",
            "jobs": ["1"],
            "signal": "USR1",
            "scope": "batch",
            "at": "yesterday",
            "wait_s": 3,
        },
    ],
    ids=["none", "empty", "a-machine-operation", "missing-fields", "unknown-scope", "bad-time"],
)
def test_anything_else_reads_as_no_request(op: dict[str, Any] | None) -> None:
    assert CheckpointRequest.load(op) is None


def test_what_on_call_reads() -> None:
    now = AT + timedelta(seconds=40)
    one = CheckpointRequest(("123",), "USR1", "batch", AT, 300, sent=True)
    assert one.text(now) == "asked job 123 to checkpoint (USR1) 40 s ago; waiting up to 300 s"
    assert one.text(now, dry_run=True).startswith("would have asked job 123 to checkpoint (USR1)")
    many = CheckpointRequest(tuple(str(i) for i in range(7)), "USR2", "batch", AT, 60, sent=True)
    assert many.text(now).startswith("asked jobs 0, 1, 2, 3, 4 (+2 more) to checkpoint (USR2) 40 s ago")
    lost = CheckpointRequest(("9",), "USR1", "batch", AT, 300, sent=False)
    assert "not confirmed" in lost.text(now)
    pod = CheckpointRequest(("ml/t-0",), "USR1", "batch", AT, 300, sent=True, target="pods")
    assert pod.text(now) == "asked pod ml/t-0 to checkpoint (annotation) 40 s ago; waiting up to 300 s"


def test_the_deadline_is_the_sooner_of_the_wait_and_the_drain_timeout() -> None:
    request = CheckpointRequest(("1",), "USR1", "batch", AT + timedelta(seconds=30), 300)
    assert request.ends_at(AT, 3600) == 330
    assert request.ends_at(AT, 200) == 200


def test_each_signal_is_read_back_and_an_old_request_counts_as_all_claimed() -> None:
    """A request records each job's signal: claimed before scancel, signalled after. A later run sends
    only the unclaimed ones; a claimed one never confirmed is lost, not sent again. A request recorded
    before signals were recorded one by one claimed all of its jobs."""
    partial = CheckpointRequest(("1", "2", "3"), "USR1", "batch", AT, 60, claimed=("1", "2"), signalled=("1",))
    back = CheckpointRequest.load(partial.dump())
    assert back == partial and back.unsent == ("3",) and back.lost == ("2",)
    old = {k: v for k, v in partial.dump().items() if k not in ("claimed", "signalled")}
    legacy = CheckpointRequest.load(old)
    assert legacy is not None and legacy.unsent == () and legacy.lost == ("1", "2", "3")
