"""The ``cli`` backend with its per-node reads and drains merged across threads.

Calls that arrive while one command runs go out together in the next, as one command with a node list
(:mod:`remediation.adapters.merger`); a lone call goes out at once. Every answer is still per node.

Why: docs/architecture.md#a-mass-failure-is-isolated-in-batches
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from remediation.adapters.merger import Merger
from remediation.adapters.slurm.args import check_node_name
from remediation.adapters.slurm.cli import CliSlurm
from remediation.adapters.slurm.parse import NodeRecord
from remediation.ports.errors import RemediationError, Scope, UnknownNode
from remediation.settings import SlurmSettings

Drain = tuple[str, str]  # (node, reason)


class MergedSlurm(CliSlurm):
    def __init__(self, settings: SlurmSettings) -> None:
        super().__init__(settings)
        self._statuses: Merger[str, NodeRecord] = Merger(self._read)
        self._jobs: Merger[str, list[str]] = Merger(self.jobs_by_node)
        self._drains: Merger[Drain, None] = Merger(self._drain_all)

    def status(self, name: str) -> NodeRecord:
        check_node_name(name)
        return self._statuses(name)

    def jobs_on(self, name: str) -> list[str]:
        check_node_name(name)
        return self._jobs(name)

    def _set_drain(self, name: str, reason: str) -> None:  # CliSlurm.drain, once it knows one is needed
        self._drains((name, reason))

    def _read(self, names: list[str]) -> Mapping[str, NodeRecord | BaseException]:
        found = self.statuses(names)
        return {n: found[n] if n in found else UnknownNode(f"Slurm does not know node {n!r}") for n in names}

    def _drain_all(self, drains: list[Drain]) -> Mapping[Drain, None | BaseException]:
        """One ``scontrol update`` per reason; a group Slurm refuses is retried node by node."""
        by_reason: dict[str, list[str]] = defaultdict(list)
        for name, reason in drains:
            by_reason[reason].append(name)
        answers: dict[Drain, None | BaseException] = {}
        for reason, names in by_reason.items():
            try:
                self.update_many(names, "drain", reason)
                answers.update(((n, reason), None) for n in names)
            except RemediationError as exc:
                if exc.scope is not Scope.NODE:
                    raise
                answers.update(((n, reason), self._drain_alone(n, reason)) for n in names)
        return answers

    def _drain_alone(self, name: str, reason: str) -> None | BaseException:
        try:
            self.update_many([name], "drain", reason)
        except RemediationError as exc:
            return exc
        return None
