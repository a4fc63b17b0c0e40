"""The newcomer's first command: `remediation demo` runs the real watchers, workers and adapters against
the wire-protocol simulator (kube-apiserver, GCE, Azure, slurmrestd) with SQLite and the memory broker,
serves the dashboard while it runs, and leaves the facts it promises in the database.

It runs from a **non-editable** install (a wheel built from this checkout, installed into a fresh
virtualenv, run from a directory outside the checkout), the way the container image installs it, so a
module or data file the wheel forgets (the migrations, the trace, the dashboard's templates) fails here.
The fresh virtualenv takes its third-party dependencies from the test environment (a ``.pth`` line, no
download); the project's own packages come only from the wheel, which the test checks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.conftest import _db_url, _drop, _pg_admin
from tests.integration.workerproc import wait_for
from tests.pace import budget, within

ROOT = Path(__file__).resolve().parents[2]
HAPPY_STEPS = {"slurm_drain", "k8s_cordon", "k8s_evict", "vm_restart", "verify", "validate", "return"}
OURS = ("remediation", "remediation.watchers", "remediation.workers", "remediation.simulator", "remediation.demo",
        "remediation.migrations")
GENERIC = ("watchers", "workers", "simulator", "demo", "migrations")  # names another distribution may use
SUBBLOCK = ("cloud.google.com/gce-topology-subblock", "sb-2")  # the demo's leaf switch fails behind it
SWITCHED = ["gpu-node-16", "gpu-node-18", "gpu-node-20", "gpu-node-22"]
XID48 = ("gpu-node-6", "gpu-node-9")
BARE_METAL = "gpu-node-33"
# Cluster nvl: one NVL72 rack, its 18 trays one NVLink domain by their Nodes' clique label; an NVSwitch
# fault drains two of them.
CLIQUE = ("nvidia.com/gpu.clique", "5f0b8a8e-3c1d-4e7a-9b2f-6d4c2a1e0b9c.1")
TRAYS = sorted(f"nvl-tray-{i}" for i in range(18))
SXID_TRAYS = {"nvl-tray-3", "nvl-tray-11"}
WEST_NODE = "gpu-node-7"  # fails in both clusters: east's researcher, west's own  # slurmd hangs on it; its machine is a system of the simulated Redfish BMC


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the project installed from a wheel (``pip install --no-deps .``)."""
    venv = tmp_path_factory.mktemp("wheel") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    # Dependencies from this environment; its editable install of the project is a .pth-loaded finder,
    # which a path added this way does not load.
    (site / "_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    build = tmp_path_factory.mktemp("build")
    # From a clean copy: setuptools builds in the source tree, and a stale build/ there would ship
    # modules the checkout no longer has.
    source = build / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "tests", "bench", "docs"))
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(build), str(source)],
        check=True, capture_output=True, cwd=build,
    )
    (wheel,) = build.glob("node_remediation-*.whl")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, cwd=build)
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", f"import importlib; print(*[importlib.import_module(m).__file__ "
         f"for m in {OURS!r}], sep='\\n')"],
        check=True, capture_output=True, text=True, cwd=build,
    ).stdout.split()
    assert len(where) == len(OURS) and all(str(site) in w for w in where), where  # not the checkout
    return venv / "bin" / "remediation"


@pytest.fixture
def empty_pg() -> Iterator[str]:
    name = f"remwheel_{uuid.uuid4().hex[:10]}"
    with _pg_admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield _db_url(name)
    _drop(name)


def test_a_non_editable_install_migrates_a_database(installed: Path, empty_pg: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")}
    env["REMEDIATION_DATABASE__URL"] = empty_pg
    proc = subprocess.run([str(installed), "db", "upgrade"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with _pg_admin() as conn:
        conn.execute("select 1")
    import psycopg

    with psycopg.connect(empty_pg.replace("postgresql+psycopg://", "postgresql://")) as conn:
        tables = {r[0] for r in conn.execute("select tablename from pg_tables where schemaname = 'public'")}
        head = conn.execute("select version_num from alembic_version").fetchone()
    assert {"nodes", "events", "remediations", "remediation_steps", "audit_log", "control"} <= tables
    assert head is not None


def test_the_wheel_installs_nothing_outside_its_namespace(installed: Path, tmp_path: Path) -> None:
    """The process packages ship inside ``remediation`` (the repository's top-level folders, linked into
    it): ``pip show -f`` lists no top-level ``workers`` or ``watchers``, and no such module imports."""
    python = installed.parent / "python"
    shown = subprocess.run([str(python), "-m", "pip", "show", "-f", "node-remediation"], cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout
    files = [line.strip() for line in shown.split("Files:", 1)[1].splitlines() if line.strip()]
    tops = {Path(f).parts[0] for f in files}
    assert any(f.startswith("remediation/workers/") for f in files) and any(
        f.startswith("remediation/watchers/") for f in files)
    assert not tops & set(GENERIC), sorted(tops)
    assert {t for t in tops if t not in ("remediation", "..")} == {t for t in tops if t.endswith(".dist-info")}
    for name in GENERIC:
        found = subprocess.run([str(python), "-c", f"import importlib.util; print(importlib.util.find_spec({name!r}))"],
                               cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
        assert found == "None", (name, found)


def in_flight(proc: subprocess.Popen[str], url: str, auth: dict[str, str]) -> list[dict[str, Any]]:
    """The remediations the demo's dashboard lists as in flight (none while it cannot answer yet); a
    demo that has ended has none to come."""
    assert proc.poll() is None, f"the demo ended (exit {proc.returncode}) before any remediation was in flight"
    try:
        answer = httpx.get(url + "/api/v1/remediations", headers=auth, timeout=10)
    except httpx.HTTPError:
        return []
    return answer.json() if answer.status_code == 200 else []


def test_demo_runs_the_whole_loop_against_the_simulator(installed: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")}
    env["COLUMNS"] = "200"
    cwd = tmp_path / "cwd"  # where it was started: a run leaves nothing there (no beat state, no database)
    cwd.mkdir()
    proc = subprocess.Popen(
        [str(installed), "demo", "--workdir", str(tmp_path / "work"), "--timeout", f"{budget(150):.0f}", "--port", "0"],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    answers: list[tuple[str, int]] = []
    try:
        deadline = within(60)
        found = None
        while found is None and time.monotonic() < deadline and proc.poll() is None:
            found = re.search(
                r"dashboard: (http://127\.0\.0\.1:\d+)\s+\(admin token: (\S+)\)", "".join(lines)
            )
            time.sleep(0.2)
        assert found, "".join(lines)
        url, token = found.groups()
        auth = {"Authorization": f"Bearer {token}"}
        # Mid-run: the dashboard lists a remediation in flight.
        wait_for(lambda: in_flight(proc, url, auth), 60, "a remediation in flight on the dashboard",
                 SimpleNamespace(output=lambda: "".join(lines)))
        for path in ("/api/v1/overview", "/api/v1/remediations", "/healthz"):
            answers.append((path, httpx.get(url + path, headers=auth, timeout=10).status_code))
        unauthenticated = httpx.get(url + "/api/v1/overview", timeout=10).status_code
        assert proc.wait(timeout=budget(240)) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
        proc.stdout.close()  # type: ignore[union-attr]  # read to its end: the demo has exited
    assert answers == [("/api/v1/overview", 200), ("/api/v1/remediations", 200), ("/healthz", 200)]
    assert unauthenticated == 401
    assert list(cwd.iterdir()) == []

    db = sqlite3.connect(tmp_path / "work" / "remediation.db")  # the embedded default is SQLite
    rems = {
        rid: (node, status) for rid, node, status in db.execute("select id, node, status from remediations")
    }
    done = {
        rid: {step for (step,) in db.execute(
            "select step from remediation_steps where remediation_id = ? and status = 'done'", (rid,))}
        for rid in rems
    }  # fmt: skip
    succeeded = [
        rid for rid, (_, status) in rems.items() if status == "succeeded" and HAPPY_STEPS <= done[rid]
    ]
    assert len(succeeded) >= 5, rems
    assert sorted(node for node, status in rems.values() if status == "quarantined") == ["gpu-node-6", "gpu-node-9"]
    # The validation: gpu-node-6's bad HBM row fails its check (a reboot did not cure it); every
    # other node that came back passed its own before returning.
    checks = db.execute("select node, outcome from validations").fetchall()
    assert ("gpu-node-6", "failed") in checks and ("gpu-node-6", "passed") not in checks, checks
    passed = {node for node, outcome in checks if outcome == "passed"}
    # The XID 48 host move (gpu-node-6 is a GCE VM: a stop/start) left the name on other hardware: the
    # machine's physical host before the move and after it differ, and the summary says so.
    hosts = db.execute("select action, host from hardware_sightings where node = 'gpu-node-6' and step = "
                       "'vm_restart' order by id").fetchall()
    assert [a for a, _ in hosts] == [None, "stop_start"] and hosts[0][1] and hosts[1][1] not in (None, hosts[0][1])
    assert "new hardware under the same name: east/gpu-node-6: host changed" in "".join(lines)
    assert {rems[rid][0] for rid in succeeded} <= passed, (checks, succeeded)
    assert not [r for r in rems.values() if r[1] in ("running", "waiting")]
    audit = [a for (a,) in db.execute("select action from audit_log")]
    assert audit.count("breaker_open") >= 1 and audit.count("breaker_closed") >= 1
    nodes = {node for node, _ in rems.values()}
    assert "gpu-node-12" not in nodes  # the maintenance drain is recorded, never remediated
    assert "gpu-node-5" not in nodes  # the flapping Node never held NotReady long enough
    maintenance = db.execute(
        "select decision, decision_reason from events where node = 'gpu-node-12' and kind = 'unhealthy'"
    ).fetchall()
    assert maintenance and all(d == "record" and "ignore list" in why for d, why in maintenance)
    sources = {s for (s,) in db.execute("select distinct source from events")}
    assert {"slurm", "kubernetes"} <= sources  # both real watchers published
    assert "Traceback" not in "".join(lines)
    # The story, not the worker's log: no per-task INFO lines between the scenes.
    assert not [line for line in lines if " INFO " in line], [line for line in lines if " INFO " in line][:5]

    summary = json.loads((tmp_path / "work" / "summary.json").read_text())
    # The leaf switch: ONE incident for its sub-block (learnt from the Nodes' labels), with its four
    # nodes, and no other incident (the storm's nodes are scattered, gpu-node-4 is alone).
    incidents = db.execute("select id, kind, name, status, nodes from incidents").fetchall()
    assert [(kind, name, json.loads(nodes)) for _, kind, name, _, nodes in incidents] == [(*SUBBLOCK, SWITCHED)]
    ((incident, _, _, status, _),) = incidents
    assert status == "recovered"  # closed by itself once the switch was replaced
    # One page: one incident_opened audit row (the notification outbox's source), for that incident.
    opened = [json.loads(d)["incident"] for (d,) in db.execute(
        "select detail from audit_log where action = 'incident_opened'")]  # fmt: skip
    assert opened == [incident]
    # No VM action on its nodes: none in the workflow's steps, none in the clouds' request logs.
    members = db.execute(
        f"select id, node, status, incident_id from remediations where node in ({','.join('?' * 4)})", SWITCHED
    ).fetchall()
    assert sorted(node for _, node, _, _ in members) == SWITCHED
    assert {(status, inc) for _, _, status, inc in members} == {("cancelled", incident)}  # handed back
    assert not db.execute(
        f"select 1 from remediation_steps where step = 'vm_restart' and remediation_id in ({','.join('?' * 4)})",
        [rid for rid, *_ in members],
    ).fetchall()
    assert not set(SWITCHED) & set(summary["vm_actions"]), summary["vm_actions"]
    # Back in service: the service says so, and so does the simulated cluster (Slurm up and not
    # drained, Node not cordoned) at the end of the run.
    assert {s for (s,) in db.execute(
        f"select status from nodes where name in ({','.join('?' * 4)})", SWITCHED)} == {"healthy"}  # fmt: skip
    (reported,) = summary["incidents"]
    assert reported["in_service"] == SWITCHED and reported["pages"] == 1 and reported["vm_actions"] == 0
    # Xid 48 (gpu-memory): a GPU reset (a Job on the Node), then exactly one VM action (a host move)
    # each, then quarantine.
    for node in XID48:
        steps = [json.loads(op) for (op,) in db.execute(
            "select s.provider_op from remediation_steps s join remediations r on r.id = s.remediation_id "
            "where r.node = ? and s.step = 'vm_restart' order by s.id", (node,)).fetchall()]  # fmt: skip
        assert len(steps) == 2 and steps[0]["name"].startswith("nr-reset-"), steps
        assert steps[1]["action"] in ("stop_start", "redeploy"), steps
        assert summary["vm_actions"][node] == 1, summary["vm_actions"]
    # The bare-metal pool: its node has no providerID, the redfish inventory routes it to its BMC, and
    # the BMC's own request log shows exactly one reset per remediation that took a machine action.
    bare = db.execute(
        "select r.status, s.provider_op from remediations r join remediation_steps s on s.remediation_id = r.id "
        "where r.node = ? and s.step = 'vm_restart'", (BARE_METAL,)).fetchall()  # fmt: skip
    assert bare and {status for status, _ in bare} == {"succeeded"}, bare
    assert {json.loads(op)["provider"] for _, op in bare} == {"redfish"}, bare
    assert summary["vm_actions"][BARE_METAL] == len(bare), summary["vm_actions"]
    assert any(BARE_METAL in line for line in lines if "succeeded" in line)  # in the report like the others
    # Two clusters on one database and one report: west's gpu-node-7 (an in-memory world) failed as
    # east's did; each was remediated through its own cluster's adapters (east's by its simulated
    # clouds, west's by its memory machines: never the other's), under its own cluster's name.
    by_cluster = db.execute("select cluster, node, status from remediations where node = ?", (WEST_NODE,)).fetchall()
    assert sorted(by_cluster) == [("east", WEST_NODE, "succeeded"), ("west", WEST_NODE, "succeeded")], by_cluster
    assert {c for (c,) in db.execute("select distinct cluster from remediations")} == {"east", "west"}
    west_steps = {op and json.loads(op).get("provider") for (op,) in db.execute(
        "select s.provider_op from remediation_steps s join remediations r on r.id = s.remediation_id "
        "where r.cluster = 'west' and s.step = 'vm_restart'")}  # fmt: skip
    assert west_steps == {"memory"}, west_steps
    assert {c for (c,) in db.execute("select distinct cluster from events")} == {"east", "west", "nvl"}
    assert set(summary["clusters"]) == {"east", "west", "nvl"} and summary["clusters"]["west"]["succeeded"] == 1
    report = "".join(lines)
    assert re.search(r"cluster east: \d+ remediation\(s\)", report) and "cluster west: 1 remediation(s), 1 succeeded" in report
    the_rack_was_one_domain_repair(db, summary, report)
    the_xid48_nodes_state_was_kept_before_the_hammer(db, summary, report)


def the_xid48_nodes_state_was_kept_before_the_hammer(db: sqlite3.Connection, summary: dict[str, Any],
                                                      report: str) -> None:
    """The Xid 48 nodes (gpu-memory, a class whose state is kept): an evidence Job on their Node before
    their first machine action, whose items hold what the simulated node's nvidia-smi and kernel said,
    and a line in the node's journal before each reboot."""
    rows = db.execute(
        "select r.node, s.step, s.id, s.status from remediation_steps s join remediations r on r.id = s.remediation_id"
        " where r.cluster = 'east' and r.node in (?, ?) order by s.id", XID48).fetchall()
    for node in XID48:
        steps = [step for n, step, _, _ in rows if n == node]
        assert steps.index("collect_evidence") < steps.index("vm_restart"), steps
    items = db.execute("select e.node, e.name, e.status, e.content from evidence_items e where e.cluster = 'east' and e.node in (?, ?)",
                       XID48).fetchall()
    got = {(node, name): (status, content) for node, name, status, content in items}
    for node in XID48:
        assert got[(node, "nvidia-smi-q")][0] == "collected" and "Serial Number" in got[(node, "nvidia-smi-q")][1]
        assert "Xid (PCI:0000:3b:00)" in got[(node, "kernel-log")][1]
    assert summary["evidence"]["journal_lines"] >= 2 and "collected evidence:" in report


def the_rack_was_one_domain_repair(db: sqlite3.Connection, summary: dict[str, Any], report: str) -> None:
    """The NVSwitch fault on two of the rack's trays: ONE domain repair for its 18 trays and no
    remediation of any tray (the database); a fabric-restart Job on each of the rack's Nodes and one
    Indexed Job, a pod on each of them, for the domain check (the simulated apiserver's records); every
    tray back in service with no VM action (the simulated cluster)."""
    repairs = db.execute("select id, cluster, kind, name, status, size, trays, reporters from domain_repairs").fetchall()
    assert [(c, k, n, st, size, json.loads(t)) for _, c, k, n, st, size, t, _ in repairs] == [
        ("nvl", *CLIQUE, "returned", 18, TRAYS)], repairs
    ((repair, *_, reporters),) = repairs
    assert set(json.loads(reporters)) == SXID_TRAYS
    assert db.execute("select count(*) from remediations where cluster = 'nvl'").fetchone() == (0,)
    steps = db.execute("select step, status, detail from domain_repair_steps where repair_id = ? order by id",
                       (repair,)).fetchall()
    assert [(step, status) for step, status, _ in steps] == [
        ("drain", "done"), ("jobs", "done"), ("fabric_restart", "done"), ("domain_check", "done"), ("return", "done")]
    started = {step: sorted(json.loads(detail)["refs"]) for step, _, detail in steps if step.endswith(("restart", "check"))}
    assert {s for (s,) in db.execute(
        f"select status from nodes where cluster = 'nvl' and name in ({','.join('?' * 18)})", TRAYS)} == {"healthy"}
    (rack,) = summary["nvlink_domains"]
    nodes = rack["k8s_nodes"]
    assert len(set(nodes)) == 18 and rack["trays"] == sorted(TRAYS, key=lambda t: int(t.rsplit("-", 1)[1]))
    fabric, check = rack["jobs"]["fabric_restart"], rack["jobs"]["domain_check"]
    assert (fabric["jobs"], fabric["indexed"], fabric["pods"], fabric["nodes"]) == (18, 0, 18, nodes), fabric
    assert (check["jobs"], check["indexed"], check["pods"], check["nodes"]) == (1, 1, 18, nodes), check
    assert fabric["names"] == started["fabric_restart"] and check["names"] == started["domain_check"]
    assert rack["other_jobs"] == [] and rack["tray_remediations"] == 0 and rack["vm_actions"] == 0
    assert rack["in_service"] == rack["trays"]
    assert (f"NVLink domain {' '.join(CLIQUE)} (cluster nvl): 1 domain repair for 18 trays, 0 tray remediations "
            "(not 18); fabric restart 18 Jobs on 18 Nodes, domain check 1 Job (1 Indexed, 18 pods on 18 Nodes); "
            "returned after") in " ".join(report.split())
