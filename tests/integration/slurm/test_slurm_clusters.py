"""One service, many clusters, on real Slurm: two slurmctld (22.05 and 26.05) whose nodes have the same
names, each with its own simulated kube-apiserver, served by ONE real worker process.

The worker (``remediation worker``, Celery with beat, real Redis and Postgres) reads a config file with a
``clusters:`` list of two entries, each with its own ``slurm`` (its slurm.conf and commands), ``kube``
(its apiserver) and ``machine`` (``slurm``: Slurm's own reboot) sections. One real Slurm watcher process
per cluster (``remediation watch slurm`` with ``REMEDIATION_CLUSTER__NAME``) publishes to that cluster's
stream. A researcher's ``scontrol update nodename=X state=fail reason="xid 79"`` starts everything.

Each cluster's ``RebootProgram`` restarts the node's slurmd as a fresh boot and logs it in its own
``log/reboot.log``; the test plays the kubelet of the rebooted node by giving its Node a new bootID in
that cluster's apiserver only. What reached each cluster is counted at its endpoints: the apiserver's
request log and the reboot log, and the node states slurmctld reports.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from sqlalchemy import create_engine, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from remediation.adapters.celery import SWEEP_TASK
from remediation.db.models import Control, Event, Remediation, RemediationStep
from remediation.db.queries import BREAKER, PAUSED
from remediation.simulator.kube.api import KubeAPIServer
from tests.conftest import REDIS_URL
from tests.integration.slurm.conftest import ROOT, SlurmCluster, start_cluster
from tests.integration.workerproc import Worker, celery_worker_argv, settled, spawn, wait_for, worker_env
from tests.pace import budget

pytestmark = pytest.mark.slurm

#: The two clusters: name -> Slurm release. Both have gpu-node-[0-3] (conftest NODES).
RELEASES = {"west": "22.05", "east": "26.05"}
#: The storm breaker under test: at least 3 nodes failed, and more than half the cluster's pool (3 of 4
#: trips it; the other cluster's single fault, 1 of 4, never does). Policy is the fleet's; each
#: cluster counts its own failures against its own pool and latches its own breaker.
POLICY = {"min_restart_gap_s": 0, "breaker_min_failures": 3, "breaker_max_fraction": 0.5,
          "breaker_window_s": 600}
#: Both above scontrol's own wait on a controller that does not answer (about 9 s): lease_s, so the
#: step that meets it still holds its lease when it records the pause; sweep_interval_s, because each
#: sweep probes the paused cluster (and waits that long) and beat queues one every interval whether or
#: not the last is done: sweeps queued faster than they end would fill the pool and starve the other
#: cluster's steps too. The default (30 s) is above it as well.
WORKFLOW = {"poll_interval_s": 0.3, "max_wait_s": 1.0, "lease_s": 30, "sweep_interval_s": 10,
            "backoff_base_s": 0.2, "drain_timeout_s": 120, "verify_timeout_s": 60}
FULL_RUN = ["slurm_drain", "k8s_cordon", "k8s_evict", "vm_restart", "verify", "return"]


@pytest.fixture(scope="module")
def slurms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SlurmCluster]]:
    """Both controllers side by side, each on its own leased ports, for this module."""
    with ExitStack() as stack:
        yield {name: stack.enter_context(contextmanager(start_cluster)(release, tmp_path_factory, 0))
               for name, release in RELEASES.items()}


@pytest.fixture
def clean(slurms: dict[str, SlurmCluster]) -> Iterator[dict[str, SlurmCluster]]:
    """Both clusters all-IDLE before and after the test."""
    for cluster in slurms.values():
        cluster.restore()
    yield slurms
    for cluster in slurms.values():
        cluster.restore()


class Kubelets:
    """The kubelets of both clusters' nodes: a node its cluster's RebootProgram rebooted (a line in that
    cluster's ``log/reboot.log``) comes back with a new bootID in that cluster's apiserver only."""

    def __init__(self, slurms: dict[str, SlurmCluster], apis: dict[str, KubeAPIServer]) -> None:
        self.logs = {name: c.dir / "log" / "reboot.log" for name, c in slurms.items()}
        self.apis = apis
        self.seen = {name: self._text(name) for name in slurms}  # reboots of earlier tests are not ours
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="kubelets", daemon=True)
        self.thread.start()

    def _text(self, name: str) -> str:
        log = self.logs[name]
        return log.read_text() if log.exists() else ""

    def reboots(self, name: str) -> list[str]:
        """The nodes cluster ``name``'s RebootProgram rebooted since this test began, in order."""
        return re.findall(r" reboot (\S+) ", self._text(name)[len(self.seen[name]):])

    def _run(self) -> None:
        bumped = {name: 0 for name in self.logs}
        while not self.stop.wait(0.1):
            for name in self.logs:
                done = self.reboots(name)
                for node in done[bumped[name]:]:
                    self.apis[name].bump_boot_id(node)
                bumped[name] = len(done)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


class ServiceWorker(Worker):
    """``remediation worker -B``: the one worker process, as an operator starts it."""

    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.log = tmp / "worker.log"
        argv = celery_worker_argv(concurrency=2)
        args = [sys.executable, "-m", "remediation.cli", "worker", *argv[argv.index("worker") + 3:],
                "-B", "-s", str(tmp / "beat")]
        self.proc = spawn(args, self.log, cwd=ROOT, env=env, start_new_session=True)


class Watcher:
    """``remediation watch slurm`` for one cluster (``REMEDIATION_CLUSTER__NAME``)."""

    def __init__(self, env: dict[str, str], name: str, tmp: Path) -> None:
        self.log = tmp / f"watcher-{name}.log"
        self.proc = spawn([sys.executable, "-m", "remediation.cli", "watch", "slurm"], self.log, cwd=ROOT,
                          env={**env, "REMEDIATION_CLUSTER__NAME": name})

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class Fleet:
    """The service over both clusters: one worker, a watcher and an apiserver per cluster, one database."""

    def __init__(self, slurms: dict[str, SlurmCluster], pg_url: str, prefix: str, tmp: Path) -> None:
        self.slurms, self.prefix, self.tmp = slurms, prefix, tmp
        self.db: Engine = create_engine(pg_url, poolclass=NullPool)
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.apis: dict[str, KubeAPIServer] = {}
        for name, cluster in slurms.items():
            api = KubeAPIServer(token=f"token-{name}")
            api.start()
            for node in cluster.nodes:
                api.add_node(node)
            self.apis[name] = api
        self.kubelets = Kubelets(slurms, self.apis)
        config = tmp / "remediation.yaml"
        config.write_text(yaml.safe_dump({"policy": POLICY, "workflow": WORKFLOW, "clusters": [
            {"name": name, "slurm": cluster.options_for("cli", poll_interval_s=0.2),
             "kube": {"backend": "kubernetes", "host": self.apis[name].url, "token": self.apis[name].token,
                      "ca_file": str(self.apis[name].ca_file), "mapping": "node"},
             "machine": {"backend": "slurm"}}
            for name, cluster in slurms.items()]}))
        env = worker_env(pg_url, REDIS_URL, prefix, tmp, REMEDIATION_CONFIG=str(config))
        # Every adapter section comes from the config file's clusters, none from the environment.
        env = {k: v for k, v in env.items()
               if not k.startswith(("REMEDIATION_SLURM__", "REMEDIATION_KUBE__", "REMEDIATION_MACHINE__",
                                    "REMEDIATION_MEMORY__", "REMEDIATION_WORKFLOW__", "REMEDIATION_POLICY__"))}
        self.worker = ServiceWorker(env, tmp)
        self.watchers = {name: Watcher(env, name, tmp) for name in slurms}

    def start(self) -> None:
        """Wait for the worker and for each watcher's first resync, in its own cluster's rows."""
        wait_for(self.worker.ready, 90, "the worker", self.worker)
        for name, cluster in self.slurms.items():
            wait_for(lambda n=name, c=cluster: self.inventory(n) == set(c.nodes), 60,  # type: ignore[misc]
                     f"{name}'s inventory", self.watchers[name])
        for api in self.apis.values():
            api.clear_requests()  # from here on, every request is the service's doing

    # ------------------------------------------------------------------ what the database says
    def inventory(self, cluster: str) -> set[str]:
        with Session(self.db) as s:
            return set(s.scalars(select(Event.node).where(Event.cluster == cluster, Event.kind == "inventory")))

    def rems(self) -> list[tuple[str, str, str]]:
        """Every remediation as (cluster, node, status), in the order opened."""
        with Session(self.db) as s:
            return [tuple(r) for r in s.execute(  # type: ignore[misc]
                select(Remediation.cluster, Remediation.node, Remediation.status).order_by(Remediation.id))]

    def rem(self, cluster: str, node: str) -> Remediation | None:
        with Session(self.db) as s:
            return s.scalar(select(Remediation).where(Remediation.cluster == cluster, Remediation.node == node)
                            .order_by(Remediation.id.desc()).limit(1))

    def status(self, cluster: str, node: str) -> str | None:
        rem = self.rem(cluster, node)
        return rem.status if rem is not None else None

    def steps(self, cluster: str, node: str) -> list[tuple[str, str, str]]:
        rem = self.rem(cluster, node)
        assert rem is not None, (cluster, node)
        with Session(self.db) as s:
            return [(r.step, r.status, r.outcome or r.error or "") for r in s.scalars(
                select(RemediationStep).where(RemediationStep.remediation_id == rem.id).order_by(RemediationStep.id))]

    def control(self, cluster: str, key: str) -> dict[str, Any]:
        with Session(self.db) as s:
            row = s.get(Control, (cluster, key))
            return dict(row.value) if row is not None else {}

    # ------------------------------------------------------------------ acting and waiting
    def fail(self, cluster: str, nodes: str) -> None:
        """A researcher marks ``nodes`` (a hostlist) FAIL with an Xid 79 in ``cluster``'s slurmctld."""
        self.slurms[cluster].scontrol("update", f"nodename={nodes}", "state=fail", "reason=xid 79")

    def wait_status(self, cluster: str, node: str, status: str, timeout: float = 120) -> None:
        try:
            wait_for(lambda: self.status(cluster, node) == status, timeout, f"{cluster}/{node} {status}", self.worker)
        except AssertionError as exc:
            seen = self.steps(cluster, node) if self.rem(cluster, node) else None
            raise AssertionError(f"{cluster}/{node}: {seen}; slurm: {self.slurms[cluster].nodes_now()}") from exc

    def settled(self) -> None:
        """The barrier before "nothing else happened": nothing queued or held, two more sweeps done."""
        settled([self.worker], self.redis, self.prefix)

    def had_their_chance(self, cluster: str, nodes: list[str], timeout: float = 60) -> None:
        """The barrier for held remediations (they never leave the broker idle): the workers acknowledged
        two more sweeps (each probes and sweeps both clusters), and each of ``cluster``'s remediations
        of ``nodes`` was claimed again (a new lease) and is still held."""
        def claimed() -> dict[str, Any]:
            return {n: (r.lease_until, r.next_run_at) if (r := self.rem(cluster, n)) else None for n in nodes}

        before, mark = claimed(), self.worker.acknowledged(SWEEP_TASK)
        wait_for(lambda: self.worker.acknowledged(SWEEP_TASK) >= mark + 2, timeout, "two more sweeps", self.worker)
        wait_for(lambda: all(now != before[n] for n, now in claimed().items()), timeout,
                 f"{cluster}'s held remediations to be claimed again", self.worker)

    def writes(self, cluster: str) -> list[tuple[str, str]]:
        """Every request that changed something at ``cluster``'s apiserver: (method, path)."""
        return [(r.method, r.path) for r in self.apis[cluster].requests if r.method != "GET"]

    def close(self) -> None:
        for watcher in self.watchers.values():
            watcher.stop()
        self.worker.kill()
        self.kubelets.close()
        for api in self.apis.values():
            api.stop()
        for key in self.redis.scan_iter(match=f"{self.prefix}*", count=1000):
            self.redis.delete(key)
        self.redis.close()
        self.db.dispose()


@pytest.fixture
def fleet(clean: dict[str, SlurmCluster], pg_url: str, tmp_path: Path) -> Iterator[Fleet]:
    service = Fleet(clean, pg_url, f"test-{uuid.uuid4().hex[:12]}", tmp_path)
    try:
        service.start()
        yield service
    finally:
        service.close()


def untouched(cluster: SlurmCluster, *nodes: str) -> dict[str, tuple[str, frozenset[str], str]]:
    """Those of ``nodes`` slurmctld does not show IDLE, without flags and without a reason."""
    now = cluster.nodes_now()
    return {n: now[n] for n in nodes if now[n] != ("IDLE", frozenset(), "")}


def test_the_same_node_failing_in_both_clusters_is_remediated_by_each_clusters_own_adapters(
    fleet: Fleet, slurms: dict[str, SlurmCluster]
) -> None:
    node = "gpu-node-1"
    started = time.monotonic()
    for name in RELEASES:
        fleet.fail(name, node)
    for name in RELEASES:
        fleet.wait_status(name, node, "succeeded")
    took = time.monotonic() - started
    fleet.settled()

    assert sorted(fleet.rems()) == [("east", node, "succeeded"), ("west", node, "succeeded")]
    for name, cluster in slurms.items():
        assert [s[:2] for s in fleet.steps(name, node)] == [(s, "done") for s in FULL_RUN], fleet.steps(name, node)
        assert fleet.kubelets.reboots(name) == [node]  # one reboot, by this cluster's own slurmctld
        state, flags, _ = cluster.nodes_now()[node]
        assert state == "IDLE" and not flags, (name, state, flags)  # resumed by the service
        assert untouched(cluster, *(n for n in cluster.nodes if n != node)) == {}
        writes = fleet.writes(name)
        assert writes and all(path.startswith(f"/api/v1/nodes/{node}") for _, path in writes), writes
    # Each apiserver saw exactly one remediation's writes (cordon, uncordon): none of the other cluster's.
    assert Counter(fleet.writes("west")) == Counter(fleet.writes("east"))
    for name in RELEASES:  # neither cluster's pause nor breaker was ever set
        assert fleet.control(name, PAUSED).get("paused") is not True and fleet.control(name, BREAKER) == {}
    print(f"\nboth clusters remediated in {took:.1f}s; writes per apiserver: {fleet.writes('west')}")


def test_slurmctld_unreachable_pauses_its_own_cluster_while_the_other_is_remediated(
    fleet: Fleet, slurms: dict[str, SlurmCluster]
) -> None:
    node, down = "gpu-node-2", slurms["west"]
    # West's remediation is held at its cordon (the apiserver keeps its answer) until west's slurmctld
    # is stopped: its next Slurm call then meets a controller that does not answer.
    hold = fleet.apis["west"].delay_next(1, 60, method="PATCH", path=f"/api/v1/nodes/{node}")
    fleet.fail("west", node)
    assert hold.held.wait(budget(60)), f"west's cordon never came: {fleet.rems()}\n{fleet.worker.output()[-3000:]}"
    down.scontrol("shutdown", "slurmctld")
    wait_for(lambda: down.scontrol("ping", check=False).returncode != 0, 30, "west's slurmctld to stop")
    try:
        hold.release.set()
        wait_for(lambda: fleet.control("west", PAUSED).get("paused") is True, 60, "west to pause", fleet.worker)
        wait_for(lambda: "paused" in ((r := fleet.rem("west", node)) and r.wait_reason or ""), 60,
                 "west's remediation to wait on the pause", fleet.worker)

        fleet.fail("east", node)  # the same name, in the cluster whose slurmctld answers
        fleet.wait_status("east", node, "succeeded")
        fleet.had_their_chance("west", [node])  # west's probe and its held remediation had their chance
        west_pause, west_rem = fleet.control("west", PAUSED), fleet.rem("west", node)
        east_steps = fleet.steps("east", node)
    finally:
        down.run("slurmctld", "-f", str(down.conf))  # slurmctld back, with its saved state
        wait_for(lambda: down.scontrol("ping", check=False).returncode == 0, 30, "west's slurmctld to answer")

    assert west_pause["paused"] is True and west_pause["by"] == "system" and west_pause["component"] == "slurm"
    assert "Unable to contact slurm controller" in west_pause["reason"], west_pause
    assert fleet.control("east", PAUSED).get("paused") is not True
    assert west_rem is not None and west_rem.status == "waiting", west_rem
    assert [s[:2] for s in east_steps] == [(s, "done") for s in FULL_RUN], east_steps
    assert fleet.kubelets.reboots("east") == [node] and fleet.kubelets.reboots("west") == []
    assert [p for _, p in fleet.writes("east")] and all(p.startswith(f"/api/v1/nodes/{node}")
                                                       for _, p in fleet.writes("east"))
    # Once west's slurmctld answers again, its probe lifts the pause and its remediation finishes.
    wait_for(lambda: fleet.control("west", PAUSED).get("paused") is False, 60, "west's pause lifted", fleet.worker)
    fleet.wait_status("west", node, "succeeded")
    assert fleet.kubelets.reboots("west") == [node]


def test_a_storm_latches_its_own_clusters_breaker_and_the_other_cluster_still_acts(
    fleet: Fleet, slurms: dict[str, SlurmCluster]
) -> None:
    storm, lone = "gpu-node-[0-2]", "gpu-node-3"
    fleet.fail("west", storm)  # 3 of west's 4 nodes at once
    wait_for(lambda: fleet.control("west", BREAKER).get("open") is True, 60, "west's breaker", fleet.worker)
    fleet.fail("east", lone)
    fleet.wait_status("east", lone, "succeeded")
    fleet.had_their_chance("west", ["gpu-node-0", "gpu-node-1", "gpu-node-2"])

    west = {n: fleet.rem("west", n) for n in ("gpu-node-0", "gpu-node-1", "gpu-node-2")}
    assert all(r is not None and r.status == "waiting" and "storm breaker open" in (r.wait_reason or "")
               for r in west.values()), {n: r and (r.step, r.status, r.wait_reason) for n, r in west.items()}
    assert fleet.control("west", BREAKER)["open"] is True
    assert fleet.control("east", BREAKER) == {}
    assert [s[:2] for s in fleet.steps("east", lone)] == [(s, "done") for s in FULL_RUN]
    assert fleet.kubelets.reboots("east") == [lone] and fleet.kubelets.reboots("west") == []
    assert all(p.startswith(f"/api/v1/nodes/{lone}") for _, p in fleet.writes("east")), fleet.writes("east")
    assert untouched(slurms["east"], "gpu-node-0", "gpu-node-1", "gpu-node-2") == {}
    assert untouched(slurms["west"], lone) == {}  # the storm's cluster: its healthy node is left alone
