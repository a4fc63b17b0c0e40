"""The delta reader reads only what changed: a fake Slurm answers the same commands the real one gets."""

from __future__ import annotations

import pytest

from remediation.adapters.slurm.delta import DeltaReader
from remediation.adapters.slurm.parse import SINFO_LINE_FORMAT, parse_scontrol_line
from remediation.hostlist import compress, expand
from remediation.ports.errors import TransientError

BAD = frozenset({"DOWN", "DRAIN", "FAIL", "NOT_RESPONDING"})


class FakeSlurm:
    """scontrol show node -o [LIST] and sinfo -t ... -o ..., from a table of nodes."""

    def __init__(self, n: int) -> None:
        self.nodes = {f"gpu-node-{i}": ("IDLE", "", "") for i in range(n)}
        self.calls: list[list[str]] = []

    def line(self, name: str) -> str:
        state, reason, when = self.nodes[name]
        tail = f" Reason={reason} [root@{when}]" if reason else ""
        return f"NodeName={name} Arch=x86_64 State={state} SlurmdStartTime=2026-11-20T10:00:00{tail}"

    def run(self, argv: list[str]) -> str:
        self.calls.append(argv)
        if argv[0] == "scontrol":
            names = expand(argv[4]) if len(argv) > 4 else list(self.nodes)
            return "".join(self.line(n) + "\n" for n in names)
        # What sinfo prints for a node with no reason: "none", no time, no user.
        groups: dict[str, list[str]] = {}
        for name, (state, reason, when) in self.nodes.items():
            if state != "IDLE":
                fields = f"{reason}|{when}|root|" if reason else "none|Unknown|Unk|"
                groups.setdefault(f"{state.lower()}|{fields}", []).append(name)
        return "".join(f"{compress(names)}|{rest}\n" for rest, names in sorted(groups.items()))


def reader(fake: FakeSlurm, bad: frozenset[str] = BAD) -> DeltaReader:
    return DeltaReader(fake.run, "sinfo", "scontrol", bad=bad)


def test_a_quiet_cluster_costs_one_bad_set_read_per_poll() -> None:
    fake = FakeSlurm(1000)
    r = reader(fake)
    first = r.snapshot()
    fake.calls.clear()
    for _ in range(5):
        again = r.poll()
        assert all(again[n] is first[n] for n in first)  # unchanged nodes are the same objects
    assert [c[0] for c in fake.calls] == ["sinfo"] * 5
    assert fake.calls[0] == ["sinfo", "-h", "-t", "down,drain,fail,no_respond", "-O", SINFO_LINE_FORMAT]


def test_a_new_fault_is_taken_from_its_line_and_a_recovery_read_in_detail_right_after() -> None:
    fake = FakeSlurm(1000)
    r = reader(fake)
    first = r.snapshot()
    fake.nodes["gpu-node-7"] = ("IDLE+DRAIN", "xid 79", "2026-11-23T08:00:00")
    fake.nodes["gpu-node-8"] = ("IDLE+DRAIN", "xid 79", "2026-11-23T08:00:00")
    fake.calls.clear()
    now = r.poll()
    assert [c[0] for c in fake.calls] == ["sinfo"] and r.from_lines == 2 and not r.pending
    # Exactly what scontrol would say of it: a later detail read or resync sees no transition.
    assert now["gpu-node-7"] == parse_scontrol_line(fake.line("gpu-node-7"))
    assert now["gpu-node-7"].flags == {"DRAIN"} and now["gpu-node-7"].reason == "xid 79"
    assert sum(now[n] is not first[n] for n in first) == 2
    # Within the bad set a new reason is taken from its line too; a recovery (leaving the set) is read
    # in detail by the poll right after, and until then the node keeps its last status.
    fake.nodes["gpu-node-7"] = ("DOWN+DRAIN", "gone", "2026-11-23T08:05:00")
    fake.nodes["gpu-node-8"] = ("IDLE", "", "")
    fake.calls.clear()
    now = r.poll()
    assert [c[0] for c in fake.calls] == ["sinfo"]
    assert now["gpu-node-7"].state == "DOWN" and now["gpu-node-7"].reason == "gone"
    assert now["gpu-node-8"].flags == {"DRAIN"} and r.pending
    fake.calls.clear()
    now = r.poll()
    assert fake.calls == [["scontrol", "show", "node", "-o", "gpu-node-8"]] and not r.pending
    assert now["gpu-node-8"] == parse_scontrol_line(fake.line("gpu-node-8")) and now["gpu-node-8"].flags == frozenset()


def test_a_line_without_a_fresh_reason_time_is_read_in_detail() -> None:
    """A bare NOT_RESPONDING has no reason time (its condition is keyed by slurmd's start time, which
    sinfo cannot print); a reason stamped when the node was healthy (24.11 keeps it) may be cut off by
    the watcher, leaving the same key. Both wait for scontrol."""
    fake = FakeSlurm(20)
    fake.nodes["gpu-node-2"] = ("IDLE", "old", "2026-11-20T08:00:00")  # healthy, with a kept reason
    r = reader(fake)
    r.snapshot()
    fake.nodes["gpu-node-1"] = ("IDLE+NOT_RESPONDING", "", "")
    fake.nodes["gpu-node-2"] = ("IDLE+NOT_RESPONDING", "old", "2026-11-20T08:00:00")
    fake.calls.clear()
    now = r.poll()
    assert [c[0] for c in fake.calls] == ["sinfo"] and r.from_lines == 0 and r.pending
    assert "NOT_RESPONDING" not in now["gpu-node-1"].flags  # not yet: no half-known record
    now = r.poll()
    assert fake.calls[-1] == ["scontrol", "show", "node", "-o", "gpu-node-[1-2]"]
    assert now["gpu-node-1"] == parse_scontrol_line(fake.line("gpu-node-1"))
    assert now["gpu-node-1"].slurmd_start_time > 0 and now["gpu-node-1"].reason == ""


def test_a_failed_detail_read_is_tried_again() -> None:
    fake = FakeSlurm(10)
    r = reader(fake)
    r.snapshot()
    fake.nodes["gpu-node-4"] = ("IDLE+NOT_RESPONDING", "", "")
    r.poll()

    def down(argv: list[str]) -> str:
        raise TransientError("scontrol show: timed out")

    real, r.run = r.run, down
    with pytest.raises(TransientError):
        r.poll()
    assert r.pending
    r.run = real
    assert "NOT_RESPONDING" in r.poll()["gpu-node-4"].flags and not r.pending


def test_a_reason_may_hold_the_separator() -> None:
    fake = FakeSlurm(10)
    r = reader(fake)
    r.snapshot()
    fake.nodes["gpu-node-3"] = ("DOWN", "xid|79 | ecc", "2026-11-23T08:00:00")
    now = r.poll()
    assert now["gpu-node-3"].reason == "xid|79 | ecc" and r.from_lines == 1
    assert now["gpu-node-3"] == parse_scontrol_line(fake.line("gpu-node-3"))


def test_a_state_sinfo_cannot_filter_on_reads_everything() -> None:
    fake = FakeSlurm(10)
    r = reader(fake, BAD | {"MAINT"})
    r.snapshot()
    fake.calls.clear()
    r.poll()
    assert fake.calls == [["scontrol", "show", "node", "-o"]]


def test_no_snapshot_yet_means_a_full_read() -> None:
    fake = FakeSlurm(3)
    assert set(reader(fake).poll()) == {"gpu-node-0", "gpu-node-1", "gpu-node-2"}
    assert fake.calls == [["scontrol", "show", "node", "-o"]]


def test_a_probe_that_says_unchanged_spares_every_command() -> None:
    fake = FakeSlurm(100)
    answers = iter([False, False, True])
    r = DeltaReader(fake.run, "sinfo", "scontrol", bad=BAD, probe=lambda: next(answers))
    first = r.snapshot()
    fake.calls.clear()
    fake.nodes["gpu-node-3"] = ("DOWN", "Not responding", "2026-11-23T08:00:00")
    assert r.poll() is None and r.poll() is None  # "nothing changed", as slurmrestd's 304 says it
    assert fake.calls == [] and r.probe_skips == 2  # slurmctld said nothing changed: nothing was run
    assert r.current()["gpu-node-3"] is first["gpu-node-3"]
    assert r.poll()["gpu-node-3"].state == "DOWN"  # it did change: the bad set is read, its line tells
    assert [c[0] for c in fake.calls] == ["sinfo"]


def test_the_pace_stretches_dear_polls_to_the_cpu_budget_and_no_further() -> None:
    from remediation.watchers.slurm.watcher import Pace

    pace = Pace(0.25, 0.2)
    clock = [0.0]
    pace._cpu = lambda: clock[0]  # type: ignore[method-assign]

    def poll(cost: float) -> float:
        pace.start()
        clock[0] += cost
        return pace.interval()

    assert poll(0.0005) == 0.25  # a probe-only poll: the base interval
    busy = [poll(0.09) for _ in range(12)]  # 90 ms per poll while many nodes change
    assert busy == sorted(busy) and 0.44 < busy[-1] <= 0.45  # 90 ms at 20% of a core: 0.45 s
    assert poll(5.0) == 8 * 0.25  # never slower than 8x the base
    assert [poll(0.0005) for _ in range(15)][-1] == 0.25  # quiet again: back to the base


def test_sinfo_lines_parse_as_scontrol_would_and_refuse_what_is_not_one() -> None:
    from remediation.adapters.slurm.parse import SlurmFormatError, parse_sinfo_line

    line = parse_sinfo_line("gpu-node-[1-2]|down+cloud+drain+powered_down|dead|2026-11-23T08:00:00|root|\n")
    assert (line.nodes, line.state, line.flags) == ("gpu-node-[1-2]", "DOWN", {"CLOUD", "DRAIN", "POWERED_DOWN"})
    assert line.reason_user == "root" and line.reason_changed_at > 0
    bare = parse_sinfo_line("gpu-node-1|idle+not_responding|none|Unknown|Unk|")
    assert bare.reason_changed_at == 0 and bare.reason_user is None
    # A time printed in another format (SLURM_TIME_FORMAT) is no time: the reader asks scontrol.
    assert parse_sinfo_line("gpu-node-1|idle+drain|x|Nov 23 08:00|root|").reason_changed_at == 0
    with pytest.raises(SlurmFormatError):
        parse_sinfo_line("gpu-node-1|idle+drain|x")
    with pytest.raises(SlurmFormatError):
        parse_sinfo_line("gpu-node-1||x|Unknown|Unk|")


def test_while_the_bad_set_changes_the_probe_is_skipped_and_asked_again_once_it_settles() -> None:
    """slurmctld's "changed since" has one-second resolution: right after a change it says "changed"
    and loads the whole table, for nothing. Until the bad set has stayed the same for SETTLE_S the reader
    goes straight to sinfo; then it asks the probe again, which answers for everything since it last did."""
    from remediation.adapters.slurm.delta import SETTLE_S

    fake = FakeSlurm(50)
    now = [100.0]
    asked: list[bool] = []
    answers = iter([True, True, True, False])

    def probe() -> bool:
        asked.append(True)
        return next(answers)

    r = DeltaReader(fake.run, "sinfo", "scontrol", bad=BAD, probe=probe, clock=lambda: now[0])
    r.snapshot()
    r.poll()  # the first read of the bad set after a full read: nothing changed, nothing skipped after
    fake.nodes["gpu-node-1"] = ("IDLE+DRAIN", "one", "2026-11-23T08:00:00")
    now[0] += 0.25
    assert "DRAIN" in r.poll()["gpu-node-1"].flags and len(asked) == 2  # probe: changed; bad set read
    fake.calls.clear()
    now[0] += 0.25
    fake.nodes["gpu-node-2"] = ("IDLE+DRAIN", "two", "2026-11-23T08:00:01")
    assert "DRAIN" in r.poll()["gpu-node-2"].flags and len(asked) == 2  # no probe: straight to sinfo
    now[0] += SETTLE_S - 0.1
    r.poll()
    assert len(asked) == 2 and [c[0] for c in fake.calls] == ["sinfo", "sinfo"]
    now[0] += 0.2  # settled: the probe first again
    assert r.poll() is not None and len(asked) == 3  # its first answer is "changed" (since its last look)...
    now[0] += 0.25
    assert r.poll() is None and len(asked) == 4  # ...then quiet polls cost the probe alone
