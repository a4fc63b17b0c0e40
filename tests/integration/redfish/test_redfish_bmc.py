"""The redfish backend against a real Redfish BMC (sushy-tools' emulator, HTTPS and basic auth), with
its intents on the step rows of a real Postgres.

What is shown: one reset POST per idempotency key, counted in the BMC's own access log, across a worker
process SIGKILLed right after its POST and a resume, and across a worker dying in the workflow engine's
vm_restart step, which the engine resumes by polling the intent the dead worker wrote; the evidence (the
system seen leaving On and On again after the request) kept on the step row; the ForceOff-then-On
power cycle where the BMC offers no PowerCycle; a wrong password as the credential error that pauses
automation; an unreachable BMC as a transient error of its node; TLS verified against the CA file, a
wrong CA failing clearly; dry-run sending nothing. No message, log line or record carries the password.

And where the login goes: only to a BMC the inventory lists. A Node annotation is written by the node's
own kubelet (root on the node may write anything there): naming its own host, or credentials, is refused
before anything connects; it may only pick a system on a BMC the inventory lists, signing in with the
inventory's login for it. A BMC whose JSON names a reset ``target`` on another host is refused too.
"Nothing reached it" is shown by a socket that listens and is never answered: the kernel completes any
connection to it, so an empty accept queue means nothing connected, and nothing was sent.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryWorld
from remediation.adapters.noop import Recorder
from remediation.adapters.redfish.client import BmcSession
from remediation.adapters.redfish.inventory import Inventory
from remediation.adapters.redfish.noop import NoopRedfish
from remediation.adapters.redfish.provider import RedfishProvider
from remediation.clock import FakeClock
from remediation.db.intents import StepIntents
from remediation.db.models import Node, Remediation, RemediationStep
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.domain.outcomes import Adapters
from remediation.ports.cluster import Operation, OperationStatus, VMAction, VMRef
from remediation.ports.errors import ConfigError, CredentialError, RemediationError, Scope, TransientError
from remediation.services.ingest import ingest
from remediation.services.workflow import Workflow
from remediation.settings import RedfishSettings, Settings
from remediation.simulator.kube.tls import write_cluster_pki
from tests.integration.redfish.conftest import PASSWORD, USER, Emulator, JsonBmc, stand_in_bmc
from tests.pace import within
from tests.ports import dead_address
from tests.scenario_table import IMPOSTOR, BadInputs

ROOT = Path(__file__).resolve().parents[3]


def step_key(sessions: sessionmaker[Session], node: str) -> str:
    """A started vm_restart step row of a new remediation of ``node``: its idempotency key."""
    now = datetime.now(UTC)
    with sessions() as s, s.begin():
        if s.get(Node, ("default", node)) is None:
            s.add(Node(name=node, first_seen_at=now, updated_at=now))
        s.flush()
        rem = Remediation(
            node=node,
            cause="xid 79",
            source="slurm",
            status="cancelled",
            step="vm_restart",
            opened_at=now,
            updated_at=now,
        )
        s.add(rem)
        s.flush()
        key = f"r{rem.id}:vm_restart:1"
        s.add(
            RemediationStep(
                remediation_id=rem.id,
                step="vm_restart",
                attempt=1,
                idempotency_key=key,
                status="started",
                started_at=now,
            )
        )
    return key


def stored(sessions: sessionmaker[Session], key: str) -> dict[str, Any] | None:
    with sessions() as s:
        return s.scalars(
            select(RemediationStep.provider_op).where(RemediationStep.idempotency_key == key)
        ).one()


def configure(
    tmp: Path, emulator: Emulator, *, password: str = PASSWORD, ca: Path | None = None, url: str | None = None
) -> RedfishSettings:
    inventory = {
        f"node-{name}": {"bmc": url or emulator.url, "system": system, "credentials": "rack-1"}
        for name, system in emulator.systems.items()
    }
    (tmp / "inventory.yaml").write_text(yaml.safe_dump(inventory))
    (tmp / "credentials.json").write_text(json.dumps({"rack-1": {"username": USER, "password": password}}))
    return RedfishSettings(
        inventory_file=str(tmp / "inventory.yaml"),
        credentials_file=str(tmp / "credentials.json"),
        ca_file=str(ca or emulator.ca_file),
        connect_timeout_s=2,
        request_timeout_s=10,
    )


def provider_for(settings: RedfishSettings, sessions: sessionmaker[Session]) -> RedfishProvider:
    return RedfishProvider(settings, Inventory(settings), StepIntents(sessions))


def until_done(
    provider: RedfishProvider, op: Operation, timeout: float = 40.0
) -> tuple[OperationStatus, Operation]:
    """Poll as the workflow does, each poll from the stored shape, following ``replace``."""
    deadline = within(timeout)
    while True:
        status = provider.poll(Operation.from_dict(op.to_dict()))
        op = status.replace or op
        if status.done:
            return status, op
        assert time.monotonic() < deadline, f"not done after {timeout}s: {op.data}"
        time.sleep(0.2)


def settled(emulator: Emulator, provider: RedfishProvider, node: str) -> None:
    """A barrier: one more request to the BMC, seen in its log, so every request before it is too."""
    marker = f"/redfish/v1/Systems/{emulator.systems[node.removeprefix('node-')]}"
    before = emulator.log.read_text().count(marker)
    provider.plan(provider.machine_of(node), VMAction.RESTART)
    deadline = within(10)
    while emulator.log.read_text().count(marker) <= before:
        assert time.monotonic() < deadline, "the barrier request never reached the log"
        time.sleep(0.05)


def test_a_restart_is_one_graceful_restart_recorded_before_it_is_sent(
    emulator, sessions, tmp_path, cycle
) -> None:
    provider = provider_for(configure(tmp_path, emulator), sessions)
    key = step_key(sessions, "node-restart")
    op = provider.start(provider.machine_of("node-restart"), VMAction.RESTART, key)
    assert op.data["reset"] == "GracefulRestart" and op.data["phase"] == "sent" and op.data["before"] == "On"
    assert stored(sessions, key) == op.to_dict()  # the step row holds it: a resumed step polls it
    again = provider.start(provider.machine_of("node-restart"), VMAction.RESTART, key)
    assert again == op
    settled(emulator, provider, "node-restart")
    assert emulator.resets("restart") == 1
    assert PASSWORD not in json.dumps(op.to_dict())


def test_a_worker_killed_after_its_post_never_sends_a_second_reset(emulator, sessions, tmp_path) -> None:
    settings = configure(tmp_path, emulator)
    key = step_key(sessions, "node-killed")
    cfg = {
        "settings": settings.model_dump(),
        "db": str(sessions.kw["bind"].url.render_as_string(False)),
        "node": "node-killed",
        "key": key,
    }
    with subprocess.Popen(
        [sys.executable, "-m", "tests.integration.redfish.killed_worker", json.dumps(cfg)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as worker:  # leaving the block closes the pipes
        try:
            line = worker.stdout.readline() if worker.stdout else ""
            assert line.strip() == "SENT", worker.communicate(timeout=10)
            os.kill(worker.pid, signal.SIGKILL)  # after the BMC took the reset, before anything was recorded
        finally:
            worker.kill()
            worker.wait(10)
    intent = stored(sessions, key)
    assert intent is not None and intent["data"]["phase"] == "requested"  # written before the POST

    provider = provider_for(settings, sessions)  # the resumed worker
    op = provider.start(provider.machine_of("node-killed"), VMAction.RESTART, key)
    assert op.to_dict() == intent  # the recorded operation, not a new reset
    assert not provider.poll(op).error  # and polling it sends nothing either
    settled(emulator, provider, "node-killed")
    assert emulator.resets("killed") == 1


class WorkerDied(BaseException):
    """A worker dying mid-step: nothing catches it, so nothing after it is recorded."""


@pytest.mark.policy("naive-ladder", why="kills the worker inside a BMC restart, the naive ladder's first rung")
def test_the_workflow_resumes_a_killed_restart_by_polling_its_intent(
    emulator, sessions, tmp_path, monkeypatch
) -> None:
    world = MemoryWorld(nodes=["node-workflow"])
    # The other tests' remediations share this database: the breaker must not count them as a storm.
    settings = Settings(
        policy={"min_restart_gap_s": 0, "breaker_min_failures": 1000},
        workflow={"poll_interval_s": 1, "lease_s": 30},
    )
    provider = provider_for(configure(tmp_path, emulator), sessions)
    clock = FakeClock(datetime.now(UTC))
    engine = Workflow(sessions, Adapters(MemorySlurm(world), MemoryKube(world), provider), settings,
                      clock=clock)
    world.set_slurm("node-workflow", flags=["FAIL"], reason="xid 79", user="researcher")  # what the event reports
    event = NodeEvent(
        source=Source.SLURM,
        node="node-workflow",
        kind=EventKind.UNHEALTHY,
        state="FAIL",
        reason="xid 79",
        observed_at=clock.now(),
    )
    with sessions() as s, s.begin():
        ((rid, step),) = ingest(s, [event.to_json()], settings.policy, clock=clock).opened
    for _ in range(3):  # drain, cordon, evict in the memory world
        followup = engine.run(rid, step)
        assert followup is not None
        step = followup.step
    assert step == "vm_restart"

    sent = BmcSession.reset

    def sent_then_died(self: BmcSession, reset_type: str) -> None:
        sent(self, reset_type)
        raise WorkerDied

    assert engine.run(rid, "vm_restart") is not None  # slurmd's start, recorded before the action
    monkeypatch.setattr(BmcSession, "reset", sent_then_died)
    with pytest.raises(WorkerDied):
        engine.run(rid, "vm_restart")  # the reset reached the BMC; the worker died before recording it
    monkeypatch.undo()

    clock.advance(31)  # its lease runs out: a redelivered task (or the sweeper) runs the step again
    deadline = within(40)
    while (followup := engine.run(rid, "vm_restart")) is not None and followup.step == "vm_restart":
        assert time.monotonic() < deadline, "the restart never completed"
        clock.advance(followup.countdown)
        time.sleep(0.2)
    with sessions() as s:
        row = s.scalars(
            select(RemediationStep).where(
                RemediationStep.remediation_id == rid, RemediationStep.step == "vm_restart"
            )
        ).one()
    assert row.status == "done" and row.provider_op["data"]["evidence"] == "left On, then On again"
    states = [state for state, _ in row.provider_op["data"]["seen"]]
    assert states[-1] == "On" and "Off" in states  # after the request: left On, then On again
    assert row.provider_op["data"]["phase"] == "requested"  # the intent the dead worker wrote, polled
    settled(emulator, provider, "node-workflow")
    assert emulator.resets("workflow") == 1


def test_a_wrong_password_is_a_credential_error_that_pauses_automation(emulator, sessions, tmp_path) -> None:
    provider = provider_for(configure(tmp_path, emulator, password="not-" + PASSWORD), sessions)
    key = step_key(sessions, "node-login")
    with pytest.raises(CredentialError) as info:
        provider.start(provider.machine_of("node-login"), VMAction.RESTART, key)
    assert info.value.scope is Scope.SYSTEM and info.value.status == 401
    assert "401" in info.value.message and PASSWORD not in info.value.message
    assert stored(sessions, key) is None and emulator.resets("login") == 0


def test_an_unreachable_bmc_is_a_transient_error_of_its_node(emulator, sessions, tmp_path) -> None:
    with dead_address() as nobody:  # held, never listening: a refused connection throughout
        provider = provider_for(configure(tmp_path, emulator, url=f"https://{nobody}"), sessions)
        key = step_key(sessions, "node-restart")
        with pytest.raises(TransientError) as info:
            provider.start(provider.machine_of("node-restart"), VMAction.RESTART, key)
    assert (
        info.value.scope is Scope.TRANSIENT and "no answer" in info.value.message
    )  # retried, then its ladder
    assert stored(sessions, key) is None


def test_tls_is_verified_against_the_ca_file_and_a_wrong_one_fails_clearly(
    emulator, sessions, tmp_path
) -> None:
    other = write_cluster_pki(tmp_path)  # a CA that did not sign the BMC's certificate
    for ca, trust in ((other.ca_file, "redfish.ca_file"), (None, "the system trust store")):
        settings = configure(tmp_path, emulator, ca=ca).model_copy(update={"ca_file": ca and str(ca)})
        provider = provider_for(settings, sessions)
        with pytest.raises(ConfigError) as info:
            provider.start(
                provider.machine_of("node-login"), VMAction.RESTART, step_key(sessions, "node-login")
            )
        assert info.value.scope is Scope.SYSTEM
        assert (
            f"does not verify against {trust}" in info.value.message
            and "CERTIFICATE_VERIFY_FAILED" in info.value.message
        )
    assert emulator.resets("login") == 0


def test_dry_run_reads_the_bmc_and_sends_nothing(emulator, sessions, tmp_path) -> None:
    recorder = Recorder()
    dry = NoopRedfish(provider_for(configure(tmp_path, emulator), sessions), recorder)
    op = dry.start(dry.machine_of("node-dry"), VMAction.RESTART, "r0:vm_restart:1")
    assert op.ref == "dry-run:r0:vm_restart:1" and dry.poll(op).done
    assert recorder.actions[0]["would"] == "GracefulRestart" and recorder.actions[0]["power"] == "On"
    settled(emulator, dry.real, "node-dry")
    assert emulator.resets("dry") == 0


def test_a_node_missing_from_the_inventory_is_its_own_error(emulator, sessions, tmp_path) -> None:
    provider = provider_for(configure(tmp_path, emulator), sessions)
    with pytest.raises(RemediationError) as info:
        provider.machine_of("gpu-node-unlisted")
    assert info.value.scope is Scope.NODE and "no BMC known for gpu-node-unlisted" in info.value.message
    with pytest.raises(RemediationError, match="cannot act on a gce VM"):
        provider.start(VMRef("gce", "vm-1", provider_id="gce://p/z/vm-1"), VMAction.RESTART, "k")


@pytest.fixture(scope="module")
def cycle(emulator, sessions, tmp_path_factory) -> tuple[RedfishProvider, Operation]:
    """A power cycle started when the module starts: its two power changes (1 to 11 s each) then land
    while the tests before its own run."""
    provider = provider_for(configure(tmp_path_factory.mktemp("cycle"), emulator), sessions)
    key = step_key(sessions, "node-cycle")
    return provider, provider.start(provider.machine_of("node-cycle"), VMAction.STOP_START, key)


def test_without_powercycle_a_power_cycle_is_force_off_then_on(emulator, cycle) -> None:
    provider, op = cycle
    assert (op.data["reset"], op.data["then"]) == ("ForceOff", "On")  # the emulator offers no PowerCycle
    status, op = until_done(provider, op)
    assert status.error is None and op.data["phase"] == "then-sent"
    assert [s for s, _ in op.data["seen"]][-2:] == ["Off", "On"], op.data
    settled(emulator, provider, "node-cycle")
    assert emulator.resets("cycle") == 2  # ForceOff, then On once it was seen Off


# ------------------------------------------------------------------ where the login goes

ANNOTATION = "example.com/bmc"


@pytest.fixture
def trap() -> Iterator[socket.socket]:
    """A socket that listens and never answers: where a stolen login would go."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # kept bound and listening until the test ends: never handed on
        sock.listen(8)
        sock.setblocking(False)
        yield sock


def connected(sock: socket.socket) -> bool:
    """Whether anything connected to the trap (the kernel accepted it for us)."""
    try:
        peer, _ = sock.accept()
    except BlockingIOError:
        return False
    peer.close()
    return True


def annotated(
    tmp: Path, emulator: Emulator, sessions: sessionmaker[Session], nodes: dict[str, dict[str, Any]]
) -> RedfishProvider:
    """The provider with the test inventory (the emulator's node-* entries but one, login rack-1) and the Node
    annotations ``nodes`` as the Kubernetes API would hand them over."""
    settings = configure(tmp, emulator).model_copy(update={"node_annotation": ANNOTATION})
    listed = yaml.safe_load((tmp / "inventory.yaml").read_text())
    del listed["node-foreign"]  # its system is on the emulator's BMC, for an annotation to pick
    (tmp / "inventory.yaml").write_text(yaml.safe_dump(listed))
    values = {node: {ANNOTATION: json.dumps(value)} for node, value in nodes.items()}
    inventory = Inventory(settings, lambda node: values.get(node, {}))
    return RedfishProvider(settings, inventory, StepIntents(sessions))


def test_an_annotation_never_sends_the_login_to_a_host_it_names(
    emulator: Emulator, sessions: sessionmaker[Session], tmp_path: Path, trap: socket.socket,
    bad_inputs: BadInputs,
) -> None:
    own = f"https://127.0.0.1:{trap.getsockname()[1]}"
    provider = annotated(
        tmp_path,
        emulator,
        sessions,
        {
            "gpu-node-own-host": {"bmc": own, "system": "1"},
            "gpu-node-steals-login": {"bmc": own, "system": "1", "credentials": "rack-1"},
            "gpu-node-names-login": {
                "bmc": emulator.url,
                "system": emulator.systems["foreign"],
                "credentials": "rack-1",
            },
            "gpu-node-takes-another": {"bmc": emulator.url, "system": emulator.systems["restart"]},
            "gpu-node-on-the-chassis": {"bmc": emulator.url, "system": emulator.systems["foreign"]},
        },
    )
    refused = {
        "gpu-node-steals-login": "bmc and system only",
        "gpu-node-own-host": "does not list",
        "gpu-node-names-login": "bmc and system only",
        "gpu-node-takes-another": "gives another node",
    }
    for node, why in refused.items():
        with pytest.raises(RemediationError) as info:
            provider.start(provider.machine_of(node), VMAction.RESTART, step_key(sessions, node))
        sent = connected(trap)
        assert not sent, f"{node}: the login went where its annotation said"
        assert why in info.value.message and info.value.scope is Scope.NODE  # that node's error alone
        bad_inputs.tried(IMPOSTOR, f"a Node annotation: {node.removeprefix('gpu-node-').replace('-', ' ')}",
                         f"refused ({why}); no login sent", lost=int(sent))
    # A system picked on a BMC the inventory lists, with the inventory's login for it, is acted on.
    node = "gpu-node-on-the-chassis"
    op = provider.start(provider.machine_of(node), VMAction.RESTART, step_key(sessions, node))
    assert (op.data["bmc"], op.data["credentials"], op.data["phase"]) == (emulator.url, "rack-1", "sent")


class RedirectingBmc(JsonBmc):
    """A BMC whose system names its reset target on another host (``server.elsewhere``)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        root = {
            "@odata.id": "/redfish/v1/",
            "Id": "RootService",
            "Name": "Root",
            "RedfishVersion": "1.6.0",
            "Systems": {"@odata.id": "/redfish/v1/Systems"},
        }
        system = {
            "@odata.id": "/redfish/v1/Systems/1",
            "Id": "1",
            "Name": "1",
            "PowerState": "On",
            "Actions": {
                "#ComputerSystem.Reset": {
                    "target": f"{self.server.elsewhere}/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",  # type: ignore[attr-defined]
                    "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "GracefulRestart"],
                }
            },
        }
        self.answer(200, json.dumps(root if self.path.rstrip("/") == "/redfish/v1" else system).encode())


def test_a_reset_target_on_another_host_is_refused(
    emulator: Emulator, sessions: sessionmaker[Session], tmp_path: Path, trap: socket.socket
) -> None:
    elsewhere = f"https://127.0.0.1:{trap.getsockname()[1]}"
    with stand_in_bmc(tmp_path, RedirectingBmc, elsewhere=elsewhere) as (url, ca_file, _server):
        settings = configure(tmp_path, emulator, url=url, ca=ca_file)
        provider = RedfishProvider(
            RedfishSettings.model_validate(settings.model_dump()), Inventory(settings), StepIntents(sessions)
        )
        key = step_key(sessions, "node-login")
        with pytest.raises(RemediationError, match="not a path on the BMC") as info:
            provider.start(provider.machine_of("node-login"), VMAction.RESTART, key)
        assert info.value.scope is Scope.NODE
        assert not connected(trap)
