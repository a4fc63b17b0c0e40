"""The Kubernetes watcher learns failure domains from Node labels, over the wire.

The local kube-apiserver (simulator/kube/api.py) serves GPU Nodes as GKE registers them, with the
``cloud.google.com/gce-topology-*`` labels, plus the NVLink clique label the NVIDIA GPU operator sets.
The real watcher (list+watch) publishes a DOMAINS event per Node with the configured label keys'
values, again when a label changes, and the real ingest keeps them in Postgres, where two nodes of one
clique failing together become one incident.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.bus import RedisEventBus
from remediation.clock import SystemClock
from remediation.db.models import Incident
from remediation.domain.events import EventKind, NodeEvent, Source
from remediation.incidents import service as incidents
from remediation.services.ingest import IngestRules, ingest
from remediation.settings import Settings
from remediation.simulator.kube.api import KubeAPIServer
from remediation.watchers.kube import watcher as kube_watcher
from remediation.watchers.runtime import Stopper
from tests.conftest import REDIS_URL
from tests.pace import within

CLIQUE = "nvidia.com/gpu.clique"
SUBBLOCK = "cloud.google.com/gce-topology-subblock"


def domain_events(client: redis.Redis, prefix: str) -> list[NodeEvent]:
    out = [NodeEvent.parse(fields[b"e"]) for _, fields in client.xrange(f"{prefix}:events:kube")]
    return [e for e in out if e.kind is EventKind.DOMAINS]


def wait_for(predicate: Callable[[], object], timeout: float = 5.0) -> object:
    deadline = within(timeout)
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"not within {timeout}s"
        time.sleep(0.02)
    return value


@pytest.fixture
def watcher(make_settings: Callable[..., Settings], redis_client: redis.Redis, redis_prefix: str,
            core: object) -> Iterator[Callable[[], None]]:
    settings = make_settings(
        broker={"key_prefix": redis_prefix, "redis_url": REDIS_URL},
        kube={"mapping": "node", "resync_interval_s": 60, "watch_timeout_s": 5, "leader_ttl_s": 2},
        incidents={"label_keys": [CLIQUE, SUBBLOCK], "min_fraction": 1.0},
    )
    stopper = Stopper(install=False)
    bus = RedisEventBus(redis_client, redis_prefix, kick=None)
    thread = threading.Thread(target=kube_watcher.run, args=(settings, stopper, bus), kwargs={"api": core},
                              daemon=True)
    yield thread.start
    stopper.stop()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_node_labels_become_domains_and_an_incident(
    kube_api: KubeAPIServer, watcher: Callable[[], None], redis_client: redis.Redis, redis_prefix: str,
    sessions: sessionmaker[Session],
) -> None:
    for name, clique in (("n1", "c0ffee.1"), ("n2", "c0ffee.1"), ("n3", "c0ffee.2")):
        kube_api.add_node(name, labels={CLIQUE: clique, SUBBLOCK: f"sb-{name}"})
    kube_api.add_node("n4", labels={SUBBLOCK: "sb-n4"})
    watcher()
    first = wait_for(lambda: len(e := domain_events(redis_client, redis_prefix)) == 4 and e)
    assert {e.node: e.domains for e in first} == {  # type: ignore[union-attr]
        "n1": {CLIQUE: "c0ffee.1", SUBBLOCK: "sb-n1"}, "n2": {CLIQUE: "c0ffee.1", SUBBLOCK: "sb-n2"},
        "n3": {CLIQUE: "c0ffee.2", SUBBLOCK: "sb-n3"}, "n4": {SUBBLOCK: "sb-n4"},
    }
    assert all(e.source is Source.KUBERNETES for e in first)  # type: ignore[union-attr]

    # Heartbeats change nothing; a relabel (the node moved to another clique) is published once. The
    # watch delivers n1's heartbeat before n3's relabel and the watcher handles them in order, so once
    # n3's event is out, n1's heartbeat has had its chance to publish something (it must not have).
    kube_api.set_condition("n1", "Ready", "True", message="heartbeat")
    kube_api.mutate_node("n3", lambda obj: obj["metadata"]["labels"].__setitem__(CLIQUE, "c0ffee.1"))
    events = wait_for(lambda: (e := domain_events(redis_client, redis_prefix))[-1].node == "n3" and e)
    assert [(e.node, e.domains) for e in events[4:]] == [  # type: ignore[index]
        ("n3", {CLIQUE: "c0ffee.1", SUBBLOCK: "sb-n3"})]

    # The ingest keeps the latest domains; two of n1..n3 failing is not all of clique c0ffee.1, three is.
    settings = Settings(incidents={"label_keys": [CLIQUE], "min_fraction": 1.0, "min_nodes": 10})
    clock = SystemClock()
    with sessions() as s, s.begin():
        ingest(s, [e.to_json() for e in events], settings.policy, clock=clock,
               rules=IngestRules(incidents=settings.incidents))  # type: ignore[union-attr]
        assert incidents.domains_of(s, ["n3"]) == {"n3": {CLIQUE: "c0ffee.1", SUBBLOCK: "sb-n3"}}
        for node in ("n1", "n2", "n3"):
            bad = NodeEvent(source=Source.KUBERNETES, node=node, kind=EventKind.UNHEALTHY, state="Ready=False",
                            reason=f"Node {node}: NVLink down", observed_at=datetime.now(UTC))
            ingest(s, [bad.to_json()], settings.policy, clock=clock,
                   rules=IngestRules(incidents=settings.incidents))
            found = s.scalars(select(Incident)).all()
            assert len(found) == (1 if node == "n3" else 0), node
        assert (found[0].kind, found[0].name, found[0].nodes) == (CLIQUE, "c0ffee.1", ["n1", "n2", "n3"])
