"""The validation's Kubernetes backend against the simulated apiserver, with the real BatchV1Api.

The simulator runs Jobs as a Job controller and kubelet would show them (remediation.simulator.kube.jobs): one pod
bound to the Job's nodeName, admitted only if it tolerates the Node's taints and cordon, ended with the
exit code and log its ``outcome`` hook decides, and killed at ``activeDeadlineSeconds``
(``DeadlineExceeded``). The workflow engine drives the ``validate`` step on a Node we cordoned and
tainted; pass, fail and timeout are each followed to their end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from kubernetes import client
from prometheus_client import generate_latest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.factory import validator_backend
from remediation.adapters.kube.adapter import make_kube
from remediation.adapters.kube.validator import KubeValidator
from remediation.adapters.memory import MemorySlurm, MemoryVM, MemoryWorld
from remediation.clock import SystemClock
from remediation.db.models import AuditLog, Node, Remediation, RemediationStep, Validation
from remediation.domain.step_bodies import Adapters
from remediation.services.metrics import make_registry
from remediation.services.readmodels import node_detail
from remediation.services.workflow import Workflow
from remediation.settings import Settings
from remediation.simulator.kube.api import KubeAPIServer
from tests.pace import within

NODE = "gpu-node-1"
PREFIX = "remediation:"


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(
        kube={"mapping": "node"},
        workflow={"poll_interval_s": 0.05, "max_wait_s": 0.5},
        validation={"backend": "kubernetes", "poll_interval_s": 0.05, "kube_image": "dcgm:test",
                    "timeout_s": {"default": 30, "gpu-memory": 1}},
    )


def engine(settings: Settings, kube_api: KubeAPIServer, sessions: sessionmaker[Session]) -> tuple[Workflow, MemoryWorld]:
    world = MemoryWorld(nodes=[NODE])
    world.set_slurm(NODE, state="IDLE", flags=["DRAIN"], reason=f"{PREFIX} xid 48")
    kube = make_kube(settings)
    kube.cordon(NODE, f"{PREFIX} xid 48")
    kube.set_quarantine_taint(NODE, True)  # the Job must tolerate our taint too
    validator = validator_backend(settings)
    assert isinstance(validator, KubeValidator)
    return Workflow(sessions, Adapters(MemorySlurm(world), kube, MemoryVM(world), validator), settings,
                    clock=SystemClock()), world


def open_at_validate(sessions: sessionmaker[Session], cause_class: str) -> int:
    now = datetime.now(UTC)
    with sessions() as s, s.begin():
        s.add(Node(name=NODE, status="remediating", first_seen_at=now, updated_at=now))
        rem = Remediation(node=NODE, cause="xid 48: double-bit ECC", source="slurm", status="running",
                          step="validate", ladder=0, opened_at=now, updated_at=now, next_run_at=now,
                          context={"cause_class": cause_class, "k8s_node": NODE, "we_cordoned": True})
        s.add(rem)
        s.flush()
        return rem.id


def drive(wf: Workflow, rid: int, until: Callable[[], bool], timeout: float = 15) -> None:
    deadline, step = within(timeout), "validate"
    while not until():
        assert time.monotonic() < deadline, "the workflow did not get there in time"
        follow = wf.run(rid, step)
        if follow is None:
            return
        step = follow.step
        time.sleep(min(follow.countdown or 0, 0.1))


def rem_state(sessions: sessionmaker[Session], rid: int) -> tuple[str, str, int]:
    with sessions() as s:
        rem = s.get(Remediation, rid)
        assert rem is not None
        return rem.status, rem.step, rem.ladder


def posted_job(kube_api: KubeAPIServer) -> dict:
    posts = [r for r in kube_api.requests if r.method == "POST" and r.path.endswith("/jobs")]
    assert len(posts) == 1, posts  # one check, created once
    return posts[0].body


def test_pass_binds_tolerates_and_returns_the_node(settings: Settings, kube_api: KubeAPIServer,
                                                   sessions: sessionmaker[Session]) -> None:
    kube_api.add_node(NODE)
    kube_api.jobs.outcome = lambda node, argv: (0, "Diagnostic  | Result\nMemory | Pass\n", 0.1)
    wf, world = engine(settings, kube_api, sessions)
    rid = open_at_validate(sessions, "gpu-memory")
    drive(wf, rid, lambda: rem_state(sessions, rid)[0] == "succeeded")
    assert rem_state(sessions, rid) == ("succeeded", "done", 0)
    job = posted_job(kube_api)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeName"] == NODE and pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    assert {(t["key"], t["effect"]) for t in pod["tolerations"]} == {
        ("node.kubernetes.io/unschedulable", "NoSchedule"), (f"{settings.kube.annotation_domain}/quarantined", "NoSchedule")}
    assert job["spec"]["activeDeadlineSeconds"] == 1  # gpu-memory's timeout in this test's settings
    assert pod["containers"][0]["image"] == "dcgm:test"
    assert pod["containers"][0]["command"] == ["dcgmi", "diag", "-r", "3"]  # the memory class's check
    # Its own namespace, no API credential, and root in a privileged container: what DCGM needs.
    assert job["metadata"]["namespace"] == "node-remediation-validation"
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    assert pod["containers"][0]["securityContext"] == {"privileged": True, "runAsUser": 0, "runAsNonRoot": False}
    assert not any(pod.get(k) for k in ("hostPID", "hostNetwork", "hostIPC", "volumes"))
    assert kube_api.store.tables["jobs"] == {}  # taken down
    node = kube_api.node(NODE)
    assert not node["spec"].get("unschedulable") and not node["spec"].get("taints")  # returned
    assert "DRAIN" not in MemorySlurm(world).get_node(NODE).flags
    with sessions() as s:
        v = s.scalars(select(Validation).where(Validation.remediation_id == rid)).one()
    assert (v.outcome, v.exit_code, v.backend, v.cause_class) == ("passed", 0, "kubernetes", "gpu-memory")
    assert "Memory | Pass" in v.output_tail and v.command == "dcgmi diag -r 3"
    with sessions() as s:
        shown = node_detail(s, NODE).validations  # what nodes show, the API and the dashboard render
    assert [(x.outcome, x.remediation_id, x.exit_code) for x in shown] == [("passed", rid, 0)]
    text = metrics(sessions)
    assert 'remediation_validations_total{backend="kubernetes",cluster="default",outcome="passed"} 1.0' in text
    assert 'remediation_validation_pass_rate{cluster="default"} 1.0' in text


def test_fail_climbs_the_ladder_with_the_log_on_the_step(settings: Settings, kube_api: KubeAPIServer,
                                                        sessions: sessionmaker[Session]) -> None:
    kube_api.add_node(NODE)
    kube_api.jobs.outcome = lambda node, argv: (226, "Memory | Fail: row remapping failure on GPU 3\n", 0.05)
    wf, world = engine(settings, kube_api, sessions)
    rid = open_at_validate(sessions, "gpu-hardware")
    drive(wf, rid, lambda: rem_state(sessions, rid)[1] != "validate")
    assert rem_state(sessions, rid) == ("running", "vm_restart", 1)
    assert kube_api.node(NODE)["spec"].get("unschedulable") is True  # not returned
    assert "DRAIN" in MemorySlurm(world).get_node(NODE).flags
    with sessions() as s:
        row = s.scalars(select(RemediationStep).where(RemediationStep.remediation_id == rid)).one()
        v = s.scalars(select(Validation).where(Validation.remediation_id == rid)).one()
        assert row.status == "failed" and "exit 226" in (row.error or "")
        assert "row remapping failure" in row.detail["validation"]["output"]
    assert (v.outcome, v.exit_code) == ("failed", 226)
    text = metrics(sessions)
    assert 'remediation_validations_total{backend="kubernetes",cluster="default",outcome="failed"} 1.0' in text
    assert 'remediation_validation_pass_rate{cluster="default"} 0.0' in text
    assert 'remediation_validation_duration_seconds_count{cluster="default",outcome="failed"} 1.0' in text


def metrics(sessions: sessionmaker[Session]) -> str:
    return generate_latest(make_registry(sessions)).decode()


def test_timeout_holds_the_node_and_pages_once(settings: Settings, kube_api: KubeAPIServer,
                                               sessions: sessionmaker[Session]) -> None:
    kube_api.add_node(NODE)
    kube_api.jobs.outcome = lambda node, argv: (None, "", 0)  # the check hangs
    wf, world = engine(settings, kube_api, sessions)
    rid = open_at_validate(sessions, "gpu-memory")  # 1 s deadline
    drive(wf, rid, lambda: rem_state(sessions, rid)[0] == "waiting" and held(sessions, rid))
    follow = wf.run(rid, "validate")  # the held remediation's next look: still held, no second page
    assert follow is not None and follow.step == "validate"
    assert rem_state(sessions, rid) == ("waiting", "validate", 0)
    with sessions() as s:
        pages = s.scalars(select(AuditLog).where(AuditLog.action == "validation_held")).all()
        v = s.scalars(select(Validation).where(Validation.remediation_id == rid)).one()
        rows = s.scalars(select(RemediationStep).where(RemediationStep.remediation_id == rid)).all()
    assert len(pages) == 1 and "did not finish within 1s" in pages[0].reason
    assert v.outcome == "timeout" and v.exit_code is None
    assert len(rows) == 1  # no second check started while held
    assert kube_api.store.tables["jobs"] == {}
    assert kube_api.node(NODE)["spec"].get("unschedulable") is True and "DRAIN" in MemorySlurm(world).get_node(NODE).flags


def held(sessions: sessionmaker[Session], rid: int) -> bool:
    with sessions() as s:
        rem = s.get(Remediation, rid)
        return bool(rem and (rem.context or {}).get("held"))


def test_a_job_someone_else_named_like_the_check_returns_nothing(settings: Settings, kube_api: KubeAPIServer,
                                                                 sessions: sessionmaker[Session],
                                                                 core: client.CoreV1Api) -> None:
    """A Job of the check's very name (its nonce included) that is not ours: made by someone with Jobs
    in the namespace, ran ``true`` and passed. The check's create meets 409; the Job lacks our nonce
    label, so it is not taken for the check and its pass never returns the node: the node stays
    cordoned and drained, and the remediation ends in quarantine."""
    from remediation.adapters.kube.validator import MANAGED_BY
    from remediation.validation.rules import check_name

    kube_api.add_node(NODE)
    kube_api.jobs.outcome = lambda node, argv: (0, "", 0.01) if argv == ["true"] else (226, "Memory | Fail\n", 0.01)
    wf, world = engine(settings, kube_api, sessions)
    rid = open_at_validate(sessions, "gpu-hardware")
    nonce, now = "0a1b2c3d4e", datetime.now(UTC)
    with sessions() as s, s.begin():  # the attempt's row, its nonce recorded (a worker stopped there)
        s.add(RemediationStep(remediation_id=rid, step="validate", attempt=1, idempotency_key=f"r{rid}:validate:1",
                              status="started", started_at=now, checks=0, retries=0, detail={"nonce": nonce}))
    name = check_name(f"r{rid}:validate:1", nonce)
    planted = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": name, "labels": {MANAGED_BY[0]: MANAGED_BY[1], "node-remediation/gate": name},
                            "annotations": {"node-remediation/slurm-node": NODE}},
               "spec": {"backoffLimit": 0, "template": {"spec": {
                   "nodeName": NODE, "restartPolicy": "Never",
                   "tolerations": [{"operator": "Exists"}],
                   "containers": [{"name": "check", "image": "busybox", "command": ["true"]}]}}}}
    batch = client.BatchV1Api(core.api_client)  # someone else's client
    batch.create_namespaced_job(settings.validation.kube_namespace, planted)
    drive(wf, rid, lambda: rem_state(sessions, rid)[1] != "validate")
    assert rem_state(sessions, rid)[1] == "quarantine"
    with sessions() as s:
        row = s.scalars(select(RemediationStep).where(RemediationStep.remediation_id == rid)).one()
        assert (row.error or "").startswith("ForeignJob:") and "nonce" in (row.error or ""), row.error
        assert s.scalars(select(Validation).where(Validation.remediation_id == rid)).all() == []
    assert kube_api.node(NODE)["spec"].get("unschedulable") is True  # not returned
    assert "DRAIN" in MemorySlurm(world).get_node(NODE).flags
