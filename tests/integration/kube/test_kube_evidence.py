"""The evidence job on Kubernetes: one Job bound to the Node, against the local kube-apiserver, read back
through our client and kubectl.

The simulated kubelet runs the pod's command here, as a process (the test's ``jobs.outcome``), against
stand-in GPU tools; the step reads the items back from the pod's log, asking for as much as the job can
write, and takes the Job down.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from remediation.adapters.factory import validator_backend
from remediation.adapters.kube.adapter import make_kube
from remediation.adapters.memory import MemorySlurm, MemoryWorld
from remediation.domain.context import RemediationContext
from remediation.domain.outcomes import Adapters, Done, StepInput, StepSettings, Wait
from remediation.domain.step_records import EvidenceDetail
from remediation.evidence_collection.rules import EvidenceStatus
from remediation.evidence_collection.step import collect_evidence
from remediation.settings import Settings
from remediation.simulator.kube.api import KubeAPIServer
from tests.integration.kube.conftest import Run
from tests.integration.workerproc import wait_for

NODE = "gpu-node-2"
NS = "node-remediation-validation"
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
#: ``nvidia-smi -q`` of an 8-GPU node runs to hundreds of KiB: more than the GPU check's log ever is.
SMI = "#!/bin/sh\nfor i in $(seq 1 3000); do echo \"    GPU 00000000:3B:00.0 line $i: Retired Pages : 0\"; done\n"


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    (tmp_path / "nvidia-smi").write_text(SMI)
    (tmp_path / "journalctl").write_text("#!/bin/sh\necho 'kernel: NVRM: Xid (PCI:0000:3b:00): 79'\n")
    for name in ("nvidia-smi", "journalctl"):
        (tmp_path / name).chmod(0o755)
    return tmp_path


def inp(op: dict | None, now: datetime) -> StepInput:  # type: ignore[type-arg]
    return StepInput(remediation_id=9, node=NODE, cause="slurm FAIL: xid 79", ladder=0,
                     context=RemediationContext(fault_class="gpu-hardware", quarantine_reason="xid 79 (RMA)"),
                     key="r9:collect_evidence:1", attempt=1, started_at=T0, checks=0 if op is None else 1,
                     provider_op=op, detail={"nonce": "0123456789"}, source="slurm")


def ended(out: object) -> Done | None:
    return out if isinstance(out, Done) else None


def test_the_evidence_job_is_bound_to_the_node_and_its_whole_log_is_read_back(
    make_settings: Callable[..., Settings], kube_api: KubeAPIServer, kubectl: Run, tools: Path,
) -> None:
    settings = make_settings(kube={"mapping": "node"},
                             validation={"backend": "kubernetes", "poll_interval_s": 0.05, "kube_image": "dcgm:test"})
    kube_api.add_node(NODE)
    make_kube(settings).cordon(NODE, "remediation: xid 79")

    def run_here(node: str, argv: list[str]) -> tuple[int, str, float]:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                              env={"PATH": f"{tools}:/usr/bin:/bin"})
        return done.returncode, done.stdout, 0.05

    kube_api.jobs.outcome = run_here
    world = MemoryWorld(nodes=[NODE])
    world.set_slurm(NODE, state="IDLE", flags=["DRAIN"], reason="remediation: slurm FAIL: xid 79")
    ad = Adapters(MemorySlurm(world), make_kube(settings), None, validator_backend(settings))
    cfg = StepSettings.of(settings)
    started = collect_evidence(inp(None, T0), ad, cfg, now=T0)  # before a quarantine: no journal line
    assert isinstance(started, Wait) and started.provider_op is not None
    op = started.provider_op
    job = json.loads(kubectl("get", "job", "-n", NS, op["name"], "-o", "json").stdout)
    assert job["spec"]["template"]["spec"]["nodeName"] == NODE  # bound to the Node, nowhere else
    out = wait_for(lambda: ended(collect_evidence(inp(op, T0), ad, cfg, now=T0 + timedelta(seconds=1))), 20,
                   "the evidence Job to end")
    assert isinstance(out, Done) and isinstance(out.detail, EvidenceDetail), out
    got = {i.name: i for i in out.detail.items}
    assert got["nvidia-smi-q"].status is EvidenceStatus.COLLECTED
    assert got["nvidia-smi-q"].content.decode().count("Retired Pages") == 3000  # ~170 KiB, whole
    assert b"Xid (PCI:0000:3b:00): 79" in got["kernel-log"].content
    assert out.detail.journal is None
    assert kubectl("get", "jobs", "-n", NS, "-o", "name").stdout.strip() == ""  # taken down
