"""The ``rest`` backend against the real slurmrestd: 22.05's v0.0.38, and 24.11's v0.0.40, v0.0.41, v0.0.42.

Each test runs once per (Slurm release, API version) pair the release's slurmrestd serves (see
``pytest_generate_tests`` in conftest). Reads must agree with the commands; writes (24.11) must reach
slurmctld as the cli backend's do; slurmrestd's refusals must arrive typed, with their scope.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from remediation.adapters.slurm.cli import CliSlurm
from remediation.adapters.slurm.rest import RestSlurm, SlurmRestError
from remediation.ports.errors import ConfigError, NotSupported, Scope, UnknownNode
from tests.integration.slurm.conftest import SlurmCluster
from tests.pace import within

pytestmark = pytest.mark.slurm

RestFor = Callable[[str], RestSlurm]


@pytest.fixture
def rest_for(slurm: SlurmCluster) -> Iterator[RestFor]:
    """Opens the rest backend on an API version of this cluster's slurmrestd; each one is closed after
    the test (its pooled connection would otherwise stay open until garbage collection)."""
    with ExitStack() as opened:
        yield lambda api: opened.enter_context(RestSlurm(slurm.rest_settings(api)))


def test_reads_the_same_nodes_as_the_commands(slurm: SlurmCluster, rest_api: str, rest_for: RestFor) -> None:
    slurm.scontrol("update", "nodename=gpu-node-1", "state=fail", "reason=xid 79")
    rest = rest_for(rest_api)
    cli = CliSlurm(slurm.settings())
    assert sorted(rest.list_nodes(), key=lambda n: n.name) == sorted(cli.list_nodes(), key=lambda n: n.name)
    node = rest.get_node("gpu-node-1")
    assert node.flags == {"FAIL"} and node.reason == "xid 79" and node == cli.get_node("gpu-node-1")
    assert rest.running_jobs("gpu-node-1") == 0


def test_an_unknown_node_is_unknown_on_read_and_write(
    slurm: SlurmCluster, rest_api: str, rest_for: RestFor
) -> None:
    rest = rest_for(rest_api)
    with pytest.raises(UnknownNode) as read:
        rest.get_node("gpu-node-99")
    assert read.value.scope is Scope.NODE
    if rest_api == "v0.0.38":
        return  # read-only: writes are refused before anything is sent (next test)
    with pytest.raises(UnknownNode, match="Invalid node name specified"):
        rest.drain("gpu-node-99", "remediation: nowhere")


def test_drain_set_state_and_resume_reach_slurmctld(
    slurm: SlurmCluster, rest_api: str, rest_for: RestFor
) -> None:
    rest = rest_for(rest_api)
    if rest_api == "v0.0.38":
        with pytest.raises(NotSupported, match=r"not supported by this slurmrestd \(v0.0.38\)"):
            rest.drain("gpu-node-1", "remediation: x")
        with pytest.raises(NotSupported):
            rest.resume("gpu-node-1")
        assert slurm.nodes_now()["gpu-node-1"] == ("IDLE", frozenset(), "")
        return
    reason = f'remediation: xid 79 via {rest_api}; "quoted" $(id) & more'
    rest.drain("gpu-node-1", reason)
    assert slurm.nodes_now()["gpu-node-1"] == ("IDLE", frozenset({"DRAIN"}), reason)
    stamp = rest.get_node("gpu-node-1").reason_time
    time.sleep(1.1)  # reason times have 1 s resolution: a second drain must not restamp
    rest.drain("gpu-node-1", reason)
    assert rest.get_node("gpu-node-1").reason_time == stamp
    rest.resume("gpu-node-1")
    state, flags, _ = slurm.nodes_now()["gpu-node-1"]
    assert state == "IDLE" and not flags - {"NOT_RESPONDING"}
    rest.resume("gpu-node-1")  # slurmctld refuses (errno 2028, a 500); the goal is reached: success
    for target in ("FAIL", "DOWN"):
        rest.set_state("gpu-node-2", target, f"remediation: set {target}")  # type: ignore[arg-type]
        node = rest.get_node("gpu-node-2")
        assert target in node.states and node.reason == f"remediation: set {target}"
        rest.resume("gpu-node-2")
        assert not rest.get_node("gpu-node-2").states & {"FAIL", "DOWN", "DRAIN"}


def test_slurmctld_refusals_arrive_typed_with_slurms_errno(
    slurm: SlurmCluster, rest_api: str, rest_for: RestFor
) -> None:
    rest = rest_for(rest_api)
    if rest_api == "v0.0.38":
        # 22.05's slurmrestd has no node write at all: the server itself refuses the path.
        refused = rest.client.post(f"/slurm/{rest_api}/node/gpu-node-3", json={"state": ["DRAIN"], "reason": "x"})
        assert refused.status_code >= 400 and slurm.nodes_now()["gpu-node-3"] == ("IDLE", frozenset(), "")
        return
    # A node in service cannot be resumed: slurmrestd answers 500 (26.05: 422) with errors[] carrying
    # Slurm's errno (2028; 26.05: 2180), which the backend takes as the goal reached.
    response = rest.client.post(f"/slurm/{rest_api}/node/gpu-node-3", json={"state": ["RESUME"]})
    message, errno = slurm.resume_refusal
    with pytest.raises(SlurmRestError, match=message) as info:
        raise rest._error("POST", f"/slurm/{rest_api}/node/gpu-node-3", response)
    assert response.status_code == (422 if slurm.release >= (26, 5) else 500)
    assert info.value.scope is Scope.NODE and info.value.errnos == {errno}
    rest.resume("gpu-node-3")


def test_an_api_version_the_server_does_not_serve_is_a_configuration_fault(
    slurm: SlurmCluster, rest_api: str, rest_for: RestFor
) -> None:
    other = "v0.0.40" if rest_api == "v0.0.38" else "v0.0.38"
    rest = rest_for(other)
    with pytest.raises(ConfigError, match=slurm.unknown_path) as info:
        rest.list_nodes()
    assert info.value.scope is Scope.SYSTEM  # automation pauses; no node is blamed


def test_poll_is_free_when_nothing_changed(slurm: SlurmCluster, rest_api: str, rest_for: RestFor) -> None:
    rest = rest_for(rest_api)
    assert len(rest.snapshot()) == len(slurm.nodes)
    if rest_api in ("v0.0.40", "v0.0.41"):
        # 24.11's parsers for these versions refuse a Unix time in update_time (errno 9202): the backend
        # notices on the first poll and reads everything from then on, correct if dearer.
        time.sleep(1.1)
        slurm.scontrol("update", "nodename=gpu-node-3", "state=drain", "reason=maint")
        changed = rest.poll()
        assert changed is not None and changed["gpu-node-3"].flags == {"DRAIN"} and not rest._conditional
        return
    time.sleep(2.1)  # past the one-second overlap of update_time
    deadline = within(10)
    while rest.poll() is not None:  # pings may touch the node table; it settles quickly when idle
        assert time.monotonic() < deadline, "slurmrestd never answered 304"
        time.sleep(0.5)
    slurm.scontrol("update", "nodename=gpu-node-3", "state=drain", "reason=maint")
    changed = rest.poll()
    assert changed is not None and changed["gpu-node-3"].flags == {"DRAIN"}


def test_jobs_on_names_a_real_job(slurm: SlurmCluster, rest_api: str, rest_for: RestFor) -> None:
    rest = rest_for(rest_api)
    out = slurm.run("sbatch", "--parsable", "-w", "gpu-node-0", "-o", "/dev/null", "-D", str(slurm.workdir),
                    "--wrap", "sleep 120")
    job = out.stdout.strip().split(";")[0]
    try:
        deadline = within(15)
        while rest.jobs_on("gpu-node-0") != [job]:
            assert time.monotonic() < deadline, f"slurmrestd never listed job {job} on gpu-node-0"
            time.sleep(0.2)
        assert rest.jobs_on("gpu-node-1") == []
    finally:
        slurm.run("scancel", job, check=False)
