"""A profile selected by a Kubernetes Node label, over the wire.

The real watcher (list+watch against the local kube-apiserver, simulator/kube/api.py) publishes the
labels the profiles' selectors name, and the Ready=False condition of a Node; the real ingest keeps the
labels on the node and opens each remediation under the profile they select: the serving pool's in
shadow (dry-run, recorded as such), the training pool's acting. A relabel moves the next remediation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from remediation.adapters.bus import RedisEventBus
from remediation.clock import SystemClock
from remediation.db.models import Node, Remediation
from remediation.domain.events import EventKind, NodeEvent
from remediation.profiles.service import facts_of, governance
from remediation.services.ingest import IngestRules, ingest
from remediation.settings import Settings
from remediation.simulator.kube.api import KubeAPIServer
from remediation.watchers.kube import watcher as kube_watcher
from remediation.watchers.runtime import Stopper
from tests.conftest import REDIS_URL
from tests.pace import within

POOL = "example.com/pool"
PROFILES = [
    {"name": "serving", "select": {"labels": f"{POOL} in (serving),!canary"}, "mode": "shadow"},
    {"name": "training", "select": {"labels": f"{POOL}=training"}},
]


def published(client: redis.Redis, prefix: str) -> list[NodeEvent]:
    return [NodeEvent.parse(fields[b"e"]) for _, fields in client.xrange(f"{prefix}:events:kube")]


def wait_for(predicate: Callable[[], object], timeout: float = 10.0) -> object:
    deadline = within(timeout)
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"not within {timeout}s"
        time.sleep(0.02)
    return value


@pytest.fixture
def settings(make_settings: Callable[..., Settings], redis_prefix: str) -> Settings:
    return make_settings(
        broker={"key_prefix": redis_prefix, "redis_url": REDIS_URL},
        kube={
            "mapping": "node",
            "resync_interval_s": 60,
            "watch_timeout_s": 5,
            "leader_ttl_s": 2,
            "min_condition_s": 0,
        },
        profiles=PROFILES,
    )


@pytest.fixture
def watcher(
    settings: Settings, redis_client: redis.Redis, redis_prefix: str, core: object
) -> Iterator[Callable[[], None]]:
    stopper = Stopper(install=False)
    bus = RedisEventBus(redis_client, redis_prefix, kick=None)
    thread = threading.Thread(target=kube_watcher.run, args=(settings, stopper, bus), kwargs={"api": core},
                              daemon=True)
    yield thread.start
    stopper.stop()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_a_label_selected_profile_governs_its_pool(
    kube_api: KubeAPIServer,
    watcher: Callable[[], None],
    redis_client: redis.Redis,
    redis_prefix: str,
    sessions: sessionmaker[Session],
    settings: Settings,
) -> None:
    kube_api.add_node("n1", labels={POOL: "serving", "zone": "a"})
    kube_api.add_node("n2", labels={POOL: "training"})
    kube_api.add_node("n3", labels={POOL: "serving", "canary": ""})
    watcher()
    labels = wait_for(
        lambda: (
            len(e := [x for x in published(redis_client, redis_prefix) if x.kind is EventKind.LABELS]) == 3
            and e
        )
    )
    # Only the keys a selector names travel: the zone is nobody's business here.
    assert {e.node: e.labels for e in labels} == {  # type: ignore[union-attr]
        "n1": {POOL: "serving"},
        "n2": {POOL: "training"},
        "n3": {POOL: "serving", "canary": ""},
    }

    for node in ("n1", "n2", "n3"):
        kube_api.set_condition(node, "Ready", "False", message="GPU fell off the bus")
    faults = wait_for(
        lambda: (
            len(e := [x for x in published(redis_client, redis_prefix) if x.kind is EventKind.UNHEALTHY]) == 3
            and e
        )
    )
    clock = SystemClock()
    with sessions() as s, s.begin():
        events = [e.to_json() for e in labels + faults]  # type: ignore[operator]
        ingest(s, events, settings.policy, clock=clock, rules=IngestRules(incidents=settings.incidents,
            governance=governance(settings)))
        assert s.get(Node, ("default", "n1")).labels == {POOL: "serving"}
        rems = {r.node: r for r in s.scalars(select(Remediation))}
        assert (rems["n1"].profile, rems["n1"].dry_run) == ("serving", True)  # the shadow pool records only
        assert (rems["n2"].profile, rems["n2"].dry_run) == ("training", False)
        assert (rems["n3"].profile, rems["n3"].dry_run) == (None, False)  # a canary is not selected: the base

    # A relabel reaches the ingest as a new LABELS event and changes what governs the node.
    kube_api.mutate_node("n2", lambda obj: obj["metadata"]["labels"].__setitem__(POOL, "serving"))
    relabel = wait_for(
        lambda: [
            x
            for x in published(redis_client, redis_prefix)
            if x.kind is EventKind.LABELS and x.node == "n2" and x.labels == {POOL: "serving"}
        ]
    )
    with sessions() as s, s.begin():
        ingest(s, [e.to_json() for e in relabel], settings.policy, clock=clock,
               rules=IngestRules(governance=governance(settings)))  # type: ignore[union-attr]
        assert s.get(Node, ("default", "n2")).labels == {POOL: "serving"}
        found, _ = governance(settings).of(facts_of(s, ["n2"])["n2"])
        assert found.name == "serving"
