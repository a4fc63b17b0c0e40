"""Reading slurmctld's node table at the cost of what changed, not of the cluster's size.

At 10,000 nodes ``sinfo --json`` costs about 0.45 s of CPU and 200 MB per call: a watcher polling it
twice a second needs a whole core. Slurm offers cheaper reads, and the watcher only needs transitions of
the *bad* set (DOWN, DRAIN, FAIL, NOT_RESPONDING and their kin) plus an inventory now and then:

0. **Every poll, first:** slurmctld's own "changed since?" answer (:mod:`remediation.adapters.slurm.probe`,
   through libslurm when it can be loaded): on a quiet cluster nothing else runs.
1. **When the node table changed:** the bad set, aggregated by slurmctld's own grouping,
   ``sinfo -h -t down,drain,fail,no_respond -o '%N|%T|%E|%H|%u'``: one line per (state, reason, time,
   user) with a hostlist, a few lines even with hundreds of bad nodes. Identical text to the last poll
   means the bad set did not change: nothing else is read.
2. **When it changed:** ``scontrol show node -o LIST`` for just the nodes that entered, left or changed
   within the bad set (one call, a compressed hostlist), which gives the full detail the events carry
   (flags, reason, who set it and when, slurmd's start time).
3. **Every resync** (``slurm.resync_interval_s``, and on start): the whole table with ``scontrol show
   node -o``, a tenth of the CPU of ``sinfo --json`` and no JSON document in memory.

The reader keeps the latest status of every node and hands the watcher a copy in which unchanged nodes
are the *same objects* as before, so the watcher's diff skips them by identity. Both reads parse
``scontrol`` output, so a node read by either is equal to itself: no phantom transitions between them.

A configured bad state sinfo cannot filter on (``-t`` knows no such state) makes every poll a full read,
which is correct, only dearer; the watcher logs it once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from remediation.adapters.slurm.parse import NodeRecord, SlurmFormatError, parse_scontrol_nodes
from remediation.domain.hostlist import HostlistError, compress, expand
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
BAD_SET_FORMAT = "%N|%T|%E|%H|%u"

Run = Callable[[list[str]], str]


class DeltaReader:
    """The full table once, then the bad set's changes; see the module docstring."""

    def __init__(
        self, run: Run, sinfo: str, scontrol: str, bad: Iterable[str], probe: Callable[[], bool] | None = None
    ) -> None:
        self.run, self.sinfo, self.scontrol, self.probe = run, sinfo, scontrol, probe
        wanted = {s.upper() for s in bad}
        unknown = sorted(wanted - SINFO_FILTER.keys())
        self.filter = ",".join(sorted({SINFO_FILTER[s] for s in wanted if s in SINFO_FILTER}))
        self.exact = not unknown
        if unknown:
            log.warning("sinfo cannot filter on %s: every poll reads the whole node table", ", ".join(unknown))
        self.latest: dict[str, NodeRecord] = {}
        self._bad_text: str | None = None
        self._bad: dict[str, str] = {}  # node -> its line's "state|reason|time|user"
        # What it cost, for metrics and tests: polls the probe answered alone, and each kind of read.
        self.probe_skips = self.full_reads = self.delta_reads = self.detail_reads = 0

    def snapshot(self) -> dict[str, NodeRecord]:
        """The whole table (resync)."""
        nodes = parse_scontrol_nodes(self.run([self.scontrol, "show", "node", "-o"]))
        self.full_reads += 1
        self.latest = nodes
        self._bad_text = None  # the next poll re-reads the bad set against this table
        return dict(nodes)

    def current(self) -> dict[str, NodeRecord]:
        """The latest status of every node, as last read (no read now)."""
        return dict(self.latest)

    def poll(self) -> dict[str, NodeRecord] | None:
        """The table as of now, reading only what changed since the last call; None when slurmctld
        says no node changed (the watcher then has nothing to diff)."""
        if not self.latest or not self.exact:
            return self.snapshot()
        if self.probe is not None and not self.probe():
            self.probe_skips += 1  # slurmctld: no node changed since our last look
            return None
        text = self.run([self.sinfo, "-h", "-t", self.filter, "-o", BAD_SET_FORMAT])
        self.delta_reads += 1
        if text == self._bad_text:
            return dict(self.latest)
        bad = self._parse_bad_set(text)
        changed = (bad.keys() ^ self._bad.keys()) | {n for n, line in bad.items() if self._bad.get(n) != line}
        if changed:
            self._refresh(changed)
        self._bad, self._bad_text = bad, text
        return dict(self.latest)

    def _refresh(self, names: set[str]) -> None:
        try:
            text = self.run([self.scontrol, "show", "node", "-o", compress(sorted(names))])
        except UnknownNode:
            self.snapshot()  # a node left Slurm while in the bad set: read everything once
            return
        self.detail_reads += 1
        fresh = parse_scontrol_nodes(text)
        for name in names:
            status = fresh.get(name)
            if status is not None and status != self.latest.get(name):
                self.latest[name] = status

    @staticmethod
    def _parse_bad_set(text: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for line in text.splitlines():
            if not line.strip():
                continue
            nodes, sep, rest = line.partition("|")
            if not sep:
                raise SlurmFormatError(f"sinfo printed a line without fields: {line!r:.80}")
            try:
                names = expand(nodes)
            except HostlistError as exc:
                raise SlurmFormatError(f"sinfo printed a bad node list: {exc}") from None
            for name in names:
                out[name] = rest  # a node in several partitions prints the same fields twice
        return out
