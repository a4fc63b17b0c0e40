"""Calls from several threads, merged into one: a group commit for commands that take a list.

Calls that arrive while one runs go out together next; a lone call goes out at once. A merged command's
failure about a node reruns each call alone; a system-scope or transient failure is every call's answer.

Why: docs/architecture.md#a-mass-failure-is-isolated-in-batches
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from remediation.ports.errors import RemediationError, Scope

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")


@dataclass
class _Call(Generic[K, R]):
    key: K
    settled: bool = False
    value: R | None = None
    error: BaseException | None = None


class Merger(Generic[K, R]):
    """``merger(key)`` answers what ``run([key, ...])[key]`` answers, with the keys of concurrent callers
    in one ``run``. ``run`` returns an answer for each key it was given, an exception being that key's
    caller's error (a missing key is a ``KeyError``), or raises for them all."""

    def __init__(self, run: Callable[[list[K]], Mapping[K, R | BaseException]], max_batch: int = 256) -> None:
        self.run = run
        self.max_batch = max_batch
        self.batches = 0  # runs made, merged or not (for tests and the benchmark's breakdown)
        self._cv = threading.Condition()
        self._queue: list[_Call[K, R]] = []
        self._busy = False

    def __call__(self, key: K) -> R:
        call: _Call[K, R] = _Call(key)
        with self._cv:
            self._queue.append(call)
            while not call.settled:
                if self._busy:
                    self._cv.wait()
                    continue
                self._busy = True
                batch = self._queue[: self.max_batch]
                del self._queue[: self.max_batch]
                self._cv.release()
                try:
                    self._settle(batch)
                finally:
                    self._cv.acquire()
                    self._busy = False
                    self._cv.notify_all()
        if call.error is not None:
            raise call.error
        return call.value  # type: ignore[return-value]  # settled without an error: an answer

    def _settle(self, batch: list[_Call[K, R]]) -> None:
        keys = list(dict.fromkeys(c.key for c in batch))
        try:
            self.batches += 1
            answers = self.run(keys)
        except RemediationError as exc:
            if len(keys) == 1 or exc.scope is not Scope.NODE:
                return self._answer(batch, {}, exc)
            for c in batch:  # about one of the nodes, maybe: each alone, so each gets its own answer
                self._answer([c], *self._alone(c.key))
            return None
        except BaseException as exc:  # a bug, or an error no one mapped: every caller sees it
            return self._answer(batch, {}, exc)
        self._answer(batch, answers, None)
        return None

    def _alone(self, key: K) -> tuple[Mapping[K, R | BaseException], BaseException | None]:
        try:
            self.batches += 1
            return self.run([key]), None
        except BaseException as exc:
            return {}, exc

    @staticmethod
    def _answer(
        batch: list[_Call[K, R]], answers: Mapping[K, R | BaseException], error: BaseException | None
    ) -> None:
        for c in batch:
            answer = answers[c.key] if error is None and c.key in answers else error or KeyError(c.key)
            if isinstance(answer, BaseException):
                c.error = answer
            else:
                c.value = answer
            c.settled = True
