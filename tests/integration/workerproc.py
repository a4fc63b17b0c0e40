"""Start and stop real Celery worker processes (with embedded beat) for integration tests."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from remediation.adapters.celery import SWEEP_TASK as SWEEP
from remediation.adapters.celery import WORKER_QUEUES, make_app
from remediation.settings import load_settings
from tests.pace import budget, within
from tests.policies import policy_env

ROOT = Path(__file__).resolve().parents[2]


def celery_worker_argv(queues: str = ",".join(WORKER_QUEUES), concurrency: int = 1, name: str = "w") -> list[str]:
    """``-m celery worker`` arguments for one quiet prefork worker with a unique node name."""
    return [
        "-m",
        "celery",
        "-A",
        "remediation.workers.celery_app",
        "worker",
        "-Q",
        queues,
        "-c",
        str(concurrency),
        "--pool",
        "prefork",
        "--loglevel",
        "INFO",
        "-n",
        f"{name}{time.monotonic_ns()}@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]


def worker_env(pg_url: str, redis_url: str, prefix: str, tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")}
    # The policy the test asked for by name (tests/policies.py; none: the shipped one), so worker
    # processes decide as the in-process engines of the same test do.
    env.update(policy_env())
    env.update(
        {
            "REMEDIATION_DATABASE__URL": pg_url,
            "REMEDIATION_BROKER__REDIS_URL": redis_url,
            "REMEDIATION_BROKER__KEY_PREFIX": prefix,
            "REMEDIATION_BROKER__INGEST_CLAIM_IDLE_S": "2",
            "REMEDIATION_SLURM__BACKEND": "memory",
            "REMEDIATION_KUBE__BACKEND": "memory",
            "REMEDIATION_MACHINE__BACKEND": "memory",
            "REMEDIATION_MEMORY__JOURNAL": str(tmp / "world.json"),
            "REMEDIATION_MEMORY__NODES": "gpu-node-[0-7]",
            "REMEDIATION_POLICY__MIN_RESTART_GAP_S": "0",
            "REMEDIATION_WORKFLOW__POLL_INTERVAL_S": "0.3",
            "REMEDIATION_WORKFLOW__LEASE_S": "3",
            "REMEDIATION_WORKFLOW__SWEEP_INTERVAL_S": "1",
            "REMEDIATION_WORKFLOW__BACKOFF_BASE_S": "0.2",
            "PYTHONPATH": str(ROOT),
        }
    )
    env.update(extra)
    return env


def spawn(args: list[str], log: Path, **popen: Any) -> subprocess.Popen[bytes]:
    """Start ``args`` with its stdout and stderr in ``log``. The child keeps its own descriptor of the
    file, so ours is closed at once rather than left for the garbage collector (a ResourceWarning)."""
    with log.open("w") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, **popen)


def beat_argv(schedule: Path) -> list[str]:
    """A standalone Celery beat of the workers' app, keeping its schedule state in ``schedule``."""
    return [sys.executable, "-m", "celery", "-A", "remediation.workers.celery_app", "beat", "-s", str(schedule)]


class Worker:
    def __init__(
        self,
        env: dict[str, str],
        tmp: Path,
        concurrency: int = 2,
        queues: str = ",".join(WORKER_QUEUES),
        beat: bool = True,
    ) -> None:
        self.log = tmp / f"worker-{time.monotonic_ns()}.log"
        args = [sys.executable, *celery_worker_argv(queues, concurrency)]
        if beat:
            args += ["-B", "-s", str(tmp / f"beat-{time.monotonic_ns()}")]
        self.proc = spawn(args, self.log, cwd=ROOT, env=env, start_new_session=True)

    def kill(self) -> None:
        """SIGKILL the whole worker: main process and its pool children, no chance to clean up."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def acknowledged(self, task: str) -> int:
        """How many runs of ``task`` this worker finished and acknowledged (late acks: after it ran)."""
        return len(re.findall(rf"Task {re.escape(task)}\[[^\]]+\] succeeded", self.output()))

    def ready(self) -> bool:
        """Celery logged ``celery@... ready.``: the pool is up and the worker consumes its queues."""
        return " ready." in self.output()


class HasOutput(Protocol):
    """A process whose output a timed-out wait shows (a :class:`Worker`, a watcher, beat)."""

    def output(self) -> str: ...


@contextmanager
def running(env: dict[str, str], tmp: Path, **options: Any) -> Iterator[Worker]:
    """A :class:`Worker` (``options`` as its own), yielded once it is ready and stopped after."""
    proc = Worker(env, tmp, **options)
    try:
        wait_for(proc.ready, 60, "the worker to start", proc)
        yield proc
    finally:
        proc.stop()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, worker: HasOutput | None = None) -> Any:
    """Poll ``predicate`` until it returns something true, and return that; on timeout fail with the
    tail of ``worker``'s output."""
    deadline = within(timeout)
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    tail = worker.output()[-4000:] if worker else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{tail}{stacks(worker)}")


def stacks(worker: HasOutput | None) -> str:
    """The Python stacks of a worker's processes (its main process, beat and pool children), for a
    failure message: a wait that timed out on a wedged process says where it is wedged."""
    proc = getattr(worker, "proc", None)
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if proc is None or spy is None or proc.poll() is not None:
        return ""
    group = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True, timeout=10).stdout
    dumps = []
    for pid in group.split():
        dump = subprocess.run([spy, "dump", "--pid", pid], capture_output=True, text=True, timeout=30)
        dumps.append(dump.stdout or dump.stderr)
    return "\nstacks:\n" + "\n".join(dumps)


#: The longest countdown a barrier waits out (the workers' own retry backoff stops at 60 s).
LONGEST_COUNTDOWN_S = 90


def broker_held(client: Any, prefix: str, live: int | None = None) -> tuple[str, float]:
    """What the broker and its live workers still hold, as ("", 0) when nothing: a queued task, or one a
    live worker is running, has reserved, or keeps for its countdown (asked of the workers themselves;
    a worker that was SIGKILLed holds nothing any more, and the messages it had reserved come back only
    after the broker's visibility timeout). The second value is the latest countdown's end (epoch
    seconds, 0 if none): a barrier must give a held retry until then."""
    queues = {q: client.llen(f"{prefix}:celery:{q}") for q in ("ingest", "workflow")}
    if any(queues.values()):
        return f"queued: {queues}", 0.0
    url = client.connection_pool.connection_kwargs
    app = make_app(
        load_settings(
            broker={
                "redis_url": f"redis://{url.get('host', '127.0.0.1')}:{url.get('port', 6379)}/{url.get('db', 0)}",
                "key_prefix": prefix,
            }
        )
    )
    inspect = app.control.inspect(timeout=2.0, limit=live)  # answers as soon as ``live`` workers did
    held = {"active": inspect.active(), "reserved": inspect.reserved(), "scheduled": inspect.scheduled()}
    silent = [k for k, answer in held.items() if answer is None or (live is not None and len(answer) < live)]
    if silent:
        return f"no answer from every live worker to {silent}", 0.0
    tasks = {k: [t for ts in answer.values() for t in ts] for k, answer in held.items()}
    if not any(tasks.values()):
        return "", 0.0
    etas = [datetime.fromisoformat(t["eta"]).timestamp() for t in tasks["scheduled"] if t.get("eta")]
    names = {k: [(t.get("request") or t).get("name") for t in ts] for k, ts in tasks.items() if ts}
    return f"held: {names}", max(etas, default=0.0)


def broker_idle(client: Any, prefix: str, live: int | None = None) -> bool:
    return not broker_held(client, prefix, live)[0]


def settled(workers: list[Worker], client: Any, prefix: str, sweeps: int = 2, timeout: float = 30) -> None:
    """The barrier before a "nothing more happens" check: no task is queued or held by a live worker,
    and then the workers acknowledged ``sweeps`` more sweeps, each of which could have acted on a
    leftover step (a late duplicate would come from a redelivered task or a sweep). A task kept for its
    countdown (a retry backing off after a database outage) is waited for: ``timeout`` runs from the
    end of the latest countdown seen."""

    def idle() -> None:
        deadline, what = within(timeout), ""
        while time.monotonic() < deadline:
            what, eta = broker_held(client, prefix, live=sum(w.proc.poll() is None for w in workers))
            if not what:
                return
            wait = min(max(eta - time.time(), 0.0), LONGEST_COUNTDOWN_S)
            deadline = max(deadline, time.monotonic() + wait + budget(timeout))
            time.sleep(0.1)
        tail = workers[-1].output()[-4000:]
        raise AssertionError(
            f"timed out waiting for every task to be acknowledged; last seen {what}\n{tail}"
            f"{stacks(workers[-1])}"
        )

    idle()
    mark = sum(w.acknowledged(SWEEP) for w in workers)
    wait_for(
        lambda: sum(w.acknowledged(SWEEP) for w in workers) >= mark + sweeps,
        timeout,
        f"{sweeps} more sweeps to be acknowledged",
        workers[-1],
    )
    idle()
