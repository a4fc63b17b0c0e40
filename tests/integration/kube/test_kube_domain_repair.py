"""The domain ladder on Kubernetes: the local kube-apiserver, Nodes labelled with their NVLink clique, the
validation as Kubernetes Jobs, kubectl as the oracle.

Four Nodes carry ``nvidia.com/gpu.clique=<uuid>.1`` (one NVLink domain) and a fifth another clique. The
real Kubernetes watcher (list+watch, in a thread) publishes their DOMAINS facts and, once NVSentinel's
NVSwitch condition holds on one and its NVLink watch reports IMEX down on another, their UNHEALTHY
events; the real ingest reads them from the Redis stream into Postgres. The engine is driven look by
look as the worker's task does, with the real Kubernetes adapter and validator; Slurm (each Node runs
the slurmd of the same name) is :class:`MemorySlurm`:

- one domain repair opens and no tray has a remediation of its own;
- every Node is cordoned, the fabric restart runs as one Job per Node, and the domain check as ONE
  Indexed Job of 4 completions, one pod on each Node of the domain (``kubectl get jobs --watch``, ``pods --watch``);
- the check passing, every Node is uncordoned and every tray returned;
- the check failing on one Node (the simulator's per-Node outcome), with no chassis in the inventory
  (ladder fabric_restart, quarantine), the domain is quarantined and its Nodes stay cordoned.
"""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kubernetes import client
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.bus import RedisEventBus
from remediation.adapters.factory import validator_backend
from remediation.adapters.kube.adapter import make_kube
from remediation.adapters.memory import MemorySlurm, MemoryWorld
from remediation.clock import SystemClock
from remediation.db.models import AuditLog, DomainRepair, Node, NodeDomain, Remediation
from remediation.domain.events import EventKind, NodeEvent
from remediation.domain.outcomes import Adapters
from remediation.domain.statemachine import NodeStatus
from remediation.domain.states import AuditAction
from remediation.domain_repair.rules import DomainRepairStatus, DomainStep
from remediation.domain_repair.service import DomainRepairs
from remediation.services.ingest import IngestRules, ingest
from remediation.settings import Settings
from remediation.simulator.kube.api import KubeAPIServer
from remediation.watchers.kube import watcher as kube_watcher
from remediation.watchers.runtime import Stopper
from tests.conftest import REDIS_URL
from tests.integration.history import sessions  # noqa: F401  (the committed database's sessions)
from tests.integration.kube.conftest import KUBECTL, Run, kubectl_env
from tests.integration.workerproc import wait_for

CLIQUE = "nvidia.com/gpu.clique"
CLUSTER_UUID = "5f3c0e9a-7d21-4c4b-9e57-0c1d2e3f4a5b"  # the NVLink domain's cluster UUID, as GFD labels it
DOMAIN = ["gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3"]
OTHER = "gpu-node-4"  # another rack's tray: never drawn into the repair
NS = "node-remediation-validation"
INDEX = "batch.kubernetes.io/job-completion-index"
#: NVSentinel's conditions (docs/policy.md, "Causes"): a fatal NVSwitch error, and IMEX down under its
#: NVLink watch. Both are domain signals on a tray of a multi-node clique.
NVSWITCH = ("GpuNvswitchFatalWatch", "NVSwitch 0 fatal error: SXid 20034 (LTSSM fault), fabric manager stopped")
IMEX = ("GpuNvlinkWatch", "DCGM_FR_IMEX_UNHEALTHY: the IMEX daemon is not running")
#: The site's commands (validation.fabric_restart, validation.domain_checks): stand-ins the simulated
#: kubelet answers for by ``jobs.outcome``, told apart by their argv.
RESTART = ["nvidia-imex-ctl", "--restart"]
CHECK = ["all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "4"]
OURS = "remediation.gpu.io/cordoned-by"


class Seen:
    """What kubectl watched in the check namespace (``kubectl get jobs -w`` and ``kubectl get pods -w``,
    ``-o json``): every Job by name (its spec when first seen, its status when last seen), where each of
    their pods ran and which failed; and each Node's cordon while a Job ran (``kubectl get nodes``)."""

    def __init__(self, kubeconfig: Path, kubectl: Run) -> None:
        assert KUBECTL is not None
        self.kubectl = kubectl
        self.cordoned_during: dict[str, bool] = {}  # Node -> unschedulable while a Job ran
        self.out: dict[str, list[str]] = {"jobs": [], "pods": []}
        self.procs = [subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            [KUBECTL, "get", kind, "-n", NS, "--watch", "-o", "json"], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env=kubectl_env(kubeconfig)) for kind in self.out]
        self.pumps = [threading.Thread(target=self._pump, args=(proc, self.out[kind]), daemon=True)
                      for kind, proc in zip(self.out, self.procs, strict=True)]
        for pump in self.pumps:
            pump.start()

    @staticmethod
    def _pump(proc: subprocess.Popen[str], into: list[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            into.append(line)

    def look(self) -> None:
        """After each of the engine's looks: the Nodes' cordons, once the first Job is out."""
        if self.out["jobs"] and not self.cordoned_during:
            self.cordoned_during = nodes(self.kubectl)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
            proc.wait(timeout=10)
        for pump in self.pumps:  # each ends at its kubectl's end of output: only then is its pipe closed
            pump.join(timeout=60)
            assert not pump.is_alive()
        for proc in self.procs:
            assert proc.stdout is not None
            proc.stdout.close()

    def objects(self, kind: str) -> list[dict[str, Any]]:
        text, decoder, out, at = "".join(self.out[kind]), json.JSONDecoder(), [], 0
        while (at := _skip(text, at)) < len(text):
            obj, at = decoder.raw_decode(text, at)
            out.append(obj)
        return out

    @property
    def jobs(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for job in self.objects("jobs"):
            found.setdefault(job["metadata"]["name"], job)["status"] = job.get("status", {})
        return found

    @property
    def pods(self) -> dict[str, dict[int | None, str]]:
        """Job -> the index of each of its pods -> the Node it ran on."""
        found: dict[str, dict[int | None, str]] = {}
        for pod in self.objects("pods"):
            meta, node = pod["metadata"], pod["spec"].get("nodeName")
            if node:
                index = (meta.get("annotations") or {}).get(INDEX)
                found.setdefault(meta["labels"]["job-name"], {})[None if index is None else int(index)] = node
        return found

    @property
    def failed(self) -> set[tuple[str, str]]:
        """(Job, Node) of every pod seen Failed."""
        return {(p["metadata"]["labels"]["job-name"], p["spec"]["nodeName"]) for p in self.objects("pods")
                if (p.get("status") or {}).get("phase") == "Failed"}

    def kind(self, prefix: str) -> dict[str, dict[str, Any]]:
        return {name: job for name, job in self.jobs.items() if name.startswith(prefix)}


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


@pytest.fixture
def seen(kubeconfig: Path, kubectl: Run, kube_api: KubeAPIServer) -> Iterator[Seen]:
    watching = Seen(kubeconfig, kubectl)
    wait_for(lambda: {r.path.rsplit("/", 1)[-1] for r in kube_api.requests if r.query.get("watch") == "true"}
             >= {"jobs", "pods"}, 15, "kubectl's watches of the check namespace")
    yield watching
    watching.stop()


def nodes(kubectl: Run) -> dict[str, Any]:
    """Each Node's spec.unschedulable, as kubectl reads it."""
    out = json.loads(kubectl("get", "nodes", "-o", "json").stdout)
    return {n["metadata"]["name"]: n["spec"].get("unschedulable", False) for n in out["items"]}


@pytest.fixture
def cfg(make_settings: Callable[..., Settings], redis_prefix: str) -> Settings:
    """One configuration for the watcher, the ingest and the engine, as the shipped processes share one.
    The storm breaker admits a domain of 4 in this pool of 5 (a domain repair counts as all its trays;
    docs/policy.md, "The domain ladder"); the shipped 10% would hold it."""
    return make_settings(
        broker={"key_prefix": redis_prefix, "redis_url": REDIS_URL},
        kube={"mapping": "node", "min_condition_s": 0, "resync_interval_s": 60, "watch_timeout_s": 5,
              "leader_ttl_s": 2},
        incidents={"label_keys": [CLIQUE]},
        policy={"breaker_max_fraction": 1.0,
                "kube_conditions": [*Settings().policy.kube_conditions, f"{NVSWITCH[0]}=True", f"{IMEX[0]}=True"]},
        validation={"backend": "kubernetes", "poll_interval_s": 0.1, "kube_image": "nccl:test",
                    "fabric_restart": RESTART, "domain_checks": {"unknown": CHECK}},
    )


@pytest.fixture
def cluster(kube_api: KubeAPIServer) -> MemoryWorld:
    """The Nodes, labelled as GPU Feature Discovery labels them; Slurm's side of the same trays."""
    for node in DOMAIN:
        kube_api.add_node(node, labels={CLIQUE: f"{CLUSTER_UUID}.1"})
    kube_api.add_node(OTHER, labels={CLIQUE: f"{CLUSTER_UUID}.2"})
    return MemoryWorld(nodes=[*DOMAIN, OTHER])


@pytest.fixture
def watcher(cfg: Settings, redis_client: redis.Redis, redis_prefix: str,
            core: client.CoreV1Api) -> Iterator[None]:
    """The real Kubernetes watcher, publishing to this test's Redis stream."""
    stopper = Stopper(install=False)
    bus = RedisEventBus(redis_client, redis_prefix, kick=None)
    thread = threading.Thread(target=kube_watcher.run, args=(cfg, stopper, bus), kwargs={"api": core}, daemon=True)
    thread.start()
    yield
    stopper.stop()
    thread.join(timeout=60)  # a loaded machine: the watcher ends its current watch first
    assert not thread.is_alive()


class Stream:
    """The watcher's stream as the ingest task reads it: each batch once, in order."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client, self.key, self.last = client, f"{prefix}:events:kube", "-"

    def read(self, want: Callable[[list[NodeEvent]], bool], what: str) -> list[bytes]:
        got: list[bytes] = []

        def more() -> bool:
            start = self.last if self.last == "-" else f"({self.last}"
            for entry, fields in self.client.xrange(self.key, min=start):
                self.last = entry.decode()
                got.append(fields[b"e"])
            return want([NodeEvent.parse(p) for p in got])

        wait_for(more, 15, what)
        return got


def ingest_from(stream: Stream, cfg: Settings, sessions: sessionmaker[Session],  # noqa: F811
                want: Callable[[list[NodeEvent]], bool], what: str) -> list[int]:
    payloads = stream.read(want, what)
    with sessions() as s, s.begin():
        result = ingest(s, payloads, cfg.policy, clock=SystemClock(),
                        rules=IngestRules(incidents=cfg.incidents, gpu_reset=cfg.validation.runs_jobs))
    return result.repairs


def report(kube_api: KubeAPIServer, cfg: Settings, redis_client: redis.Redis, redis_prefix: str,
           sessions: sessionmaker[Session]) -> int:  # noqa: F811
    """The watcher's DOMAINS facts, then the two conditions it holds and publishes, through the real
    ingest; returns the one domain repair they opened."""
    stream = Stream(redis_client, redis_prefix)
    domains = lambda evs: {e.node for e in evs if e.kind is EventKind.DOMAINS} == {*DOMAIN, OTHER}  # noqa: E731
    assert ingest_from(stream, cfg, sessions, domains, "every Node's clique") == []
    with sessions() as s:
        rows = s.execute(select(NodeDomain.node, NodeDomain.source, NodeDomain.kind, NodeDomain.name)).all()
    assert sorted(rows) == sorted([(n, "kubernetes", CLIQUE, f"{CLUSTER_UUID}.1") for n in DOMAIN]
                                  + [(OTHER, "kubernetes", CLIQUE, f"{CLUSTER_UUID}.2")])
    kube_api.set_condition(DOMAIN[1], NVSWITCH[0], "True", reason="NVSwitchFatal", message=NVSWITCH[1])
    kube_api.set_condition(DOMAIN[2], IMEX[0], "True", reason="ImexUnhealthy", message=IMEX[1])
    bad = lambda evs: {e.node for e in evs if e.kind is EventKind.UNHEALTHY} == set(DOMAIN[1:3])  # noqa: E731
    (rid,) = ingest_from(stream, cfg, sessions, bad, "the two conditions")
    return rid


def engine(cfg: Settings, world: MemoryWorld, sessions: sessionmaker[Session]) -> DomainRepairs:  # noqa: F811
    adapters = Adapters(slurm=MemorySlurm(world), kube=make_kube(cfg), machine=None, validator=validator_backend(cfg))
    return DomainRepairs(sessions, adapters, cfg, clock=SystemClock(), worker=f"test-{uuid.uuid4().hex[:6]}")


def run_to_the_end(repairs: DomainRepairs, rid: int, seen: Seen) -> None:
    """Look at the repair as its task does until it closes (then kubectl's watches are stopped)."""

    def look() -> bool:
        closed = repairs.advance(rid) is None
        seen.look()
        return closed

    try:
        wait_for(look, 60, f"domain repair #{rid} to close")
    except AssertionError as exc:
        with repairs.sessions() as s:
            rep = s.get(DomainRepair, rid)
            where = rep and (rep.step, rep.wait_reason, [(r.step, r.status, r.outcome) for r in rep.steps])
        raise AssertionError(f"{exc}; it stands at {where}") from None
    finally:
        seen.stop()


def assert_the_jobs(seen: Seen, rid: int) -> None:
    """One fabric-restart Job bound to each Node, then one Indexed domain check over the four."""
    restarts, pods = seen.kind(f"nr-fab-d{rid}-"), seen.pods
    assert len(restarts) == 4, sorted(seen.jobs)
    for name, job in restarts.items():
        spec = job["spec"]
        assert "completionMode" not in spec and spec["template"]["spec"]["containers"][0]["command"] == RESTART
        assert list(pods[name].values()) == [spec["template"]["spec"]["nodeName"]]
    assert sorted(spec["template"]["spec"]["nodeName"] for spec in (j["spec"] for j in restarts.values())) == DOMAIN
    (check,) = seen.kind(f"nr-dom-d{rid}-").items()
    name, job = check
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 4, 4)
    assert spec["template"]["spec"]["containers"][0]["command"] == CHECK
    assert "nodeName" not in spec["template"]["spec"]  # placed by affinity to the domain's Nodes
    assert sorted(pods[name]) == [0, 1, 2, 3] and sorted(pods[name].values()) == DOMAIN  # one per Node
    assert seen.cordoned_during == {**dict.fromkeys(DOMAIN, True), OTHER: False}


def test_an_nvswitch_and_an_imex_condition_are_one_repair_that_returns_the_clique(
    kube_api: KubeAPIServer, cluster: MemoryWorld, cfg: Settings, watcher: None, kubectl: Run, seen: Seen,
    redis_client: redis.Redis, redis_prefix: str, sessions: sessionmaker[Session],  # noqa: F811
) -> None:
    kube_api.jobs.outcome = lambda node, argv: (0, f"{argv[0]} on {node}\n", 0.3)
    rid = report(kube_api, cfg, redis_client, redis_prefix, sessions)
    run_to_the_end(engine(cfg, cluster, sessions), rid, seen)
    with sessions() as s:
        rep = s.get(DomainRepair, rid)
        assert rep is not None and rep.status is DomainRepairStatus.RETURNED, rep and rep.close_reason
        assert (rep.kind, rep.name, rep.trays, rep.reporters) == (CLIQUE, f"{CLUSTER_UUID}.1", DOMAIN, DOMAIN[1:3])
        assert rep.rungs == [DomainStep.FABRIC_RESTART, DomainStep.QUARANTINE]  # no chassis: no power cycle
        assert [(r.step, r.status.value) for r in rep.steps] == [
            (DomainStep.DRAIN, "done"), (DomainStep.JOBS, "done"), (DomainStep.FABRIC_RESTART, "done"),
            (DomainStep.DOMAIN_CHECK, "done"), (DomainStep.RETURN, "done")]
        assert s.scalars(select(Remediation)).all() == []  # no tray has a remediation of its own
        statuses = dict(s.execute(select(Node.name, Node.status)).all())
        assert statuses == {**dict.fromkeys(DOMAIN, NodeStatus.HEALTHY), OTHER: statuses[OTHER]}
        assert statuses[OTHER] is not NodeStatus.REMEDIATING
    assert_the_jobs(seen, rid)
    assert nodes(kubectl) == dict.fromkeys([*DOMAIN, OTHER], False)  # every cordon given back
    assert all(OURS not in (kube_api.node(n)["metadata"].get("annotations") or {}) for n in DOMAIN)
    assert kubectl("get", "jobs", "-n", NS, "-o", "name").stdout.strip() == ""  # each step deleted its Jobs
    assert [cluster.node(n)["slurm"]["flags"] for n in DOMAIN] == [[]] * 4  # resumed in Slurm


def test_a_failing_domain_check_quarantines_the_clique_and_its_nodes_stay_cordoned(
    kube_api: KubeAPIServer, cluster: MemoryWorld, cfg: Settings, watcher: None, kubectl: Run, seen: Seen,
    redis_client: redis.Redis, redis_prefix: str, sessions: sessionmaker[Session],  # noqa: F811
) -> None:
    """gpu-node-2's rank of the domain check fails (its NVLink is broken); the restarts pass."""
    kube_api.jobs.outcome = lambda node, argv: (
        (1, "#  Out of bounds values : 12 FAILED\n", 0.3) if argv == CHECK and node == DOMAIN[2]
        else (0, f"{argv[0]} on {node}\n", 0.3))
    rid = report(kube_api, cfg, redis_client, redis_prefix, sessions)
    run_to_the_end(engine(cfg, cluster, sessions), rid, seen)
    with sessions() as s:
        rep = s.get(DomainRepair, rid)
        assert rep is not None and rep.status is DomainRepairStatus.QUARANTINED, rep and rep.close_reason
        assert [(r.step, r.status.value) for r in rep.steps] == [
            (DomainStep.DRAIN, "done"), (DomainStep.JOBS, "done"), (DomainStep.FABRIC_RESTART, "done"),
            (DomainStep.DOMAIN_CHECK, "failed"), (DomainStep.QUARANTINE, "done")]
        assert s.scalars(select(Remediation)).all() == []
        (check_row,) = [r for r in rep.steps if r.step is DomainStep.DOMAIN_CHECK]
        assert f"(index 2 on {DOMAIN[2]}) exit 1" in (check_row.outcome or "")
        (page,) = s.scalars(select(AuditLog).where(AuditLog.action == AuditAction.DOMAIN_REPAIR_QUARANTINED)).all()
        assert page.target == f"{CLIQUE}/{CLUSTER_UUID}.1"
        assert "tried: fabric_restart" in (page.reason or "") and "gpu-node-[0-3]" in (page.reason or "")
        statuses = dict(s.execute(select(Node.name, Node.status).where(Node.name.in_(DOMAIN))).all())
        assert statuses == dict.fromkeys(DOMAIN, NodeStatus.QUARANTINED)
    assert_the_jobs(seen, rid)
    (check,) = seen.kind(f"nr-dom-d{rid}-")
    assert seen.failed == {(check, DOMAIN[2])}  # the one rank that failed, and only the check's
    assert nodes(kubectl) == {**dict.fromkeys(DOMAIN, True), OTHER: False}  # held: our cordons stay
    assert all(kube_api.node(n)["metadata"]["annotations"][OURS] for n in DOMAIN)
    for n in DOMAIN:
        assert cluster.node(n)["slurm"]["reason"].startswith(
            f"remediation: quarantined: NVLink domain {CLIQUE} {CLUSTER_UUID}.1")
