"""EC2 VM actions through boto3: ``reboot_instances``, and ``stop_instances``/``start_instances``.

A marker tag written before acting makes a repeated ``start()`` follow the instance instead of acting
twice. ``Operation.ref`` is the AWS request id; ``poll`` reads ``describe_instance_status`` once and
issues the start phase of ``stop_start``. No reimage. SDK retries are off.

Why: docs/clouds.md#aws-operations
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    NoRegionError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from remediation.adapters.cloud.common import (
    MARKER_TAG,
    check_restartable,
    error_for_status,
    marker_for,
    marker_value,
    parse_marker,
)
from remediation.ports.cluster import HardwareIdentity, Operation, OperationStatus, VMAction, VMRef
from remediation.ports.errors import ConfigError, NotFound, PermanentError, TransientError
from remediation.settings import MachineSettings

log = logging.getLogger(__name__)

_REGION = re.compile(r"^([a-z]{2}(?:-gov|-iso[a-z]*)?-[a-z]+-\d+)")
_NOT_FOUND = {"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"}
_DENIED = {"UnauthorizedOperation", "AuthFailure", "Blocked", "OptInRequired"}
_QUOTA = {"InstanceLimitExceeded", "VcpuLimitExceeded", "MaxIOPSLimitExceeded"}
_TRANSIENT = {"RequestLimitExceeded", "Throttling", "ThrottlingException", "InternalError", "ServiceUnavailable",
              "Unavailable", "IncorrectInstanceState", "InsufficientInstanceCapacity"}  # fmt: skip
# After this long in the stop phase, a running instance means our own (crashed) poll already started it.
_STOP_VISIBLE_S = 60.0


def region_of(zone: str) -> str | None:
    """``us-east-1a`` → ``us-east-1``; a local zone such as ``us-west-2-lax-1a`` → ``us-west-2``."""
    m = _REGION.match(zone or "")
    return m.group(1) if m else None


class AWSProvider:
    """:class:`remediation.ports.cluster.MachineProvider` for ``aws://`` VMs."""

    def __init__(self, settings: MachineSettings, *, session: boto3.Session | None = None) -> None:
        self._settings = settings
        self._session = session
        self._lock = threading.Lock()
        self._clients: dict[str, Any] = {}

    def _ec2(self, vm: VMRef, region: str | None = None) -> Any:
        region = region or region_of(vm.zone) or self._settings.aws_region
        if not region:
            raise PermanentError(f"no AWS region for {vm.provider_id or vm.name}: the providerID has no zone "
                                 "and machine.aws_region is unset")  # fmt: skip
        with self._lock:
            if region not in self._clients:
                session = self._session or boto3.Session()  # the default credential chain
                timeout = self._settings.request_timeout_s
                config = Config(
                    retries={"total_max_attempts": 1}, connect_timeout=timeout, read_timeout=timeout
                )
                self._clients[region] = session.client(
                    "ec2", region_name=region, endpoint_url=self._settings.aws_endpoint, config=config
                )
            return self._clients[region]

    def identify(self, vm: VMRef) -> HardwareIdentity:
        """The instance id and type, and ``Placement.HostId``: EC2 names the host on a Dedicated Host only."""
        with _translated(vm):
            found = self._ec2(vm).describe_instances(InstanceIds=[vm.name])
        instance = next((i for r in found["Reservations"] for i in r["Instances"]), None)
        if instance is None:
            raise NotFound(f"VM not found ({vm.provider_id or vm.name}): the instance is gone")
        return HardwareIdentity("aws", instance_id=instance.get("InstanceId"),
                                host=(instance.get("Placement") or {}).get("HostId"), sku=instance.get("InstanceType"))

    def start(self, vm: VMRef, action: VMAction, idempotency_key: str) -> Operation:
        check_restartable(vm, action, "aws", label="AWS", service="EC2 has no reimage here")
        ec2 = self._ec2(vm)
        region = ec2.meta.region_name
        marker = marker_for(action, idempotency_key)
        with _translated(vm):
            found = ec2.describe_instances(InstanceIds=[vm.name])
            instance = next((i for r in found["Reservations"] for i in r["Instances"]), None)
            if instance is None or instance["State"]["Name"] == "terminated":
                raise NotFound(f"VM not found ({vm.provider_id or vm.name}): the instance is gone")
            tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
            found = parse_marker(tags.get(MARKER_TAG))
            if found is not None and found[0] == marker:
                log.warning("aws %s on %s not re-issued: it carries this attempt's marker", action, vm.name)
                # A stop we may have issued still needs its start: follow it as a stop phase.
                phase = "observe" if action == VMAction.RESTART else "stop"
                return Operation(
                    "aws", "", action, vm, {"phase": phase, "region": region, "issued_at": found[1]}
                )
            value = marker_value(marker)
            ec2.create_tags(Resources=[vm.name], Tags=[{"Key": MARKER_TAG, "Value": value}])
            try:
                if action == VMAction.RESTART:
                    response = ec2.reboot_instances(InstanceIds=[vm.name])
                    phase, state = "reboot", instance["State"]["Name"]
                else:
                    response = ec2.stop_instances(InstanceIds=[vm.name])
                    phase, state = "stop", response["StoppingInstances"][0]["CurrentState"]["Name"]
            except ClientError:
                # EC2 answered with an error, so nothing happened: the marker must not make the retry
                # skip the action. (A timeout proves nothing; then the marker stays and we under-act.)
                self._withdraw(ec2, vm, value)
                raise
        log.info("aws %s issued for %s", phase, vm.name)
        data = {"phase": phase, "region": region, "state": state, "issued_at": time.time()}
        return Operation("aws", response["ResponseMetadata"]["RequestId"], action, vm, data)

    @staticmethod
    def _withdraw(ec2: Any, vm: VMRef, value: str) -> None:
        try:  # deletes the tag only if it still holds our value
            ec2.delete_tags(Resources=[vm.name], Tags=[{"Key": MARKER_TAG, "Value": value}])
        except (ClientError, BotoCoreError) as exc:
            log.warning("could not withdraw the marker on %s (a retry will under-act): %s", vm.name, exc)

    def poll(self, op: Operation) -> OperationStatus:
        vm = op.vm
        ec2 = self._ec2(vm, op.data.get("region"))
        with _translated(vm):
            found = ec2.describe_instance_status(InstanceIds=[vm.name], IncludeAllInstances=True)[
                "InstanceStatuses"
            ]
            if not found:
                raise NotFound(f"VM not found ({vm.provider_id or vm.name}): no instance status")
            status = found[0]
            state = status["InstanceState"]["Name"]
            phase = op.data.get("phase")
            if state in ("terminated", "shutting-down"):
                return OperationStatus(done=True, error=f"EC2 instance {vm.name} is {state}")
            if phase == "stop":
                waited = time.time() - float(op.data.get("issued_at", 0))
                if state == "stopped" or (state in ("pending", "running") and waited > _STOP_VISIBLE_S):
                    response = ec2.start_instances(InstanceIds=[vm.name]) if state == "stopped" else None
                    request_id = response["ResponseMetadata"]["RequestId"] if response else op.ref
                    data = {**op.data, "phase": "start", "state": state, "issued_at": time.time()}
                    return OperationStatus(
                        done=False, replace=Operation("aws", request_id, op.action, vm, data)
                    )
                return OperationStatus(done=False)
            if state == "stopped" and phase == "start":
                ec2.start_instances(InstanceIds=[vm.name])  # the start did not take; starting is idempotent
                return OperationStatus(done=False)
            checks = {
                status.get("InstanceStatus", {}).get("Status"),
                status.get("SystemStatus", {}).get("Status"),
            }
            return OperationStatus(done=state == "running" and "initializing" not in checks)


@contextmanager
def _translated(vm: VMRef) -> Iterator[None]:
    """Turn botocore errors raised in the block into remediation.ports.errors."""
    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = error.get("Code", ""), error.get("Message", str(exc))
        meta = exc.response.get("ResponseMetadata", {})
        status = meta.get("HTTPStatusCode")
        retry_after = (meta.get("HTTPHeaders") or {}).get("retry-after")
        if code in _NOT_FOUND:
            status = 404
        elif code in _DENIED or code in _QUOTA:
            status = 403  # the quota codes carry "LimitExceeded", which the one table reads as a quota
        elif code in _TRANSIENT and not (status == 429 or (status or 0) >= 500):
            status = 503  # EC2 answers throttling with a 400 status; the code is what counts
        raise error_for_status(status, f"{code}: {message}", vm=vm, retry_after=retry_after) from exc
    except (NoCredentialsError, NoRegionError) as exc:
        raise ConfigError(f"AWS configuration: {exc}", component="cloud") from exc
    except (BotoConnectionError, HTTPClientError) as exc:
        raise TransientError(f"cannot reach EC2: {exc}") from exc
    except BotoCoreError as exc:
        raise PermanentError(f"EC2 client error: {exc}") from exc
