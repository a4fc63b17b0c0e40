"""``remediation demo``: the whole loop against three clusters, two of them speaking the real wire protocols.

In one process, in about a minute: cluster ``east``, :class:`remediation.simulator.cluster.SimCluster` (36 nodes, a
bare-metal pool of 4 among them), cluster ``west``, in memory, its nodes bearing east's names, and cluster
``nvl``, one simulated NVL72 rack; their production watchers, one real Celery worker, SQLite and the
dashboard. A scripted scenario shows each safety rule once; :mod:`remediation.demo.report` reads the
summaries back from the database and the simulated clusters' own records.

Why: docs/running.md#the-demo
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console

from remediation.hostlist import compress
from remediation.simulator.cluster import CLIQUE_LABEL, SUBBLOCK_LABEL, NvlRack

NODES = 32
BARE_METAL = 4  # gpu-node-32..35: Nodes without a providerID, systems of one Redfish BMC
# The Llama 3 failure mix shipped with the package (remediation/data), found as a package resource.
TRACE = Path(str(resources.files("remediation.data").joinpath("llama3-405b-interruptions.csv")))
DEMO_ENV = {
    # The demo prints its own story; the worker's per-task log lines would bury it (set INFO to see them).
    "REMEDIATION_LOG_LEVEL": "WARNING",
    "REMEDIATION_WORKFLOW__POLL_INTERVAL_S": "0.5",
    "REMEDIATION_WORKFLOW__SWEEP_INTERVAL_S": "2",
    "REMEDIATION_WORKFLOW__LEASE_S": "15",
    "REMEDIATION_WORKFLOW__VERIFY_TIMEOUT_S": "30",
    "REMEDIATION_WORKFLOW__LADDER": '["restart"]',
    "REMEDIATION_POLICY__MIN_RESTART_GAP_S": "0.5",
    "REMEDIATION_POLICY__BREAKER_WINDOW_S": "15",
    # The five unrelated faults of the first seconds are not a storm; the storm's seven nodes (19%) are.
    "REMEDIATION_POLICY__BREAKER_MAX_FRACTION": "0.15",
    # The breaker latches until a human closes it; the unattended demo opts in to closing by itself.
    "REMEDIATION_POLICY__BREAKER_AUTO_CLOSE_S": "15",
    "REMEDIATION_SLURM__POLL_INTERVAL_S": "0.25",
    "REMEDIATION_SLURM__NOT_RESPONDING_GRACE_S": "1.5",
    "REMEDIATION_KUBE__RESYNC_INTERVAL_S": "30",
    # A real validation: each node's check runs as a batch/v1 Job on its Node (remediation.simulator.kube.jobs).
    "REMEDIATION_VALIDATION__BACKEND": "kubernetes",
    "REMEDIATION_VALIDATION__POLL_INTERVAL_S": "0.5",
    # Failure domains from the GKE Nodes' sub-block label (remediation.simulator.cluster), on the demo's clock: a
    # switch takes its nodes out within a second here, so 10 s is the window and the wait before a
    # labelled node's first VM action. The demo packs weeks of faults into a minute, so two unrelated
    # ones side by side in a 4-node sub-block (gpu-node-4's Xid and a storm node) are likely here, as
    # they are not at real rates (docs/policy.md): the demo asks for all of a sub-block (F=1, K=4).
    # The NVLink domain of cluster nvl's trays, from their Nodes' clique label (GPU Feature Discovery's).
    "REMEDIATION_INCIDENTS__LABEL_KEYS": f'["{SUBBLOCK_LABEL}", "{CLIQUE_LABEL}"]',
    "REMEDIATION_INCIDENTS__WINDOW_S": "10",
    "REMEDIATION_INCIDENTS__VM_GRACE_S": "10",
    "REMEDIATION_INCIDENTS__MIN_FRACTION": "1.0",
}
LEMON, HBM, STORM_AT, REPLAY_AT = "gpu-node-9", "gpu-node-6", 20.0, 37.0
HANG = f"gpu-node-{NODES + 1}"  # the bare-metal scene's node
SWITCH_DOWN_AT, SWITCH_UP_AT = 6.0, 14.0
SUBBLOCK = "sb-2"  # gpu-node-16, -18, -20, -22: no other scene touches them
LEAF = f"leaf-{SUBBLOCK}"  # the switch behind that rack
FEATURED = ("gpu-node-3", "gpu-node-4", "gpu-node-5", HBM, "gpu-node-7", LEMON, "gpu-node-12")
REPLAY_NODES = [f"gpu-node-{i}" for i in (13, 14, 15, 26, 27, 28, 29, 30, 31)]
# The two clusters (docs/running.md, "Many clusters"): east is the simulated cluster above; west an
# in-memory world (its own Slurm, Kubernetes and machines) whose nodes bear east's names, and whose
# gpu-node-7 fails as east's does, each remediated by its own cluster's adapters.
EAST, WEST = "east", "west"
WEST_ENTRY = {"name": WEST, "slurm": {"backend": "memory", "poll_interval_s": 0.25},
              "kube": {"backend": "memory", "min_condition_s": 1.0, "resync_interval_s": 30},
              "machine": {"backend": "memory"}, "validation": {"backend": "none"},
              "memory": {"nodes": "gpu-node-[0-7]"}}  # fmt: skip
WEST_FAULT_AT, WEST_NODE = 8.0, "gpu-node-7"
# The NVL72 rack (docs/running.md, "The demo"): cluster nvl, 18 compute trays of one NVLink domain. A
# cluster of its own: a domain repair counts as all its trays toward the storm breaker, and in east's
# 36-node pool 18 trays would trip it and change every other scene. Its validation is east's (a Job per
# check on the simulated apiserver); validation.fabric_restart and validation.domain_checks keep their
# defaults, which the simulated apiserver runs like any check (it models Pod Security, not deploy/'s
# ValidatingAdmissionPolicy, which admits only validation.checks and the GPU reset: a site lists the
# fabric restart and the domain check there too).
NVL, TRAYS, NVSWITCH_AT = "nvl", 18, 7.0
RACK = NvlRack(clique="5f0b8a8e-3c1d-4e7a-9b2f-6d4c2a1e0b9c.1")
SXID_TRAYS = ("nvl-tray-3", "nvl-tray-11")  # the trays whose drivers log the failed NVSwitch's SXID


def switched(cluster: Any) -> list[str]:
    """The nodes behind the leaf switch that fails: sub-block ``SUBBLOCK``'s, as their Nodes' labels say."""
    nodes = list(cluster.subblocks[SUBBLOCK])
    if overlap := set(nodes) & {*FEATURED, *REPLAY_NODES}:
        raise ValueError(f"sub-block {SUBBLOCK} holds nodes other scenes use: {sorted(overlap)}")
    return nodes


def scenario(cluster: Any) -> list[tuple[float, str, Callable[[], object]]]:
    """(seconds after start, what, action)."""
    leaf = switched(cluster)
    return [
        (1.0, "researcher: scontrol update nodename=gpu-node-7 state=fail reason='xid 79'",
         lambda: cluster.researcher_fail("gpu-node-7", "xid 79: GPU fell off the bus")),
        (1.0, "gpu-node-3: slurmd stops answering (NIC)", lambda: cluster.slurmd_stop("gpu-node-3")),
        (1.0, "admin: drain gpu-node-12 reason='maintenance: PSU swap'",
         lambda: cluster.human_drain("gpu-node-12", "maintenance: PSU swap")),
        (1.5, "gpu-node-5: Ready flapping every 0.2s for 4s", lambda: cluster.flap("gpu-node-5", 0.4, 4.0)),
        (2.0, f"{LEMON}: lemon (broken VM), xid 48", lambda: cluster.repeat_offender(LEMON)),
        (3.0, f"{HBM}: bad HBM row (xid 48); a reboot does not cure it", lambda: cluster.bad_hbm(HBM)),
        (SWITCH_DOWN_AT, f"leaf switch {LEAF} dies: {', '.join(leaf)} ({SUBBLOCK}) lose slurmd at once",
         lambda: cluster.switch_down(leaf, LEAF)),
        (10.0, f"{HANG} (bare metal): slurmd hangs", lambda: cluster.slurmd_stop(HANG)),
        (SWITCH_UP_AT, f"leaf switch {LEAF} replaced: its nodes answer again", lambda: cluster.switch_up(leaf, LEAF)),
        (17.0, "gpu-node-4: GpuXidError=True on its Node", lambda: cluster.gpu_condition("gpu-node-4")),
        (STORM_AT, "mass failure: slurmd stops on 20% of the pool at once, across racks and clouds",
         lambda: cluster.storm(0.2, exclude=(*FEATURED, *REPLAY_NODES, *leaf, *cluster.names[NODES:]))),
        (REPLAY_AT, "Llama 3 trace: 12 s segment, scaled to 32 nodes",
         lambda: cluster.replay(TRACE, speedup=54 * 86400 / 60, seed=7, until_s=12, nodes=REPLAY_NODES)),
    ]  # fmt: skip


def run_demo(
    workdir: Path, timeout_s: float = 120.0, console: Console | None = None, *, port: int = 8080
) -> dict[str, Any]:
    """Run the scenario; returns the summary read back from the database (see remediation.demo.report)."""
    console = console or Console()
    admin_token = secrets.token_urlsafe(16)
    cluster, rack = _simulate(workdir, admin_token)
    _quiet()
    from remediation.demo.report import Progress, read_summary
    from remediation.settings import load_settings
    from remediation.watchers.runtime import Stopper
    from remediation.workers.embedded import join_all, start

    settings = load_settings()
    emb = start()
    stopper = Stopper(install=False)
    watchers = _start_watchers(settings, stopper)
    server, url, serving = _serve_dashboard(settings, port)
    dashboard = {"url": url, "token": admin_token, "status": _check_dashboard(url, admin_token)}
    console.print(
        f"[bold]node-remediation demo[/]: cluster {EAST}, {NODES + BARE_METAL} simulated nodes (GCE + Azure, "
        f"{BARE_METAL} bare metal behind a Redfish BMC), cluster {WEST}, "
        f"{settings.for_cluster(WEST).memory.nodes} in memory, and cluster {NVL}, one NVL72 rack of {TRAYS} "
        f"trays ({compress(rack.names)}); database {settings.database.url}"
    )
    console.print(f"dashboard: {url}  (admin token: {admin_token})")
    progress = Progress(settings, console)
    started = time.monotonic()
    try:
        _inject([*scenario(cluster), west_scene(settings), rack_scene(rack)], progress, console=console,
                started=started)
        deadline = started + timeout_s
        while time.monotonic() < deadline and not (
            time.monotonic() - started > REPLAY_AT + 8 and progress.settled(min_remediations=15)
        ):
            progress.poll(time.monotonic() - started)
            if time.monotonic() - started > REPLAY_AT + 15 and dashboard["status"] == 200:
                dashboard["status_late"] = _check_dashboard(url, admin_token)
            time.sleep(0.5)
        progress.poll(time.monotonic() - started)
        dashboard["status_end"] = _check_dashboard(url, admin_token)
        summary = read_summary(settings, cluster, timed_out=time.monotonic() >= deadline, simulated=EAST,
                               racks={NVL: rack})
    finally:
        # Everything started here ends here, in the order data flows, before the interpreter exits: a
        # thread still writing a log line or holding a connection while Python finalizes aborts the
        # process (SIGABRT) after the report has printed.
        stopper.stop()
        join_all(watchers, 30.0, "the demo's watchers")
        server.should_exit = True
        join_all([serving], 30.0, "the dashboard")
        emb.stop()
        rack.stop()
        cluster.stop()
    summary["dashboard"] = dashboard
    progress.print_summary(summary)
    return summary


def _simulate(workdir: Path, admin_token: str) -> tuple[Any, Any]:
    """Start east's simulated cluster and nvl's rack, and point the environment at them (each under its
    cluster's name), at the demo's settings and at ``admin_token``."""
    from remediation.simulator.cluster import SimCluster, Timing
    from remediation.workers.embedded import configure_environment

    timing = Timing(reboot_delay_s=1.5, op_seconds=1.0)
    cluster = SimCluster(NODES, timing=timing, bare_metal=BARE_METAL).start()
    rack = SimCluster(TRAYS, timing=timing, rack=RACK).start()
    configure_environment(workdir, DEMO_ENV)
    os.environ.update(cluster.settings_overrides(min_condition_s=1.0))
    os.environ["REMEDIATION_API__ADMIN_TOKENS"] = f'["{admin_token}"]'
    name_the_clusters(workdir, {NVL: rack.settings_overrides(min_condition_s=1.0)})
    return cluster, rack


def name_the_clusters(workdir: Path, others: dict[str, dict[str, str]]) -> None:
    """Make the environment the demo's clusters: every setting of a section each cluster has its own of
    (the simulated cluster's endpoints and tokens, the demo's pace) becomes cluster east's
    (``REMEDIATION_CLUSTERS__EAST__...``); each of ``others`` (a name, its simulated cluster's endpoints)
    gets its endpoints and the demo's pace; a config file in ``workdir`` lists them and west."""
    import yaml

    from remediation.settings.clusters import CLUSTER_SECTIONS
    from remediation.simulator.cluster import as_entry

    east = {key: os.environ.pop(key) for key in [k for k in os.environ if k.startswith("REMEDIATION_")]
            if key.removeprefix("REMEDIATION_").split("__")[0].lower() in CLUSTER_SECTIONS}
    os.environ.update(as_entry(east, EAST))
    pace = {key: value for key, value in east.items() if key in DEMO_ENV}
    for name, endpoints in others.items():
        os.environ.update(as_entry({**pace, **endpoints}, name))
    config = workdir / "clusters.yaml"
    clusters = [{"name": EAST}, *({"name": name} for name in others), WEST_ENTRY]
    config.write_text(yaml.safe_dump({"clusters": clusters}, sort_keys=False))
    os.environ["REMEDIATION_CONFIG"] = str(config)


def west_scene(settings: Any) -> tuple[float, str, Callable[[], object]]:
    """West's fault: its own gpu-node-7 fails, as a researcher's state=fail shows it in its Slurm."""
    from remediation.adapters.factory import make_world

    world = make_world(settings.for_cluster(WEST))  # the one west's watchers and worker share
    return (WEST_FAULT_AT, f"{WEST}: researcher: scontrol update nodename={WEST_NODE} state=fail reason='xid 79' "
            f"(west's own {WEST_NODE}, not east's)",
            lambda: world.set_slurm(WEST_NODE, flags=["FAIL"], reason="xid 79: GPU fell off the bus"))


def rack_scene(rack: Any) -> tuple[float, str, Callable[[], object]]:
    """nvl's fault: an NVSwitch of the rack fails, and the health check drains the trays that log its SXID."""
    return (NVSWITCH_AT, f"{NVL}: an NVSwitch of the NVL72 rack fails (SXID 12028); the health check drains "
            f"{' and '.join(SXID_TRAYS)}, two of the {TRAYS} trays of its NVLink domain",
            lambda: rack.nvswitch_fault(list(SXID_TRAYS)))


def _start_watchers(settings: Any, stopper: Any) -> list[threading.Thread]:
    """Each cluster's Slurm watcher, and its Kubernetes watcher where it has an API server to watch (the
    in-memory world has none: its Nodes are the workers' adapters' only), each in a daemon thread with
    its own bus on its own cluster's stream, started."""
    from remediation.adapters.factory import make_bus
    from remediation.watchers.kube.watcher import run as run_kube_watcher
    from remediation.watchers.slurm.watcher import run as run_slurm_watcher

    watchers = [
        threading.Thread(target=target, args=(one, stopper, make_bus(one)), name=f"{kind}-watcher-{name}", daemon=True)
        for name, one in settings.fleet().items()
        for target, kind in ((run_slurm_watcher, "slurm"), (run_kube_watcher, "kube"))
        if kind == "slurm" or one.kube.backend == "kubernetes"
    ]
    for thread in watchers:
        thread.start()
    return watchers


def _inject(scenes: list[tuple[float, str, Callable[[], object]]], progress: Any, *, console: Console,
            started: float) -> None:
    """Inject the scenes' faults, each at its time after ``started``, polling progress between."""
    for at, what, action in sorted(scenes, key=lambda scene: scene[0]):
        while time.monotonic() - started < at:
            progress.poll(time.monotonic() - started)
            time.sleep(0.25)
        action()
        console.print(f"[{time.monotonic() - started:5.1f}s] [yellow]fault[/] {what}")


def _serve_dashboard(settings: Any, port: int) -> tuple[Any, str, threading.Thread]:
    """uvicorn in a thread on 127.0.0.1 (port 0 = any free port); returns the server, its URL and the
    thread serving it."""
    import uvicorn

    from remediation.adapters.queues import queue_depth
    from remediation.api.app import create_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    from remediation.adapters.celery import celery_dispatcher

    app = create_app(settings, queue_depth=lambda: queue_depth(settings), dispatcher=celery_dispatcher(settings))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    serving = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="dashboard", daemon=True)
    serving.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{sock.getsockname()[1]}", serving


def _check_dashboard(url: str, token: str) -> int:
    """The dashboard's JSON overview, as on-call would fetch it; the HTTP status (0 if unreachable)."""
    import httpx

    try:
        return httpx.get(
            f"{url}/api/v1/overview", headers={"Authorization": f"Bearer {token}"}, timeout=5
        ).status_code
    except httpx.HTTPError:
        return 0


def _quiet() -> None:
    """The demo prints its own story; keep library chatter (Celery's start-up notices, the cloud
    SDKs' request logs) out of it."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", module="celery.platforms")
    for name in ("celery", "kombu", "amqp", "azure", "urllib3", "httpx", "watchers", "workers"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    """``remediation demo`` execs this (``python -m remediation.demo.run``); exit 1 if the scenario timed out."""
    import argparse
    import json
    import sys
    import tempfile

    parser = argparse.ArgumentParser(prog="remediation demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None,
                        help="Where the demo's SQLite database and its summary.json go.")
    parser.add_argument("--timeout", type=float, default=180.0, help="Give up after this many seconds.")
    parser.add_argument("--port", type=int, default=8080, help="Dashboard port on 127.0.0.1 (0: any free port).")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="remediation-demo-"))
    summary = run_demo(workdir, timeout_s=args.timeout, port=args.port)
    # What was printed, as data beside the database (the cluster's logs die with the process).
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    if running := [t.name for t in threading.enumerate() if t is not threading.main_thread()]:
        # Nothing may run while the interpreter finalizes (see run_demo): say so rather than risk it.
        print(f"remediation demo: threads still running at exit: {', '.join(running)}", file=sys.stderr)
        return 1
    return 1 if summary["timed_out"] else 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
