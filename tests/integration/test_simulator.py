"""The simulated cluster, observed only through the real adapters and clients.

Each fault injection is checked the way the service would see it: Slurm through the ``rest`` backend
(httpx to the slurmrestd stand-in, JWT headers), Kubernetes through the ``kubernetes`` client adapter
with the ``pod`` mapping, VMs through the GCE and Azure SDK adapters. The trace replay is checked for
its scaling, its mapping of categories to signals and its determinism; the continuous replay that
docker-compose runs for its rounds, storms and ends of maintenance; the standalone mode (fixed ports,
an advertised host name, the env file) through the same adapters.
"""

from __future__ import annotations

import shlex
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from remediation.adapters.cloud.router import make_vm_provider
from remediation.adapters.kube.adapter import make_kube
from remediation.adapters.slurm.rest import RestSlurm
from remediation.domain.providerid import parse_provider_id
from remediation.ports.cluster import VMAction
from remediation.ports.errors import ControllerUnreachable, CredentialError, UnknownNode
from remediation.rehearsal.trace import read_mix
from remediation.settings import Settings, SettingsError, load_settings
from remediation.simulator import replay
from remediation.simulator.cluster import CLIQUE_LABEL, Listen, NvlRack, SimCluster, Timing
from remediation.simulator.continuous import ContinuousReplay, Storms, Tempo
from remediation.simulator.noise import NOISE_KINDS, NoisePace, NoiseReplay, Thresholds
from tests.pace import within
from tests.ports import lease

TRACE = Path(__file__).resolve().parents[2] / "remediation" / "data" / "llama3-405b-interruptions.csv"
FAST = Timing(op_seconds=0.1, reboot_delay_s=0.3)  # a cloud operation and a boot, quick enough for tests


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimCluster]:
    with SimCluster(8, timing=Timing(op_seconds=0.1, reboot_delay_s=0.3, slurmd_timeout_s=1.0), seed=3) as sim:
        yield sim


@pytest.fixture(scope="module")
def settings(cluster: SimCluster) -> Settings:
    kwargs: dict[str, Any] = cluster.settings_kwargs(min_condition_s=0.5)
    return load_settings(**kwargs)


@pytest.fixture(scope="module")
def slurm(settings: Settings) -> Iterator[RestSlurm]:
    with RestSlurm(settings.slurm) as rest:
        yield rest


def until(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = within(timeout)
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout}s")


def test_settings_point_the_real_adapters_at_the_simulator(cluster: SimCluster, settings: Settings) -> None:
    assert settings.slurm.backend == "rest" and settings.slurm.rest_url == cluster.slurmrestd.url
    assert settings.kube.mapping == "pod" and settings.machine.backend == "auto"
    assert settings.machine.azure_test_token is not None and settings.machine.azure_endpoint.startswith(
        "https://127.0.0.1"
    )
    with pytest.raises(SettingsError, match="azure_test_token"):
        load_settings(machine={"azure_endpoint": "https://management.azure.com", "azure_test_token": "x"})


def test_slurm_reads_and_refusals_are_slurmrestds(
    cluster: SimCluster, settings: Settings, slurm: RestSlurm
) -> None:
    assert {n.name for n in slurm.list_nodes()} == set(cluster.names)
    with pytest.raises(UnknownNode, match="Failure to query node gpu-node-99"):  # as 24.11's v0.0.40+ says
        slurm.get_node("gpu-node-99")
    slurm.resume("gpu-node-6")  # slurmrestd refuses (errno 2028, a 500): already in service is success
    assert slurm.get_node("gpu-node-6").state == "IDLE"
    # update_time: 304 once nothing changed since the last full read (Slurm's times have 1 s
    # resolution, so a change in the second of the read keeps answering the full document).
    until(lambda: slurm.poll() is None, timeout=5)
    cluster.human_drain("gpu-node-7", "admin: check cabling")
    changed = slurm.poll()
    assert changed is not None and changed["gpu-node-7"].flags == {"DRAIN"}
    slurm.resume("gpu-node-7")
    wrong = settings.slurm.model_copy(update={"rest_token": None})
    with pytest.raises(CredentialError, match="401"), RestSlurm(wrong) as refused:
        refused.list_nodes()


def test_researcher_fail_is_seen_by_the_rest_adapter(cluster: SimCluster, slurm: RestSlurm) -> None:
    cluster.researcher_fail("gpu-node-1", "xid 79", user="alice")
    node = {n.name: n for n in slurm.list_nodes()}["gpu-node-1"]
    assert node.flags == {"FAIL"} and node.reason == "xid 79" and node.reason_user == "alice"
    assert node.reason_time is not None
    slurm.drain("gpu-node-1", "remediation: xid 79")
    drained = slurm.get_node("gpu-node-1")
    assert drained.flags == {"FAIL", "DRAIN"} and drained.reason_user == "remediation"
    slurm.resume("gpu-node-1")
    assert slurm.get_node("gpu-node-1").flags == frozenset() and slurm.get_node("gpu-node-1").reason == ""


def test_human_drain_carries_the_admins_reason(cluster: SimCluster, slurm: RestSlurm) -> None:
    cluster.human_drain("gpu-node-5", "maintenance: PSU swap")
    node = slurm.get_node("gpu-node-5")
    assert node.flags == {"DRAIN"} and node.reason == "maintenance: PSU swap" and node.reason_user == "root"
    slurm.resume("gpu-node-5")


def test_slurmd_stop_goes_not_responding_then_down(cluster: SimCluster, slurm: RestSlurm) -> None:
    cluster.slurmd_stop("gpu-node-3")
    first = until(lambda: (n := slurm.get_node("gpu-node-3")).flags and n)
    assert first.state == "IDLE" and first.flags == {"NOT_RESPONDING"}
    down = until(lambda: (n := slurm.get_node("gpu-node-3")).state == "DOWN" and n)
    assert down.reason == "Not responding" and "NOT_RESPONDING" in down.flags


def test_a_slurmctld_stall_times_out_every_call_then_ends(cluster: SimCluster, slurm: RestSlurm) -> None:
    """slurmrestd waits MessageTimeout for a stalled slurmctld, then answers errno 5004: the adapter
    reads that as an unreachable controller (a systemic error, never a node's), reads and writes alike."""
    cluster.slurmctld_stall(1.5)
    started = time.monotonic()
    with pytest.raises(ControllerUnreachable, match="Socket timed out"):
        slurm.list_nodes()
    assert time.monotonic() - started >= 0.9  # it waited for slurmctld before giving up
    with pytest.raises(ControllerUnreachable):
        slurm.drain("gpu-node-6", "remediation: during a stall")
    until(lambda: cluster.ctld.stall_left() == 0, timeout=5)
    assert slurm.get_node("gpu-node-6").flags == frozenset()  # the refused drain never happened
    assert cluster.injections[-1].kind == "slurmctld_stall" and cluster.injections[-1].node == ""


def test_a_slurmd_blip_is_not_responding_never_down(cluster: SimCluster, slurm: RestSlurm) -> None:
    cluster.slurmd_blip("gpu-node-6", 0.6)  # shorter than the cluster's SlurmdTimeout (1 s)
    seen: set[str] = set()
    deadline = within(10)
    while True:  # until the blip is over: slurmd answers again, so DOWN can no longer come
        node = slurm.get_node("gpu-node-6")
        seen |= {node.state, *node.flags}
        if "NOT_RESPONDING" in seen and node.flags == frozenset():
            break
        assert time.monotonic() < deadline, f"the blip never ended: {seen}"
        time.sleep(0.05)
    assert "DOWN" not in seen, seen
    node = slurm.get_node("gpu-node-6")
    assert node.state == "IDLE" and node.flags == frozenset() and node.reason == ""


def test_app_xid_and_condition_pulses_clear_themselves(cluster: SimCluster, settings: Settings) -> None:
    kube = make_kube(settings)
    k8s = kube.node_for("gpu-node-5")
    cluster.app_xid("gpu-node-5", 13, 0.4)
    cluster.condition_pulse("gpu-node-5", "FrequentContainerdRestart", 0.4, kind="npd_condition")

    def npd() -> str:  # a condition the policy does not watch: as the apiserver holds it
        return str(next(c["status"] for c in cluster.kube.node(k8s)["status"]["conditions"]
                        if c["type"] == "FrequentContainerdRestart"))

    assert kube.get(k8s).conditions["GpuXidError"] == "True" and npd() == "True"
    until(lambda: kube.get(k8s).conditions["GpuXidError"] == "False")
    until(lambda: npd() == "False")
    logged = [(i.kind, i.detail) for i in cluster.injections[-2:]]
    assert logged[0][0] == "app_xid" and "Xid (PCI:0000:3b:00): 13," in logged[0][1]
    assert logged[1][0] == "npd_condition"


def test_an_nvl72_rack_is_one_clique_of_gce_trays_and_an_nvswitch_fault_drains_who_logs_it() -> None:
    """``rack=``: every tray a GCE VM whose Node carries the rack's clique label (read through the real
    client, as the watcher reads it); ``nvswitch_fault`` drains the named trays with the driver's SXID line."""
    with SimCluster(4, timing=FAST, rack=NvlRack(clique="c0ffee.1")) as sim:
        settings = load_settings(**sim.settings_kwargs())
        kube = make_kube(settings)
        assert sim.names == [f"nvl-tray-{i}" for i in range(4)]
        nodes = kube.api.list_node().items
        assert {n.metadata.name: n.metadata.labels.get(CLIQUE_LABEL) for n in nodes} == {
            f"gke-a4x-pool-{i}": "c0ffee.1" for i in range(4)}
        assert {parse_provider_id(n.spec.provider_id).provider for n in nodes} == {"gce"}
        sim.nvswitch_fault(["nvl-tray-1", "nvl-tray-2"])
        with RestSlurm(settings.slurm) as slurm:
            drained = {n.name: n for n in slurm.list_nodes() if n.flags}
        assert sorted(drained) == ["nvl-tray-1", "nvl-tray-2"]
        assert all(n.flags == {"DRAIN"} and "SXid" in n.reason for n in drained.values())


def test_node_not_ready_and_gpu_condition_via_the_kube_adapter(
    cluster: SimCluster, settings: Settings
) -> None:
    kube = make_kube(settings)
    k8s = kube.node_for("gpu-node-2")  # through the slurmd pod's spec.nodeName
    assert k8s == cluster.link("gpu-node-2").k8s != "gpu-node-2"
    cluster.node_not_ready("gpu-node-2")
    assert kube.get(k8s).ready == "False"
    cluster.gpu_condition("gpu-node-2")
    assert kube.get(k8s).conditions["GpuXidError"] == "True"


def test_flap_toggles_ready_and_ends_ready(cluster: SimCluster, settings: Settings) -> None:
    kube = make_kube(settings)
    k8s = kube.node_for("gpu-node-7")
    cluster.flap("gpu-node-7", period_s=0.2, duration_s=1.0)
    seen = set()
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        seen.add(kube.get(k8s).ready)
        time.sleep(0.02)
    assert seen == {"True", "False"}
    until(lambda: kube.get(k8s).ready == "True")
    time.sleep(0.3)
    assert kube.get(k8s).ready == "True"


@pytest.mark.parametrize("node", ["gpu-node-0", "gpu-node-4"], ids=["gce-down-node", "gce-drained-node"])
def test_vm_restart_reboots_the_node_and_reregisters_slurmd(
    cluster: SimCluster, settings: Settings, slurm: RestSlurm, node: str
) -> None:
    kube, vm = make_kube(settings), make_vm_provider(settings)
    k8s = kube.node_for(node)
    before = kube.get(k8s)
    if node == "gpu-node-0":
        cluster.slurmd_stop(node)
        until(lambda: slurm.get_node(node).state == "DOWN")
    else:
        slurm.drain(node, "remediation: test")
    actions = cluster.vm_actions(node)
    op = vm.start(parse_provider_id(before.provider_id), VMAction.RESTART, f"test-{node}")
    until(lambda: kube.get(k8s).ready == "Unknown", timeout=2)  # the VM is down during the operation
    until(lambda: vm.poll(op).done)
    after = until(lambda: (n := kube.get(k8s)).ready == "True" and n.boot_id != before.boot_id and n)
    assert after.boot_id != before.boot_id
    registered = until(lambda: "NOT_RESPONDING" not in (n := slurm.get_node(node)).flags and n)
    if node == "gpu-node-0":  # ReturnToService=1: a node DOWN for "Not responding" comes back IDLE
        assert registered.state == "IDLE" and registered.reason == ""
    else:  # our drain survives the reboot, for our workflow to lift
        assert registered.flags == {"DRAIN"} and registered.reason == "remediation: test"
        slurm.resume(node)
    assert cluster.vm_actions(node) == actions + 1


def test_azure_restart_through_the_sdk_reboots_the_node(
    cluster: SimCluster, settings: Settings, slurm: RestSlurm
) -> None:
    kube, vm = make_kube(settings), make_vm_provider(settings)
    k8s = kube.node_for("gpu-node-5")
    before = kube.get(k8s)
    assert before.provider_id.startswith("azure:///subscriptions/")
    op = vm.start(parse_provider_id(before.provider_id), VMAction.RESTART, "test-azure")
    until(lambda: vm.poll(op).done)
    until(lambda: kube.get(k8s).boot_id != before.boot_id and kube.get(k8s).ready == "True")
    until(lambda: not slurm.get_node("gpu-node-5").flags)
    assert cluster.vm_actions("gpu-node-5") == 1 and cluster.vm("gpu-node-5")["boot_count"] == 2


def test_repeat_offender_stays_broken_after_a_restart(
    cluster: SimCluster, settings: Settings, slurm: RestSlurm
) -> None:
    kube, vm = make_kube(settings), make_vm_provider(settings)
    k8s = kube.node_for("gpu-node-6")
    before = kube.get(k8s)
    cluster.repeat_offender("gpu-node-6")
    assert slurm.get_node("gpu-node-6").flags == {"FAIL"}
    op = vm.start(parse_provider_id(before.provider_id), VMAction.RESTART, "test-lemon")
    until(lambda: vm.poll(op).done)
    until(lambda: kube.get(k8s).boot_id != before.boot_id)
    time.sleep(1.5)  # longer than slurmd_timeout: a healthy slurmd would have registered
    node = slurm.get_node("gpu-node-6")
    assert node.state == "DOWN" and "NOT_RESPONDING" in node.flags  # slurmd never came back
    # Read after the wait: the new bootID is written a moment before the kubelet reports Ready.
    now = kube.get(k8s)
    assert now.conditions["GpuXidError"] == "True" and now.ready == "True"


def test_storm_hits_the_requested_fraction(cluster: SimCluster, slurm: RestSlurm) -> None:
    hit = cluster.storm(0.25, exclude=("gpu-node-0", "gpu-node-3", "gpu-node-6"))
    assert len(hit) == 2 and not set(hit) & {"gpu-node-0", "gpu-node-3", "gpu-node-6"}
    down = until(lambda: {n.name for n in slurm.list_nodes() if n.state == "DOWN"} >= set(hit) and True)
    assert down
    assert {i.node for i in cluster.injections if i.kind == "storm"} == set(hit)


# ------------------------------------------------------------------------------------------ replay


def test_trace_scaled_to_the_paper_size_is_the_published_mix() -> None:
    rows = read_mix(TRACE)
    nodes = [f"n{i}" for i in range(2048)]
    plan = replay.plan(rows, nodes, speedup=1e6, seed=1)
    by_category = Counter(f.category for f in plan)
    assert by_category == {r.category: r.count for r in rows} and len(plan) == 419
    gpu = sum(1 for f in plan if f.component == "GPU")
    assert gpu == 268 and round(gpu / len(plan), 3) == 0.640  # the counts' share (the paper prints 58.7%)
    remediable = [f for f in plan if f.remediable]
    assert len(remediable) == 289
    kinds = Counter(f.kind for f in plan)
    assert kinds["none"] == 54 + 7 + 2  # software bugs, NCCL timeouts, dependencies: no node signal
    assert kinds["human_drain"] == 32 and kinds["slurmd_stop"] == 7 + 2
    assert all(len(f.nodes) == 4 for f in plan if f.category == "Network Switch/Cable")
    assert all(f.at_s < 54 * 86400 / 1e6 for f in plan)


def test_trace_scaled_to_32_nodes_is_deterministic() -> None:
    rows = read_mix(TRACE)
    nodes = [f"gpu-node-{i}" for i in range(32)]
    counts = replay.scaled_counts(rows, 32)
    assert sum(counts.values()) == round(419 * 32 / 2048) == 7
    assert {c: n for c, n in counts.items() if n} == {
        "Faulty GPU": 3, "GPU HBM3 Memory": 1, "Software Bug": 1, "Network Switch/Cable": 1, "Host Maintenance": 1,
    }  # fmt: skip
    first, again = (replay.plan(rows, nodes, speedup=1000, seed=5) for _ in range(2))
    other = replay.plan(rows, nodes, speedup=1000, seed=6)
    assert first == again and first != other
    assert Counter(f.category for f in other) == Counter(f.category for f in first)


def test_replay_injects_the_planned_faults_on_the_cluster_clock() -> None:
    with SimCluster(32, timing=FAST) as sim:
        plan = sim.replay(TRACE, speedup=54 * 86400 / 2.0, seed=11)  # 54 days in 2 seconds
        until(lambda: len({(i.node, i.detail) for i in sim.injections}) >= sum(len(f.nodes) for f in plan), 5)
        logged = Counter(i.kind for i in sim.injections)
        expected = Counter(k for f in plan for k in [f.kind] * len(f.nodes))
        assert logged == expected and sum(expected.values()) == 7 + 3  # the network fault hits 4 nodes
        for fault in plan:
            if fault.kind == "human_drain":
                assert sim.slurm_state(fault.nodes[0])[2].startswith("maintenance:")
            if fault.kind == "node_not_ready":
                assert all(sim.node_ready(n) == "False" for n in fault.nodes)


def test_continuous_replay_keeps_going_with_storms_and_ends_maintenance() -> None:
    with SimCluster(32, timing=FAST, seed=2) as sim:
        # Rounds of 0.5 s (the whole trace each), a storm every second, maintenance of 0.3 s.
        loop = ContinuousReplay(sim, TRACE, tempo=Tempo(speedup=54 * 86400 / 0.5, maintenance_s=0.3),
                                storms=Storms(every_s=1.0), seed=4).start()
        until(lambda: loop.rounds >= 4 and sum(i.kind == "storm" for i in sim.injections) >= 2 * 6, 10)
        kinds = Counter(i.kind for i in sim.injections)
        assert kinds["gpu_condition"] + kinds["researcher_fail"] >= 4  # the GPU-heavy mix, round after round
        drained = {i.node for i in sim.injections if i.kind == "human_drain"}
        assert drained, kinds  # seed 4 draws a maintenance drain within four rounds
        until(lambda: {i.node for i in sim.injections if i.kind == "maintenance_done"} >= drained, 5)
        assert not loop.in_maintenance - drained
    assert round(ContinuousReplay(sim, TRACE).round_s) == 140  # default: 7 faults at 32 nodes, ~20 s apart


def test_continuous_replay_faults_only_its_nodes() -> None:
    with SimCluster(8, timing=FAST, seed=2) as sim:
        mine = sim.names[:4]
        loop = ContinuousReplay(sim, TRACE, tempo=Tempo(speedup=54 * 86400 / 0.5, maintenance_s=0.3),
                                storms=Storms(every_s=0.5), seed=4, nodes=mine).start()
        until(lambda: loop.rounds >= 3 and sum(i.kind == "storm" for i in sim.injections) >= 2, 10)
        loop.stop()
        assert {i.node for i in sim.injections} <= set(mine)


def test_noise_replay_keeps_app_xids_below_the_repeat_count_and_stalls_slurmctld() -> None:
    with SimCluster(4, timing=FAST, seed=2) as sim:
        noise = NoiseReplay(sim, sim.names[2:], Thresholds(hold_s=0.2, grace_s=0.5, slurmd_timeout_s=1.0,
                                                           app_xid_limit=2),
                            pace=NoisePace(mean_gap_s=0.05, maintenance_s=0.2, stall_every_s=0.5, stall_s=0.1),
                            seed=5).start()
        until(lambda: len({i.kind for i in sim.injections} & NOISE_KINDS) >= 6, 10)
        noise.stop()
        until(lambda: time.monotonic() > noise.ends_at() + 0.3, 5)
        assert {i.node for i in sim.injections} <= {"", *sim.names[2:]}
        assert all(n <= 1 for n in Counter(i.node for i in sim.injections if i.kind == "app_xid").values())
        assert any(i.kind == "slurmctld_stall" for i in sim.injections)
        assert all(sim.slurm_state(n) == ("IDLE", frozenset(), "") for n in sim.names)  # every drain resumed
        assert all(sim.node_ready(n) == "True" for n in sim.names)


def test_continuous_replay_leaves_other_drains_alone() -> None:
    with SimCluster(4, timing=FAST) as sim:
        loop = ContinuousReplay(sim, TRACE, storms=Storms(every_s=0))
        sim.human_drain("gpu-node-1", "maintenance: PSU swap")
        sim.ctld.update("gpu-node-2", "DRAIN", "remediation: xid 79", user="remediation")
        sim.human_drain("gpu-node-3", "maintenance: PSU swap")
        sim.ctld.update("gpu-node-3", "DRAIN", "admin: keep it drained")  # the admin changed their mind
        loop.in_maintenance |= {"gpu-node-1", "gpu-node-2", "gpu-node-3"}
        for node in ("gpu-node-1", "gpu-node-2", "gpu-node-3"):
            loop._end_maintenance(node)
        assert sim.slurm_state("gpu-node-1")[1] == frozenset()
        assert "DRAIN" in sim.slurm_state("gpu-node-2")[1] and "DRAIN" in sim.slurm_state("gpu-node-3")[1]
        assert not loop.in_maintenance


# ------------------------------------------------------------------------------- standalone serving


@pytest.mark.parametrize(
    ("endpoint", "test_host", "allowed"),
    [
        ("https://127.0.0.1:7442", None, True),
        ("https://localhost:7442", None, True),
        ("https://simulator:7442", None, False),
        ("https://simulator:7442", "simulator", True),
        ("https://management.azure.com", "simulator", False),
        ("https://management.azure.com", "management.azure.com", False),
        ("https://simulator.example.com:7442", "simulator", False),
    ],
    ids=["loopback", "localhost", "named-host-not-allowed", "named-host-allowed", "real-arm",
         "dotted-host-refused", "fqdn-is-not-the-label"],
)  # fmt: skip
def test_azure_test_token_needs_loopback_or_the_named_simulator_host(
    endpoint: str, test_host: str | None, allowed: bool
) -> None:
    vm: dict[str, Any] = {"azure_endpoint": endpoint, "azure_test_token": "t"}
    if test_host is not None:
        vm["azure_test_host"] = test_host
    if allowed:
        assert load_settings(machine=vm).machine.azure_test_token is not None
    else:
        with pytest.raises(SettingsError, match="azure_test"):
            load_settings(machine=vm)


@pytest.fixture
def fixed_port_sim(tmp_path: Path) -> Iterator[SimCluster]:
    """A SimCluster on four consecutive fixed ports, leased until it has stopped."""
    with lease(4) as ports:
        listen = Listen(advertise="localhost", base_port=ports.port, state_dir=tmp_path, bind="127.0.0.1")
        sim = SimCluster(4, timing=FAST, listen=listen).start()
        try:
            yield sim
        finally:
            sim.stop()


def test_standalone_serves_fixed_ports_under_the_advertised_name(fixed_port_sim: SimCluster, tmp_path: Path) -> None:
    """What docker-compose does with --base-port/--advertise/--state-dir, checked through the real
    adapters: every URL names the advertised host (the Azure SDK verifies it against the certificate's
    SANs, and polls the operation URLs the fake hands out), and the env file holds it all."""
    sim = fixed_port_sim
    base = int(sim.kube.url.rsplit(":", 1)[1])
    assert [sim.kube.url, sim.gce.url, sim.azure.url, sim.slurmrestd.url] == [
        f"https://localhost:{base}", f"http://localhost:{base + 1}", f"https://localhost:{base + 2}",
        f"https://localhost:{base + 3}",
    ]  # fmt: skip
    sim.write_env_file(tmp_path / "simulator.env")
    env = _read_env_file(tmp_path / "simulator.env")
    assert env == sim.settings_overrides() and env["REMEDIATION_MACHINE__AZURE_CA_FILE"] == str(
        tmp_path / "cert.pem"
    )
    assert env["REMEDIATION_KUBE__CA_FILE"] == str(tmp_path / "kube-ca.crt")  # TLS-only, as a cluster
    assert oct((tmp_path / "simulator.env").stat().st_mode & 0o777) == "0o644"
    settings = load_settings(**sim.settings_kwargs())
    with RestSlurm(settings.slurm) as rest:
        assert {n.name for n in rest.list_nodes()} == set(sim.names)
    kube, vm = make_kube(settings), make_vm_provider(settings)
    k8s = kube.node_for("gpu-node-1")
    before = kube.get(k8s)
    op = vm.start(parse_provider_id(before.provider_id), VMAction.RESTART, "test-advertised")
    until(lambda: vm.poll(op).done)
    until(lambda: kube.get(k8s).boot_id != before.boot_id)


def _read_env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        (assignment,) = shlex.split(line.removeprefix("export "))
        key, _, value = assignment.partition("=")
        out[key] = value
    return out
