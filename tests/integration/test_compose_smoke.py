"""docker-compose.yml's topology, run without Docker: every service's own command, as local processes.

There is no Docker engine on these machines, so this test reads docker-compose.yml and runs what
each service would run: the simulator's entrypoint and command, then `db upgrade` (the migrate
service), then the worker, beat, both watchers and the API through the very `sh -c` entrypoint that
sources the simulator's env file. Only what a container network provides is replaced: the `postgres`
host becomes this run's test database, the `redis` host a private redis-server with the ACL users the
compose Redis loads (each service keeps its own user from its URL; none may be refused a command),
the simulator listens on
127.0.0.1 on ports the kernel picks and writes its state into a temp dir instead of the `sim` volume,
the API and each health endpoint bind port 0 and name the port they got in their output, and the trace is sped up (``--speedup``, ``--seed``) so the first faults land
within seconds. The facts are read from Postgres: both watchers' events, and a remediation that went
through every step over the wire. Every process must stop on SIGTERM, leaving nothing behind.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml
from sqlalchemy import create_engine, text

from remediation.domain.statemachine import HAPPY_PATH, Step
from tests.composefile import compose
from tests.integration.workerproc import stacks, wait_for
from tests.pace import within
from tests.ports import HEALTH_LINE, UVICORN_LINE, reported_port
from tests.redisproc import MULTI_CLUSTER_ACL_FILE, AclRedis

ROOT = Path(__file__).resolve().parents[2]
# docker-compose runs without validation (validation.backend none): verify leads to return.
# The compose site runs no job on a node (no validation backend): no GPU check, no evidence job.
HAPPY_STEPS = {str(step) for step in HAPPY_PATH if step not in (Step.DONE, Step.VALIDATE, Step.COLLECT_EVIDENCE)}
LONG_RUNNING = ("worker", "beat", "watcher-slurm", "watcher-kube", "api")
# Seed 30 at speedup 30000 on 32 nodes: a GPU condition (the Kubernetes watcher's) at 1 s and a
# researcher's state=fail (the Slurm watcher's) at 8 s; the next fault comes at 95 s, and four nodes fail
# together at 141 s. The storm breaker (10% of the pool within 30 s) cannot open before then, so a slow
# machine still sees a remediation succeed. (Seed 1 at 83314 put a fabric fault on four nodes at 24 s: on a
# loaded machine the breaker opened before the first remediation reached its eviction.)
FAST = ["--speedup", "30000", "--seed", "30"]
# The loop ends as soon as a remediation succeeded; the bound only matters on a loaded machine, where
# the whole stack (six processes beside the test run) took over 90 s to get there.
DEADLINE_S = 240


def _option(argv: list[str], name: str, value: str) -> list[str]:
    """argv with the value after ``name`` replaced; the option must be there."""
    assert name in argv, f"{name} not in {argv}"
    out = list(argv)
    out[out.index(name) + 1] = value
    return out


class Stack:
    """Local processes standing in for the compose services; each in its own process group."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.wedged: dict[str, str] = {}  # the stacks of a process that outlived its 30 s to stop

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with open(self.logs / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def port(self, name: str, line: re.Pattern[str]) -> int:
        """The port the service bound (each starts on port 0), as its output names it."""
        return reported_port(self.logs / f"{name}.log", line, self.procs[name])

    def check_running(self) -> None:
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        assert not dead, f"exited early: {dead}\n{self.tails()}"

    def tails(self) -> str:
        return "\n".join(
            f"--- {name}\n{(self.logs / f'{name}.log').read_text(errors='replace')[-2500:]}"
            f"{self.wedged.get(name, '')}"
            for name in self.procs
        )

    def stop(self) -> dict[str, int | None]:
        """Stop in reverse start order (the simulator last), as `docker compose stop` does: SIGTERM
        to the main process (a container's PID 1), 30 s to exit, then SIGKILL for the whole group.
        Returns each exit code; None means something had to be killed: the process, or a child it
        left behind (celery's pool children share its group)."""
        codes: dict[str, int | None] = {}
        for name, proc in reversed(self.procs.items()):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
            try:
                codes[name] = proc.wait(30)
            except subprocess.TimeoutExpired:
                codes[name] = None
                self.wedged[name] = stacks(SimpleNamespace(proc=proc))  # where it is still busy
            deadline = within(5)
            while _group_alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _group_alive(proc.pid):
                os.killpg(proc.pid, signal.SIGKILL)
                codes[name] = None
            proc.wait(10)
        return codes


def await_simulators(stack: Stack, env_files: list[Path]) -> None:
    """Wait (30 s at most) until every simulator has written the settings file it serves."""

    def written() -> bool:
        stack.check_running()
        return all(f.exists() for f in env_files)

    wait_for(written, 30, "every simulator's settings file", SimpleNamespace(output=stack.tails))


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _environment(svc: dict[str, Any], pg_url: str, redis: AclRedis, *, hosts: str = "") -> dict[str, str]:
    """The service's environment with its Postgres and Redis (``postgres<hosts>``, ``redis<hosts>``)
    replaced by this run's, and a config file mounted from the checkout read from there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `remediation`
    for key, value in (svc.get("environment") or {}).items():
        env[key] = str(value)
    db, broker = env["REMEDIATION_DATABASE__URL"], env["REMEDIATION_BROKER__REDIS_URL"]
    assert urlsplit(db).hostname == f"postgres{hosts}" and urlsplit(broker).hostname == f"redis{hosts}", (db, broker)
    if "REMEDIATION_CONFIG" in env:  # a file of the checkout, mounted read-only
        (mount,) = [v for v in svc["volumes"] if v.startswith("./") and v.endswith(":ro")]
        source, target, _ = mount.split(":")
        env["REMEDIATION_CONFIG"] = env["REMEDIATION_CONFIG"].replace(target, str(ROOT / source), 1)
    env["REMEDIATION_DATABASE__URL"] = pg_url
    named = urlsplit(broker)
    assert named.username and named.password, f"{broker}: each service names its own Redis user"
    # Its user and password as compose gives them: a password users.acl does not hold fails here.
    env["REMEDIATION_BROKER__REDIS_URL"] = f"redis://{named.username}:{named.password}@127.0.0.1:{redis.port}/0"
    return env


def _local_argv(svc: dict[str, Any], state_dir: Path | dict[str, Path], tmp: Path) -> list[str]:
    """The service's entrypoint and command as a local process would run them. ``state_dir``: where
    the `sim` volume is, or each volume's directory by its mount point (``/sim-east``)."""
    entrypoint = svc.get("entrypoint") or ["remediation"]  # the image's ENTRYPOINT
    dirs = state_dir if isinstance(state_dir, dict) else {"/sim": state_dir}
    local = {f"{mount}/": f"{where}/" for mount, where in dirs.items()} | {"/tmp/": f"{tmp}/"}
    out = []
    for arg in [*entrypoint, *svc["command"]]:
        arg = arg.replace("$$", "$")  # compose's escape for a literal $
        out.append(re.sub(r"(?<![\w/])/(sim[\w-]*|tmp)/", lambda m: local[m.group(0)], arg))
    if "api" in svc["command"][:1]:
        out = _option(_option(out, "--host", "127.0.0.1"), "--port", "0")
    return out


def _facts(pg_url: str, cluster: str = "default") -> dict[str, Any]:
    """What ``cluster``'s watchers recorded and its remediations did, from Postgres."""
    engine = create_engine(pg_url)
    try:
        with engine.connect() as conn:
            sources = {s for (s,) in conn.execute(text("select distinct source from events where cluster = :c"),
                                                  {"c": cluster})}
            rows = conn.execute(
                text(
                    "select r.id, r.node, r.status, s.step from remediations r "
                    "left join remediation_steps s on s.remediation_id = r.id and s.status = 'done' "
                    "where r.cluster = :c"
                ), {"c": cluster},
            ).all()
            # Why the open ones wait, for a failure message (the first few).
            waits = conn.execute(
                text("select node, step, wait_reason from remediations where status = 'waiting' and cluster = :c "
                     "order by id limit 5"), {"c": cluster},
            ).all()
    finally:
        engine.dispose()
    steps: dict[tuple[int, str, str], set[str]] = {}
    for rid, node, status, step in rows:
        steps.setdefault((rid, node, status), set()).update([step] if step else [])
    succeeded = sorted(
        node for (_, node, status), done in steps.items() if status == "succeeded" and HAPPY_STEPS <= done
    )
    return {"sources": sources, "succeeded": succeeded, "waits": [tuple(w) for w in waits],
            "remediations": sorted(steps)}


def test_compose_services_run_the_loop_against_the_simulator(
    tmp_path: Path, pg_url: str
) -> None:
    # The token compose requires (`${REMEDIATION_ADMIN_TOKEN:?...}`), chosen as an operator would.
    services = compose({"REMEDIATION_ADMIN_TOKEN": secrets.token_urlsafe(24)})["services"]
    state_dir = tmp_path / "sim"
    stack = Stack(tmp_path)
    (tmp_path / "redis").mkdir()
    redis = AclRedis(tmp_path / "redis")  # the users the compose Redis loads (deploy/base/redis)
    facts: dict[str, Any] = {}
    health: list[int] = []
    checks: dict[str, int] = {}
    try:
        # The simulator, as its service runs it, on loopback with free ports and a temp state dir.
        sim = services["simulator"]
        assert sim["entrypoint"][:1] == ["python"]
        argv = _option(sim["command"], "--bind", "127.0.0.1")
        argv = _option(argv, "--advertise", "127.0.0.1")
        argv = _option(argv, "--base-port", "0")
        argv = _option(argv, "--state-dir", str(state_dir))
        assert "--replay" in argv
        env_file = state_dir / "simulator.env"
        assert not sim.get("environment"), "the simulator takes no settings"
        sim_env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")}
        stack.start("simulator", [sys.executable, *sim["entrypoint"][1:], *argv, *FAST], sim_env)
        await_simulators(stack, [env_file])

        # migrate: runs once, before everything else.
        migrate = services["migrate"]
        done = subprocess.run(
            _local_argv(migrate, state_dir, tmp_path), cwd=ROOT, capture_output=True, text=True,
            env=_environment(migrate, pg_url, redis), timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0 and "database at head" in done.stdout, done.stdout + done.stderr

        # Each container has its own loopback; here they share one, so each binds a health port the
        # kernel picks (port 0) and names it in its output.
        for name in LONG_RUNNING:
            svc = services[name]
            assert "simulator" in svc["depends_on"], name
            env = _environment(svc, pg_url, redis) | {"REMEDIATION_HEALTH__PORT": "0"}
            stack.start(name, _local_argv(svc, state_dir, tmp_path), env)

        deadline = within(DEADLINE_S)
        while time.monotonic() < deadline:
            stack.check_running()
            facts = _facts(pg_url)
            if {"slurm", "kubernetes"} <= facts["sources"] and facts["succeeded"]:
                break
            time.sleep(1)
        api_port = stack.port("api", UVICORN_LINE)
        health_ports = {name: stack.port(name, HEALTH_LINE) for name in LONG_RUNNING if name != "api"}
        health.append(httpx.get(f"http://127.0.0.1:{api_port}/healthz", timeout=10).status_code)
        # The compose health checks of the processes, run as Docker would run them (their CMD argv).
        for name in ("worker", "beat", "watcher-slurm", "watcher-kube"):
            svc = services[name]
            port = svc["environment"]["REMEDIATION_HEALTH__PORT"]
            check = svc["healthcheck"]["test"]
            assert check[0] == "CMD", name
            argv = [a.replace(f":{port}/", f":{health_ports[name]}/") for a in check[1:]]
            argv = [sys.executable if a == "python" else a for a in argv]
            ran = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
            checks[name] = ran.returncode
        admin = yaml.safe_load(services["api"]["environment"]["REMEDIATION_API__ADMIN_TOKENS"])[0]
        health.append(
            httpx.get(
                f"http://127.0.0.1:{api_port}/api/v1/overview",
                headers={"Authorization": f"Bearer {admin}"},
                timeout=10,
            ).status_code
        )
    finally:
        codes = stack.stop()
        denied = redis.denials()
        redis.stop()
    assert denied == [], denied
    assert {"slurm", "kubernetes"} <= facts.get("sources", set()), (facts, stack.tails())
    assert facts["succeeded"], (f"none succeeded; the first waiting: {facts['waits']}", facts, stack.tails())
    assert health == [200, 200]
    assert checks == {"worker": 0, "beat": 0, "watcher-slurm": 0, "watcher-kube": 0}, (checks, stack.tails())
    # 0, or death by the SIGTERM itself after a graceful shutdown (uvicorn re-raises it); never SIGKILL.
    assert all(code in (0, -signal.SIGTERM) for code in codes.values()), f"exit codes {codes}\n{stack.tails()}"
    assert not env_file.exists(), "the simulator leaves no stale tokens behind"
    for name in stack.procs:
        assert "Traceback" not in (tmp_path / f"{name}.log").read_text(errors="replace"), stack.tails()


MULTI_CLUSTER = "multi-cluster"


def test_compose_multi_cluster_profile_remediates_in_each_simulated_cluster(tmp_path: Path, pg_url: str) -> None:
    """The `multi-cluster` profile as processes: two simulators (the same trace and seed, so the same
    node names fail in both), a watcher pair per cluster sourcing only its own cluster's settings, and
    one worker, beat and API serving both, each as its own user of the multi-cluster ACL. Each
    cluster's watchers' events land under that cluster, and a remediation succeeds in each, through
    its own cluster's simulator."""
    services = {n: s for n, s in compose({"REMEDIATION_ADMIN_TOKEN": secrets.token_urlsafe(24)})["services"].items()
                if s.get("profiles") == [MULTI_CLUSTER]}
    stack = Stack(tmp_path)
    (tmp_path / "redis").mkdir()
    redis = AclRedis(tmp_path / "redis", acl_file=MULTI_CLUSTER_ACL_FILE)
    dirs: dict[str, Path] = {}
    facts: dict[str, dict[str, Any]] = {}
    statuses: list[int] = []
    try:
        for name, sim in sorted(services.items()):
            if sim.get("entrypoint", [])[:1] != ["python"]:
                continue
            mount = sim["command"][sim["command"].index("--state-dir") + 1]
            dirs[mount] = tmp_path / name
            argv = _option(_option(sim["command"], "--bind", "127.0.0.1"), "--advertise", "127.0.0.1")
            argv = _option(_option(argv, "--base-port", "0"), "--state-dir", str(dirs[mount]))
            sim_env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")}
            stack.start(name, [sys.executable, *sim["entrypoint"][1:], *argv, *FAST], sim_env)
        assert len(dirs) == 2
        await_simulators(stack, [d / "simulator.env" for d in dirs.values()])
        migrate = services["migrate-clusters"]
        done = subprocess.run(
            _local_argv(migrate, dirs, tmp_path), cwd=ROOT, capture_output=True, text=True,
            env=_environment(migrate, pg_url, redis, hosts="-clusters"), timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0 and "database at head" in done.stdout, done.stdout + done.stderr
        running = sorted(n for n, s in services.items() if str(s.get("entrypoint", [""])[0]) == "sh")
        assert len(running) == 7, running  # worker, beat, API and four watchers
        for name in running:
            env = _environment(services[name], pg_url, redis, hosts="-clusters") | {"REMEDIATION_HEALTH__PORT": "0"}
            stack.start(name, _local_argv(services[name], dirs, tmp_path), env)
        clusters = ("east", "west")
        deadline = within(DEADLINE_S)
        while time.monotonic() < deadline:
            stack.check_running()
            facts = {c: _facts(pg_url, c) for c in clusters}
            if all({"slurm", "kubernetes"} <= f["sources"] and f["succeeded"] for f in facts.values()):
                break
            time.sleep(1)
        api_port = stack.port("api-clusters", UVICORN_LINE)
        admin = yaml.safe_load(services["api-clusters"]["environment"]["REMEDIATION_API__ADMIN_TOKENS"])[0]
        statuses.append(httpx.get(f"http://127.0.0.1:{api_port}/healthz", timeout=10).status_code)
        listed = httpx.get(f"http://127.0.0.1:{api_port}/api/v1/remediations", params={"status": ""},
                           headers={"Authorization": f"Bearer {admin}"}, timeout=10)  # ended ones too
        statuses.append(listed.status_code)
        stray = _facts(pg_url, "default")
    finally:
        codes = stack.stop()
        denied = redis.denials()
        redis.stop()
    assert denied == [], denied
    for cluster, found in facts.items():
        assert {"slurm", "kubernetes"} <= found["sources"], (cluster, facts, stack.tails())
        assert found["succeeded"], (cluster, f"none succeeded; the first waiting: {found['waits']}", stack.tails())
    assert not stray["sources"] and not stray["remediations"], stray  # nothing landed in no cluster
    assert statuses == [200, 200], listed.text
    assert {row["cluster"] for row in listed.json()} == set(clusters), listed.text  # one API, both clusters
    assert all(code in (0, -signal.SIGTERM) for code in codes.values()), f"exit codes {codes}\n{stack.tails()}"
    for name in stack.procs:
        assert "Traceback" not in (tmp_path / f"{name}.log").read_text(errors="replace"), stack.tails()
