"""AWSProvider through boto3 against moto's EC2 server.

What is measurable here, honestly: moto keeps no request log and a reboot leaves no trace in its EC2
state, so "exactly one reboot" is counted as the RebootInstances calls boto3 really sent (a botocore
``before-call`` hook on the session), minus those a test's fault hook answered before moto saw them.
The marker tag on the instance is checked through moto's own DescribeTags.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3
import pytest

from remediation.adapters.cloud.aws import AWSProvider, region_of
from remediation.adapters.cloud.common import MARKER_TAG, marker_for, marker_value
from remediation.ports.cluster import Operation, VMAction, VMRef
from remediation.ports.errors import CredentialError, NotFound, NotSupported, TransientError
from remediation.settings import MachineSettings
from tests.integration.cloud.conftest import wait_done

Counter = Callable[[boto3.Session, str], list[dict[str, Any]]]


def vm(instance_id: str) -> VMRef:
    return VMRef("aws", instance_id, zone="us-east-1a", provider_id=f"aws:///us-east-1a/{instance_id}")


def state(session: boto3.Session, url: str, instance_id: str) -> tuple[str, dict[str, str]]:
    ec2 = session.client("ec2", endpoint_url=url)
    found = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    return found["State"]["Name"], {t["Key"]: t["Value"] for t in found.get("Tags", [])}


def test_restart_reboots_and_marks_the_instance(
    aws_session: boto3.Session,
    aws_settings: MachineSettings,
    ec2_instances: list[str],
    moto_url: str,
    count_calls: Counter,
) -> None:
    reboots = count_calls(aws_session, "RebootInstances")
    provider = AWSProvider(aws_settings, session=aws_session)
    op = provider.start(vm(ec2_instances[0]), VMAction.RESTART, "rem-1:vm_restart:1")
    assert op.ref and op.data["phase"] == "reboot" and op.data["region"] == "us-east-1"
    status, _ = wait_done(provider, op)
    assert status.error is None
    assert [r["InstanceId.1"] for r in reboots] == [ec2_instances[0]]  # the EC2 query-protocol body
    current, tags = state(aws_session, moto_url, ec2_instances[0])
    assert current == "running" and tags[MARKER_TAG].startswith("restart:")


def test_same_key_twice_is_one_reboot(
    aws_session: boto3.Session, aws_settings: MachineSettings, ec2_instances: list[str], count_calls: Counter
) -> None:
    reboots = count_calls(aws_session, "RebootInstances")
    AWSProvider(aws_settings, session=aws_session).start(
        vm(ec2_instances[0]), VMAction.RESTART, "rem-2:vm_restart:1"
    )
    again = AWSProvider(aws_settings, session=aws_session).start(
        vm(ec2_instances[0]), VMAction.RESTART, "rem-2:vm_restart:1"
    )
    assert again.data["phase"] == "observe"
    assert wait_done(AWSProvider(aws_settings, session=aws_session), again)[0].error is None
    assert len(reboots) == 1


def test_crash_between_marker_and_reboot_under_acts(
    aws_session: boto3.Session,
    aws_settings: MachineSettings,
    ec2_instances: list[str],
    moto_url: str,
    count_calls: Counter,
) -> None:
    # The documented trade-off: the marker is there but the reboot never went out. We do not reboot
    # now; verify will see the old bootID and escalate.
    marker = marker_value(marker_for(VMAction.RESTART, "rem-3:vm_restart:1"))
    aws_session.client("ec2", endpoint_url=moto_url).create_tags(
        Resources=[ec2_instances[1]], Tags=[{"Key": MARKER_TAG, "Value": marker}]
    )
    reboots = count_calls(aws_session, "RebootInstances")
    op = AWSProvider(aws_settings, session=aws_session).start(
        vm(ec2_instances[1]), VMAction.RESTART, "rem-3:vm_restart:1"
    )
    assert op.data["phase"] == "observe" and reboots == []


def test_stop_start_runs_both_phases_and_resumes_in_a_fresh_provider(
    aws_session: boto3.Session,
    aws_settings: MachineSettings,
    ec2_instances: list[str],
    moto_url: str,
    count_calls: Counter,
) -> None:
    stops, starts = count_calls(aws_session, "StopInstances"), count_calls(aws_session, "StartInstances")
    row = (
        AWSProvider(aws_settings, session=aws_session)
        .start(vm(ec2_instances[2]), VMAction.STOP_START, "rem-4:vm_restart:2")
        .to_dict()
    )
    assert row["data"]["phase"] == "stop" and row["data"]["state"] == "stopping"
    status, last = wait_done(AWSProvider(aws_settings, session=aws_session), Operation.from_dict(row))
    assert status.error is None and last.data["phase"] == "start"
    assert (len(stops), len(starts)) == (1, 1)
    assert state(aws_session, moto_url, ec2_instances[2])[0] == "running"


def test_stop_start_same_key_twice_stops_once_and_still_starts(
    aws_session: boto3.Session,
    aws_settings: MachineSettings,
    ec2_instances: list[str],
    moto_url: str,
    count_calls: Counter,
) -> None:
    stops, starts = count_calls(aws_session, "StopInstances"), count_calls(aws_session, "StartInstances")
    provider = AWSProvider(aws_settings, session=aws_session)
    provider.start(vm(ec2_instances[0]), VMAction.REDEPLOY, "rem-5:vm_restart:2")  # crash: op never saved
    again = provider.start(vm(ec2_instances[0]), VMAction.REDEPLOY, "rem-5:vm_restart:2")
    assert again.data["phase"] == "stop"
    assert wait_done(provider, again)[0].error is None
    assert (len(stops), len(starts)) == (1, 1)
    assert state(aws_session, moto_url, ec2_instances[0])[0] == "running"


@pytest.mark.parametrize(
    ("status", "code", "retry_after", "expected"),
    [(503, "RequestLimitExceeded", 4, 4.0), (503, "Unavailable", None, None), (500, "InternalError", 2, 2.0)],
    ids=["throttled", "unavailable", "internal-error"],
)
def test_refused_reboot_is_transient_and_the_retry_reboots_once(
    aws_session: boto3.Session,
    aws_settings: MachineSettings,
    ec2_instances: list[str],
    count_calls: Counter,
    ec2_faults: Callable[..., list[str]],
    status: int,
    code: str,
    retry_after: int | None,
    expected: float | None,
) -> None:
    reboots = count_calls(aws_session, "RebootInstances")
    injected = ec2_faults(aws_session, "RebootInstances", status, code, retry_after=retry_after)
    provider = AWSProvider(aws_settings, session=aws_session)
    with pytest.raises(TransientError, match=code) as caught:
        provider.start(vm(ec2_instances[0]), VMAction.RESTART, "rem-6:vm_restart:1")
    assert caught.value.retry_after == expected
    # EC2 refused, so the marker was withdrawn and the retry acts.
    retried = provider.start(vm(ec2_instances[0]), VMAction.RESTART, "rem-6:vm_restart:1")
    assert retried.data["phase"] == "reboot"
    assert len(reboots) - len(injected) == 1  # reached moto exactly once


def test_throttled_poll_is_transient(
    aws_session: boto3.Session,
    aws_settings: MachineSettings,
    ec2_instances: list[str],
    ec2_faults: Callable[..., list[str]],
) -> None:
    # Hooks are installed before the provider builds its client: botocore copies them at creation.
    ec2_faults(aws_session, "DescribeInstanceStatus", 503, "RequestLimitExceeded", retry_after=9)
    provider = AWSProvider(aws_settings, session=aws_session)
    op = provider.start(vm(ec2_instances[1]), VMAction.RESTART, "rem-7:vm_restart:1")
    with pytest.raises(TransientError) as caught:
        provider.poll(op)
    assert caught.value.retry_after == 9.0
    assert wait_done(provider, op)[0].error is None


def test_forbidden_is_permanent_with_the_message(
    aws_session: boto3.Session,
    aws_settings: MachineSettings,
    ec2_instances: list[str],
    ec2_faults: Callable[..., list[str]],
) -> None:
    ec2_faults(aws_session, "RebootInstances", 403, "UnauthorizedOperation")
    with pytest.raises(CredentialError, match="permission denied.*UnauthorizedOperation") as caught:
        AWSProvider(aws_settings, session=aws_session).start(
            vm(ec2_instances[0]), VMAction.RESTART, "rem-8:vm_restart:1"
        )
    assert not isinstance(caught.value, NotFound) and caught.value.status == 403


def test_unknown_instance_is_not_found(aws_session: boto3.Session, aws_settings: MachineSettings) -> None:
    with pytest.raises(NotFound, match="InvalidInstanceID.NotFound"):
        AWSProvider(aws_settings, session=aws_session).start(
            vm("i-0123456789abcdef0"), VMAction.RESTART, "rem-9:vm_restart:1"
        )


def test_terminated_instance_is_not_found(
    aws_session: boto3.Session, aws_settings: MachineSettings, ec2_instances: list[str], moto_url: str
) -> None:
    aws_session.client("ec2", endpoint_url=moto_url).terminate_instances(InstanceIds=[ec2_instances[2]])
    with pytest.raises(NotFound, match="gone"):
        AWSProvider(aws_settings, session=aws_session).start(
            vm(ec2_instances[2]), VMAction.RESTART, "rem-10:vm_restart:1"
        )


def test_reimage_is_not_supported(
    aws_session: boto3.Session, aws_settings: MachineSettings, ec2_instances: list[str]
) -> None:
    with pytest.raises(NotSupported, match="stop_start"):
        AWSProvider(aws_settings, session=aws_session).start(
            vm(ec2_instances[0]), VMAction.REIMAGE, "rem-11:vm_restart:2"
        )


@pytest.mark.parametrize(
    ("zone", "region"),
    [
        ("us-east-1a", "us-east-1"),
        ("us-west-2-lax-1a", "us-west-2"),
        ("us-gov-west-1b", "us-gov-west-1"),
        ("", None),
    ],
    ids=["zone", "local-zone", "govcloud", "empty"],
)
def test_region_of(zone: str, region: str | None) -> None:
    assert region_of(zone) == region
