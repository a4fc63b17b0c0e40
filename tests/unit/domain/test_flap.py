"""FlapFilter: bad Node conditions are published only after they held, once, and their end too."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from remediation.clock import FakeClock
from remediation.domain.events import EventKind
from remediation.domain.flap import Condition, FlapFilter, parse_bad

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
BAD = ["Ready=False", "Ready=Unknown", "GpuXidError=True"]
HOLD = 30.0
U, H = EventKind.UNHEALTHY, EventKind.HEALTHY


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def conds(**spec: tuple[str, float | None]) -> list[Condition]:
    """conds(Ready=("False", 0)) -> Ready=False whose lastTransitionTime is T0+0s."""
    return [Condition(t, s, f"{t} is {s}", None if lt is None else at(lt)) for t, (s, lt) in spec.items()]


# Each step: (time in seconds, action, argument, expected [(kind, state)] returned by that step).
# action "obs" observes node n1's conditions; "due" asks what is due; "gone" forgets n1.
SCENARIOS: list[tuple[str, list[tuple[float, str, Any, list[tuple[EventKind, str]]]]]] = [
    (
        "not-ready-held-is-published-once",
        [
            (0, "obs", conds(Ready=("False", 0)), []),
            (29, "due", None, []),
            (30, "due", None, [(U, "Ready=False")]),
            (40, "obs", conds(Ready=("False", 0)), []),
            (90, "due", None, []),
        ],
    ),
    (
        "flap-shorter-than-hold-is-silent",
        [
            (0, "obs", conds(Ready=("False", 0)), []),
            (10, "obs", conds(Ready=("True", 10)), []),
            (12, "obs", conds(Ready=("False", 12)), []),
            (14, "obs", conds(Ready=("True", 14)), []),
            (120, "due", None, []),
        ],
    ),
    (
        "hold-restarts-after-a-flap",
        [
            (0, "obs", conds(Ready=("False", 0)), []),
            (10, "obs", conds(Ready=("True", 10)), []),
            (15, "obs", conds(Ready=("False", 15)), []),
            (40, "due", None, []),
            (45, "due", None, [(U, "Ready=False")]),
        ],
    ),
    (
        "recovery-after-publication-is-published",
        [
            (0, "obs", conds(Ready=("False", 0)), []),
            (30, "due", None, [(U, "Ready=False")]),
            (35, "obs", conds(Ready=("True", 35)), [(H, "Ready=True")]),
            (100, "due", None, []),
        ],
    ),
    (
        "false-then-unknown-is-one-episode",
        [
            (0, "obs", conds(Ready=("False", 0)), []),
            (20, "obs", conds(Ready=("Unknown", 20)), []),
            (30, "due", None, [(U, "Ready=Unknown")]),
        ],
    ),
    (
        "long-held-condition-seen-late-is-published-at-once",  # watcher restart, missed watch
        [(100, "obs", conds(Ready=("False", 0)), [(U, "Ready=False")])],
    ),
    (
        "transition-time-within-skew-does-not-shorten-the-hold",
        [
            (4, "obs", conds(Ready=("False", 0)), []),
            (30, "due", None, []),
            (34, "due", None, [(U, "Ready=False")]),
        ],
    ),
    (
        "problem-condition-and-its-removal",
        [
            (0, "obs", conds(Ready=("True", 0), GpuXidError=("True", 0)), []),
            (30, "due", None, [(U, "GpuXidError=True")]),
            (31, "obs", conds(Ready=("True", 0)), [(H, "GpuXidError=Absent")]),
        ],
    ),
    (
        "good-status-of-a-problem-type-is-not-bad",
        [(0, "obs", conds(GpuXidError=("False", 0)), []), (60, "due", None, [])],
    ),
    (
        "unconfigured-conditions-are-ignored",
        [(0, "obs", conds(MemoryPressure=("True", 0), Ready=("True", 0)), []), (60, "due", None, [])],
    ),
    (
        "missing-transition-time-counts-from-first-sighting",
        [
            (0, "obs", conds(Ready=("False", None)), []),
            (29, "due", None, []),
            (30, "due", None, [(U, "Ready=False")]),
        ],
    ),
    (
        "deleted-node-publishes-nothing",
        [(0, "obs", conds(Ready=("False", 0)), []), (10, "gone", None, []), (60, "due", None, [])],
    ),
]


@pytest.mark.parametrize("steps", [s for _, s in SCENARIOS], ids=[n for n, _ in SCENARIOS])
def test_scenarios(steps: list[tuple[float, str, Any, list[tuple[EventKind, str]]]]) -> None:
    clock = FakeClock(T0)
    flap = FlapFilter(BAD, HOLD, clock=clock.now, skew_s=5)
    for seconds, action, arg, expected in steps:
        clock.advance((at(seconds) - clock.now()).total_seconds())
        if action == "obs":
            got = flap.observe("n1", arg)
        elif action == "due":
            got = flap.due()
        else:
            flap.forget("n1")
            got = []
        assert [(c.kind, c.state) for c in got] == expected, f"at t={seconds}s ({action})"
        assert all(c.node == "n1" for c in got)


def test_dedupe_key_names_the_condition_instance_and_is_stable() -> None:
    clock = FakeClock(T0)
    flap = FlapFilter(BAD, HOLD, clock=clock.now)
    flap.observe("n1", conds(Ready=("False", 0)))
    clock.advance(HOLD)
    (change,) = flap.due()
    assert change.key == f"k8s:n1:Ready=False:{T0.isoformat()}"
    assert change.message == "Ready is False" and change.since == T0
    # A resync re-publishes the same instance with the same key; a new instance gets a new key.
    assert flap.published() == [change]
    flap.observe("n1", conds(Ready=("True", 40)))
    flap.observe("n1", conds(Ready=("False", 50)))
    clock.advance(HOLD + 60)
    (again,) = flap.due()
    assert again.key != change.key and again.key.endswith(at(50).isoformat())


def test_next_due_is_the_earliest_pending_deadline() -> None:
    clock = FakeClock(T0)
    flap = FlapFilter(BAD, HOLD, clock=clock.now)
    assert flap.next_due() is None
    flap.observe("a", conds(Ready=("False", None)))
    clock.advance(10)
    flap.observe("b", conds(Ready=("Unknown", None)))
    assert flap.next_due() == at(HOLD)
    clock.advance(HOLD - 10)
    assert [c.node for c in flap.due()] == ["a"]
    assert flap.next_due() == at(10 + HOLD)  # published episodes are no longer pending


def test_relist_observes_all_and_forgets_vanished_nodes() -> None:
    clock = FakeClock(T0)
    flap = FlapFilter(BAD, HOLD, clock=clock.now)
    flap.observe("gone", conds(Ready=("False", 0)))
    clock.advance(HOLD)
    changes = flap.relist({"a": conds(Ready=("False", -600)), "b": conds(Ready=("True", 0))})
    assert [(c.node, c.kind, c.state) for c in changes] == [("a", U, "Ready=False")]
    assert flap.due() == []  # "gone" was dropped by the relist, so its hold never completes
    assert [c.node for c in flap.published()] == ["a"]


def test_zero_hold_publishes_on_first_sight() -> None:
    flap = FlapFilter(BAD, 0, clock=lambda: T0)
    assert [c.state for c in flap.observe("n1", conds(Ready=("Unknown", 0)))] == ["Ready=Unknown"]


@pytest.mark.parametrize("bad", ["Ready", "=False", "Ready="], ids=["no-status", "no-type", "empty-status"])
def test_parse_bad_rejects_malformed_entries(bad: str) -> None:
    with pytest.raises(ValueError, match="Type=Status"):
        parse_bad([bad])


def test_parse_bad_groups_statuses_by_type() -> None:
    assert parse_bad(BAD) == {"Ready": frozenset({"False", "Unknown"}), "GpuXidError": frozenset({"True"})}


# ------------------------------------------------------ the watcher's side: a hold that ends healthy


class Bus:
    """The publisher's bus: records what Redis took; ``down`` refuses like an unreachable Redis."""

    def __init__(self) -> None:
        self.taken: list[Any] = []
        self.down = False

    def publish(self, events: Any) -> int:
        from remediation.adapters.bus import BusUnavailable

        if self.down:
            raise BusUnavailable("redis down")
        self.taken += list(events)
        return len(events)


class NoPods:
    """The pod LIST fails (API error): a due condition waits in the publisher for its Slurm names."""

    def list_namespaced_pod(self, *a: Any, **kw: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        raise ApiException(status=503, reason="unavailable")


def publisher(mapping: str, clock: FakeClock) -> tuple[Any, Bus]:
    from remediation.settings import load_settings
    from remediation.watchers.kube.publisher import Publisher

    bus = Bus()
    pub = Publisher(load_settings(kube={"mapping": mapping, "min_condition_s": HOLD}), bus, api=NoPods())  # type: ignore[arg-type]
    pub.flap = FlapFilter(BAD, HOLD, clock=clock.now)
    return pub, bus


def node(name: str, **spec: tuple[str, float | None]) -> dict[str, Any]:
    def stamp(lt: float | None) -> str | None:
        return None if lt is None else at(lt).isoformat().replace("+00:00", "Z")

    return {"metadata": {"name": name}, "status": {"conditions": [
        {"type": t, "status": s, "reason": "R", "lastTransitionTime": stamp(lt)} for t, (s, lt) in spec.items()
    ]}}


def test_hold_that_ends_healthy_publishes_nothing() -> None:
    """The flap filter itself: bad for less than the hold, then healthy: no edge, no end."""
    clock = FakeClock(T0)
    pub, bus = publisher("node", clock)
    pub.handle(("MODIFIED", node("n1", Ready=("Unknown", 0))))
    clock.advance(HOLD - 1)
    pub.flush()
    pub.handle(("MODIFIED", node("n1", Ready=("True", HOLD - 1))))
    clock.advance(HOLD * 4)
    pub.flush()
    assert bus.taken == [] and pub.outbox == [] and pub.pending == []


def test_held_edge_waiting_for_its_slurm_names_is_dropped_when_the_condition_ends() -> None:
    """A phantom fault: Ready=Unknown held, but the pod map could not be read; Ready=True
    came before it could be published. Neither goes out (they used to leave in one flush)."""
    clock = FakeClock(T0)
    pub, bus = publisher("pod", clock)
    pub.handle(("MODIFIED", node("n1", Ready=("Unknown", 0))))
    clock.advance(HOLD)
    pub.flush()
    assert [c.state for c, _ in pub.pending] == ["Ready=Unknown"] and bus.taken == []
    pub.handle(("MODIFIED", node("n1", Ready=("True", HOLD + 1))))
    pub.flush()
    assert pub.pending == [] and pub.outbox == [] and bus.taken == []


def test_held_edge_in_the_outbox_is_dropped_when_the_condition_ends_while_redis_is_down() -> None:
    clock = FakeClock(T0)
    pub, bus = publisher("node", clock)
    bus.down = True
    pub.handle(("MODIFIED", node("n1", Ready=("Unknown", 0), GpuXidError=("True", 0))))
    clock.advance(HOLD)
    pub.flush()
    assert sorted(e.state for e in pub.outbox) == ["GpuXidError=True", "Ready=Unknown"]
    pub.handle(("MODIFIED", node("n1", Ready=("True", HOLD + 1), GpuXidError=("True", 0))))
    bus.down = False
    pub.flush()
    assert [(e.kind, e.state) for e in bus.taken] == [(U, "GpuXidError=True")]  # still bad: published


def test_end_of_a_published_episode_is_published_with_its_times() -> None:
    clock = FakeClock(T0)
    pub, bus = publisher("node", clock)
    pub.handle(("MODIFIED", node("n1", Ready=("Unknown", 0))))
    clock.advance(HOLD)
    pub.flush()
    clock.advance(5)
    pub.handle(("MODIFIED", node("n1", Ready=("True", HOLD + 5))))
    pub.flush()
    bad, end = bus.taken
    assert (bad.kind, bad.state, bad.since, bad.observed_at) == (U, "Ready=Unknown", T0, at(HOLD))
    assert (end.kind, end.state, end.observed_at) == (H, "Ready=True", at(HOLD + 5))
