"""Local cloud endpoints for the VM adapters, each driven through its real SDK.

- GCE: :class:`remediation.simulator.gce_api.GceFake` over http (the REST transport takes any api_endpoint).
- Azure: :class:`remediation.simulator.azure_api.AzureFake` over HTTPS with a certificate made for this test, so
  azure-core's bearer-token policy runs exactly as against ARM.
- AWS: moto's server mode on a free port, shared by the session (it starts in about a second); each test
  launches its own instances, so tests never see each other's state.

Operations take 50 ms and polling loops sleep 10 ms, so the whole cloud suite runs in seconds.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from azure.core.credentials import AccessToken
from botocore.awsrequest import AWSResponse
from moto.server import ThreadedMotoServer

from remediation.ports.cluster import MachineProvider, Operation, OperationStatus
from remediation.settings import MachineSettings
from remediation.simulator.azure_api import AzureFake, make_self_signed_cert
from remediation.simulator.gce_api import GceFake
from tests.pace import within

PROJECT, ZONE = "gpu-proj", "us-central1-a"
SUB, RG = "0b1f6471-1bf0-4dda-aec3-111122223333", "gpu-rg"
OP_SECONDS = 0.05


def wait_done(
    provider: MachineProvider, op: Operation, *, timeout: float = 10.0
) -> tuple[OperationStatus, Operation]:
    """Poll as the workflow does (once per 'task run'), following ``replace``; return the last status."""
    deadline = within(timeout)
    while time.monotonic() < deadline:
        status = provider.poll(Operation.from_dict(op.to_dict()))  # every poll resumes from the DB shape
        if status.replace is not None:
            op = status.replace
        if status.done:
            return status, op
        time.sleep(0.01)
    raise AssertionError(f"operation {op.ref} not done after {timeout}s")


class StaticToken:
    """An Azure TokenCredential for the fake: the bearer policy runs, the token is meaningless."""

    def __init__(self) -> None:
        self.calls = 0

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.calls += 1
        return AccessToken("fake-token", int(time.time()) + 3600)


# ----------------------------------------------------------------------------------------------- GCE


@pytest.fixture
def gce_fake() -> Iterator[GceFake]:
    fake = GceFake(op_seconds=OP_SECONDS, wait_seconds=0.2)
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        fake.add_instance(PROJECT, ZONE, name)
    with fake:
        yield fake


@pytest.fixture
def gce_settings(gce_fake: GceFake) -> MachineSettings:
    return MachineSettings(gce_endpoint=gce_fake.url, gce_anonymous=True, request_timeout_s=5)


# --------------------------------------------------------------------------------------------- Azure


@pytest.fixture
def azure_cert(tmp_path: Path) -> tuple[Path, Path]:
    return make_self_signed_cert(tmp_path)


@pytest.fixture
def azure_fake(azure_cert: tuple[Path, Path]) -> Iterator[AzureFake]:
    fake = AzureFake(*azure_cert, op_seconds=OP_SECONDS)
    fake.add_vm(SUB, RG, "gpu-vm-1")
    fake.add_vm(SUB, RG, "gpu-vm-2")
    fake.add_vm(SUB, RG, "7", scale_set="gpu-ss")
    with fake:
        yield fake


@pytest.fixture
def azure_settings(azure_fake: AzureFake, azure_cert: tuple[Path, Path]) -> MachineSettings:
    return MachineSettings(
        azure_endpoint=azure_fake.url,
        azure_ca_file=str(azure_cert[0]),
        azure_polling_interval_s=0.01,
        request_timeout_s=5,
    )


# ----------------------------------------------------------------------------------------------- AWS


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_session() -> boto3.Session:
    return boto3.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )


@pytest.fixture
def aws_settings(moto_url: str) -> MachineSettings:
    return MachineSettings(aws_endpoint=moto_url, aws_region="us-east-1", request_timeout_s=5)


@pytest.fixture(scope="session")
def ec2_image(moto_url: str) -> str:
    """An AMI moto knows (listing them is slow, so once per session)."""
    ec2 = boto3.client("ec2", endpoint_url=moto_url, region_name="us-east-1", aws_access_key_id="testing",
                       aws_secret_access_key="testing")  # fmt: skip
    return str(ec2.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"])


@pytest.fixture
def ec2_instances(aws_session: boto3.Session, moto_url: str, ec2_image: str) -> list[str]:
    """Three fresh running instances in us-east-1a."""
    ec2 = aws_session.client("ec2", endpoint_url=moto_url)
    image = ec2_image
    launched = ec2.run_instances(
        ImageId=image, MinCount=3, MaxCount=3, Placement={"AvailabilityZone": "us-east-1a"}
    )
    return [i["InstanceId"] for i in launched["Instances"]]


@pytest.fixture
def count_calls() -> Callable[[boto3.Session, str], list[dict[str, Any]]]:
    """Record every EC2 call of one operation that a session's clients really send."""

    def install(session: boto3.Session, operation: str) -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = []
        session.events.register(
            f"before-call.ec2.{operation}", lambda params, **kwargs: seen.append(params["body"])
        )
        return seen

    return install


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[bytes]:
        yield self._data


@pytest.fixture
def ec2_faults() -> Callable[..., list[str]]:
    """Answer the next ``times`` calls of an EC2 operation with an EC2 error response, before moto sees
    them (moto has no fault injection). botocore parses the reply exactly as one from AWS."""

    def install(
        session: boto3.Session,
        operation: str,
        status: int,
        code: str,
        *,
        retry_after: int | None = None,
        times: int = 1,
    ) -> list[str]:
        injected: list[str] = []

        def reply(request: Any, **kwargs: Any) -> AWSResponse | None:
            if len(injected) >= times:
                return None
            injected.append(operation)
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}</Code>'
                f"<Message>injected {code}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
            ).encode()
            headers = {"Content-Type": "text/xml"} | (
                {"Retry-After": str(retry_after)} if retry_after else {}
            )
            return AWSResponse(request.url, status, headers, _Body(body))

        session.events.register(f"before-send.ec2.{operation}", reply)
        return injected

    return install
