"""The checkpoint request for pods, through the official client on the local kube-apiserver.

The adapter annotates the pods an eviction would remove (never the slurmd pod, a DaemonSet's or a
static pod's mirror) with when the request was made and when eviction starts, once: a pod that carries
the request keeps it, so a repeated call writes nothing. Nothing execs into a pod. Through the workflow
engine (Postgres, the database's intents, a fake clock), ``k8s_evict`` annotates first, goes on the
moment the pods have left (a training operator saved and removed them), and evicts the ones still
there ``checkpoint_wait_s`` after the request.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.kube.adapter import KubeAdapter, make_kube
from remediation.adapters.memory import MemorySlurm
from remediation.db.intents import StepIntents
from remediation.db.models import AuditLog
from remediation.domain.step_bodies import Adapters
from remediation.services.workflow import Workflow
from remediation.settings import Settings
from remediation.simulator.kube.api import KubeAPIServer
from tests.integration.kube.test_kube_workflow import (  # noqa: F401  (fixtures)
    SLURMD_LABEL,
    Cluster,
    build,
    by,
    clock,
)
from tests.integration.test_workflow_engine import drive, rem_for

ASKED = "remediation.gpu.io/checkpoint-requested-at"
DEADLINE = "remediation.gpu.io/checkpoint-deadline"
WAIT_S = 60


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    """The workflow tests' cluster, with the checkpoint request on for jobs and pods."""
    return make_settings(
        kube={"mapping": "pod", "pod_namespace": "slurm", "pod_label_selector": SLURMD_LABEL, "evict_backoff_s": 5.0},
        policy={"min_restart_gap_s": 0, "breaker_min_failures": 3},
        workflow={"poll_interval_s": 5, "max_wait_s": 60, "evict_timeout_s": 300, "verify_timeout_s": 120,
                  "lease_s": 30, "checkpoint_signal": "USR1", "checkpoint_wait_s": WAIT_S, "checkpoint_pods": True},
    )  # fmt: skip


def with_intents(c: Cluster, sessions: sessionmaker[Session]) -> Cluster:
    """The cluster's engine as a worker builds it: with the database's intents."""
    kube = make_kube(c.settings)
    c.engine = Workflow(
        sessions,
        Adapters(MemorySlurm(c.world), kube, c.vm, intents=StepIntents(sessions)),
        c.settings,
        clock=c.clock,
    )
    return c


def pod_annotations(api: KubeAPIServer, namespace: str, name: str) -> dict[str, str]:
    pod = next(
        p for p in api.pods() if (p["metadata"]["namespace"], p["metadata"]["name"]) == (namespace, name)
    )
    return dict(pod["metadata"].get("annotations") or {})


def test_the_adapter_annotates_each_leaving_pod_once_and_nothing_else(
    kube_api: KubeAPIServer, make_settings: Callable[..., Settings]
) -> None:
    kube = make_kube(make_settings(kube={"mapping": "node"}))
    assert isinstance(kube, KubeAdapter)
    kube_api.add_node("n1")
    kube_api.add_pod("ml", "trainer", node_name="n1", owner_kind="ReplicaSet")
    kube_api.add_pod("kube-system", "dcgm-exporter", node_name="n1", owner_kind="DaemonSet")
    kube_api.add_pod("kube-system", "kube-proxy-n1", node_name="n1", mirror=True)
    kube_api.add_pod("ml", "leaving", node_name="n1", terminating=True)
    kube_api.add_pod("ml", "elsewhere", node_name="n2")
    at = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    pods = kube.request_checkpoint("n1", at, at + timedelta(seconds=300))
    assert sorted(pods) == ["ml/leaving", "ml/trainer"]
    assert pod_annotations(kube_api, "ml", "trainer") == {
        ASKED: at.isoformat(),
        DEADLINE: "2026-03-01T12:05:00+00:00",
    }
    for ns, name in (
        ("kube-system", "dcgm-exporter"),
        ("kube-system", "kube-proxy-n1"),
        ("ml", "elsewhere"),
        ("ml", "leaving"),
    ):
        assert ASKED not in pod_annotations(kube_api, ns, name), name
    patched = [r.path for r in by(kube_api, "PATCH")]
    assert patched == ["/api/v1/namespaces/ml/pods/trainer"]

    rv = kube_api.resource_version
    again = kube.request_checkpoint("n1", at + timedelta(seconds=30), at + timedelta(seconds=330))
    assert sorted(again) == ["ml/leaving", "ml/trainer"]
    assert kube_api.resource_version == rv and len(by(kube_api, "PATCH")) == 1  # asked once: nothing written
    assert pod_annotations(kube_api, "ml", "trainer")[ASKED] == at.isoformat()
    assert not [r for r in kube_api.requests if r.method == "POST"]  # no eviction, no exec

    kube_api.remove_pod("ml", "trainer")
    kube_api.remove_pod("ml", "leaving")
    assert kube.request_checkpoint("n1", at, at) == []


def test_evict_goes_on_the_moment_the_asked_pods_have_left(
    build: Callable[..., Cluster], kube_api: KubeAPIServer, sessions: sessionmaker[Session]
) -> None:
    c = with_intents(build(), sessions)
    f = c.run_until(c.publish(), "k8s_evict")
    asked_at = c.clock.now()
    for _ in range(4):  # 20 s of looks: annotated once, nothing evicted
        f = c.step(f)
        assert f.step == "k8s_evict"
        c.clock.advance(f.countdown)
    notes = pod_annotations(kube_api, "default", "trainer-0")
    assert notes[ASKED] == asked_at.isoformat()
    assert notes[DEADLINE] == (asked_at + timedelta(seconds=WAIT_S)).isoformat()
    assert len(by(kube_api, "PATCH", "/pods/trainer-0")) == 1 and not by(kube_api, "POST", "/eviction")
    assert "asked pod default/trainer-0 to checkpoint (annotation)" in str(
        rem_for(sessions, "gpu-node-7").wait_reason
    )
    kube_api.remove_pod("default", "trainer-0")  # the operator saved its work and removed it
    drive(c.engine, c.clock, [f])
    assert rem_for(sessions, "gpu-node-7").status == "succeeded"
    assert not by(kube_api, "POST", "/eviction")
    with sessions() as s:
        (audit,) = s.scalars(select(AuditLog).where(AuditLog.action == "checkpoint_requested")).all()
    assert audit.detail["pods"] == ["default/trainer-0"]


def test_pods_still_there_after_checkpoint_wait_s_are_evicted(
    build: Callable[..., Cluster], kube_api: KubeAPIServer, sessions: sessionmaker[Session]
) -> None:
    c = with_intents(build(), sessions)
    f = c.run_until(c.publish(), "k8s_evict")
    asked_at = c.clock.now()
    while c.clock.now() - asked_at < timedelta(seconds=WAIT_S):
        f = c.step(f)
        assert f.step == "k8s_evict" and not by(kube_api, "POST", "/eviction")
        c.clock.advance(f.countdown)
    drive(c.engine, c.clock, [f])
    assert rem_for(sessions, "gpu-node-7").status == "succeeded"
    (eviction,) = by(kube_api, "POST", "/pods/trainer-0/eviction")
    assert eviction.status == 201 and len(by(kube_api, "PATCH", "/pods/trainer-0")) == 1
