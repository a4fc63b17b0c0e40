"""Merged calls (remediation.adapters.merger): concurrent callers share one run, each gets its own answer."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from remediation.adapters.merger import Merger
from remediation.ports.errors import ControllerUnreachable, RemediationError, UnknownNode


class Gate:
    """A run that holds its first call until ``release``, recording every batch of keys it got."""

    def __init__(self, answer: object = None) -> None:
        self.batches: list[list[str]] = []
        self.first = threading.Event()
        self.release = threading.Event()

    def __call__(self, keys: list[str]) -> dict[str, object]:
        self.batches.append(list(keys))
        if len(self.batches) == 1:
            self.first.set()
            assert self.release.wait(10)
        return {k: k.upper() for k in keys if k != "ghost"}


def held_then_queued(
    merger: Merger[str, object], held: threading.Event, release: threading.Event, keys: list[str]
) -> list[object]:
    """``keys[0]`` runs alone and is held; the rest queue behind it (a barrier: each is waiting), then
    all are let go. Returns each key's answer or error."""
    pool = ThreadPoolExecutor(len(keys))

    def ask(key: str) -> object:
        try:
            return merger(key)
        except (RemediationError, KeyError) as exc:
            return exc

    first = pool.submit(ask, keys[0])
    assert held.wait(10)
    rest = [pool.submit(ask, k) for k in keys[1:]]
    while len(merger._queue) < len(keys) - 1:  # every other caller is queued behind the held run
        threading.Event().wait(0.005)
    release.set()
    answers = [first.result(10), *(f.result(10) for f in rest)]
    pool.shutdown()
    return answers


def test_callers_that_wait_go_out_together_and_each_gets_its_answer() -> None:
    gate = Gate()
    merger: Merger[str, object] = Merger(gate)
    answers = held_then_queued(merger, gate.first, gate.release, ["a", "b", "c", "ghost", "b"])
    assert gate.batches == [["a"], ["b", "c", "ghost"]]  # the same key asked twice goes once
    assert answers[:3] == ["A", "B", "C"] and answers[4] == "B"
    assert isinstance(answers[3], KeyError)


def test_a_lone_call_runs_at_once_alone() -> None:
    seen: list[list[str]] = []
    merger: Merger[str, str] = Merger(lambda keys: (seen.append(keys), {k: k for k in keys})[1])
    assert merger("x") == "x" and merger("y") == "y"
    assert seen == [["x"], ["y"]]


def held_run(
    fail: Callable[[list[str]], None],
) -> tuple[Callable[[list[str]], dict[str, object]], list[list[str]], threading.Event, threading.Event]:
    """A run whose first call is held until released; later calls go through ``fail`` first."""
    batches: list[list[str]] = []
    held, release = threading.Event(), threading.Event()

    def run(keys: list[str]) -> dict[str, object]:
        batches.append(list(keys))
        if len(batches) == 1:
            held.set()
            release.wait(10)
        else:
            fail(keys)
        return {k: k for k in keys}

    return run, batches, held, release


def test_a_node_error_of_a_merged_run_is_asked_again_alone() -> None:
    def fail(keys: list[str]) -> None:
        if "bad" in keys:
            raise UnknownNode("Invalid node name specified")

    run, batches, held, release = held_run(fail)
    answers = held_then_queued(Merger(run), held, release, ["a", "b", "bad"])
    assert answers[:2] == ["a", "b"] and isinstance(answers[2], UnknownNode)
    assert batches == [["a"], ["b", "bad"], ["b"], ["bad"]]


def test_a_system_error_is_every_callers_without_asking_again() -> None:
    def fail(keys: list[str]) -> None:
        raise ControllerUnreachable("Unable to contact slurm controller")

    run, batches, held, release = held_run(fail)
    answers = held_then_queued(Merger(run), held, release, ["a", "b", "c"])
    assert answers[0] == "a" and all(isinstance(a, ControllerUnreachable) for a in answers[1:])
    assert batches == [["a"], ["b", "c"]]


def test_a_bug_in_run_reaches_every_caller() -> None:
    def run(keys: list[str]) -> dict[str, object]:
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        Merger(run)("a")
