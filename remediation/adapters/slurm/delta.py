"""Reading slurmctld's node table at the cost of what changed, not of the cluster's size.

:class:`DeltaReader` asks the change probe first, then the aggregated bad set (``sinfo -h -t ...``), then
``scontrol show node -o LIST`` for the nodes a line cannot describe (:attr:`DeltaReader.pending`), and
the whole table at resync. Unchanged nodes come back as the same objects, so the
watcher's diff skips them by identity. A bad state sinfo cannot filter on makes every poll a full read.

Why: docs/architecture.md#the-slurm-watcher-reads-what-changed
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from remediation.adapters.slurm.parse import (
    SINFO_LINE_FORMAT,
    NodeRecord,
    SinfoLine,
    SlurmFormatError,
    parse_scontrol_nodes,
    parse_sinfo_line,
)
from remediation.hostlist import HostlistError, compress, expand
from remediation.ports.errors import UnknownNode

log = logging.getLogger(__name__)

#: Our bad states -> the name ``sinfo -t`` filters them by.
SINFO_FILTER = {
    "DOWN": "down",
    "DRAIN": "drain",
    "DRAINED": "drain",
    "DRAINING": "drain",
    "FAIL": "fail",
    "FAILING": "fail",
    "NOT_RESPONDING": "no_respond",
}

Run = Callable[[list[str]], str]

#: Seconds the bad set must stay the same before polls go back to asking the probe first: slurmctld's
#: "changed since" has one-second resolution, so within a second of a change the probe cannot save a
#: read, only add one.
SETTLE_S = 1.0


class DeltaReader:
    """The full table once, then the bad set's changes; see the module docstring."""

    def __init__(
        self,
        run: Run,
        sinfo: str,
        scontrol: str,
        *, bad: Iterable[str],
        probe: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run, self.sinfo, self.scontrol, self.probe, self.clock = run, sinfo, scontrol, probe, clock
        self._active_until = 0.0  # clock time until which polls read the bad set without the probe
        wanted = {s.upper() for s in bad}
        unknown = sorted(wanted - SINFO_FILTER.keys())
        self.filter = ",".join(sorted({SINFO_FILTER[s] for s in wanted if s in SINFO_FILTER}))
        self.exact = not unknown
        if unknown:
            log.warning("sinfo cannot filter on %s: every poll reads the whole node table", ", ".join(unknown))
        self.latest: dict[str, NodeRecord] = {}
        self._bad_text: str | None = None
        self._bad: dict[str, SinfoLine] = {}  # node -> the bad-set line it was printed in
        self._pending: set[str] = set()  # nodes whose detail the next poll reads (see the module docstring)
        # What it cost, for metrics and tests: polls the probe answered alone, each kind of read, and
        # nodes taken from their bad-set line without a detail read.
        self.probe_skips = self.full_reads = self.delta_reads = self.detail_reads = self.from_lines = 0

    @property
    def pending(self) -> bool:
        """Some nodes' detail is still to be read: poll again now rather than after a whole interval."""
        return bool(self._pending)

    def snapshot(self) -> dict[str, NodeRecord]:
        """The whole table (resync)."""
        nodes = parse_scontrol_nodes(self.run([self.scontrol, "show", "node", "-o"]))
        self.full_reads += 1
        self.latest = nodes
        self._bad_text = None  # the next poll re-reads the bad set against this table
        self._pending.clear()
        return dict(nodes)

    def current(self) -> dict[str, NodeRecord]:
        """The latest status of every node, as last read (no read now)."""
        return dict(self.latest)

    def poll(self) -> dict[str, NodeRecord] | None:
        """The table as of now, reading only what changed since the last call; None when slurmctld
        says no node changed (the watcher then has nothing to diff)."""
        if not self.latest or not self.exact:
            return self.snapshot()
        if self._pending:
            # The previous poll's leftovers, read right after it. What changed since is left to the next
            # poll: the probe's own "changed since" time has not moved, so nothing is missed.
            names, self._pending = self._pending, set()
            self._refresh(names)
            return dict(self.latest)
        started = self.clock()
        if self.probe is not None and started >= self._active_until and not self.probe():
            self.probe_skips += 1  # slurmctld: no node changed since our last look
            return None
        text = self.run([self.sinfo, "-h", "-t", self.filter, "-O", SINFO_LINE_FORMAT])
        self.delta_reads += 1
        if text == self._bad_text:
            return dict(self.latest)
        if self._bad_text is not None:  # (None: the first read after a full one, no change seen)
            self._active_until = started + SETTLE_S
        bad = self._parse_bad_set(text)
        for name in bad.keys() | self._bad.keys():
            line = bad.get(name)
            if line == self._bad.get(name):
                continue
            known = self.latest.get(name)
            if line is None or known is None or line.reason_changed_at in (0, known.reason_changed_at):
                # Left the set, new to us, or a reason not stamped anew: its condition may be keyed by
                # slurmd's start time (a bare NOT_RESPONDING; on 24.11 a reason kept from before,
                # which the watcher cuts off), which only the detail read has.
                self._pending.add(name)
                continue
            status = line.record(name, known)
            if status != known:
                self.latest[name] = status
                self.from_lines += 1
        self._bad, self._bad_text = bad, text
        return dict(self.latest)

    def _refresh(self, names: set[str]) -> None:
        """Read these nodes in detail."""
        try:
            text = self.run([self.scontrol, "show", "node", "-o", compress(sorted(names))])
        except UnknownNode:
            self.snapshot()  # a node left Slurm while in the bad set: read everything once
            return
        except Exception:
            self._pending |= names  # not read: the next poll tries again
            raise
        self.detail_reads += 1
        fresh = parse_scontrol_nodes(text)
        for name in names:
            status = fresh.get(name)
            if status is not None and status != self.latest.get(name):
                self.latest[name] = status

    @staticmethod
    def _parse_bad_set(text: str) -> dict[str, SinfoLine]:
        out: dict[str, SinfoLine] = {}
        for line in text.splitlines():
            if not line.strip():
                continue
            parsed = parse_sinfo_line(line)
            try:
                names = expand(parsed.nodes)
            except HostlistError as exc:
                raise SlurmFormatError(f"sinfo printed a bad node list: {exc}") from None
            for name in names:
                out[name] = parsed  # a node in several partitions prints the same fields twice
        return out
