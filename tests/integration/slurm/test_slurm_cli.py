"""The cli and rest backends against the real slurmctld started by conftest.py."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from remediation.adapters.slurm.args import MAX_REASON, InvalidSlurmArgument
from remediation.adapters.slurm.cli import CliSlurm
from remediation.adapters.slurm.rest import RestSlurm
from remediation.ports.errors import ControllerUnreachable, Scope, TransientError, UnknownNode
from tests.integration.slurm.conftest import SlurmCluster
from tests.pace import within

pytestmark = pytest.mark.slurm


def test_list_and_get(slurm: SlurmCluster) -> None:
    cli = CliSlurm(slurm.settings())
    nodes = {n.name: n for n in cli.list_nodes()}
    assert sorted(nodes) == slurm.nodes
    assert all(n.state == "IDLE" and not n.flags for n in nodes.values())
    assert slurm.keeps_reason_on_resume or all(n.reason == "" for n in nodes.values())
    assert cli.get_node("gpu-node-2") == nodes["gpu-node-2"]


def test_drain_is_idempotent_and_resume_returns_the_node(slurm: SlurmCluster) -> None:
    cli = CliSlurm(slurm.settings())
    cli.drain("gpu-node-1", "remediation: xid 79")
    node = cli.get_node("gpu-node-1")
    assert node.flags == {"DRAIN"} and node.reason == "remediation: xid 79" and node.reason_user == "root"
    assert slurm.nodes_now()["gpu-node-1"] == ("IDLE", frozenset({"DRAIN"}), "remediation: xid 79")
    stamp = node.reason_time
    time.sleep(1.1)  # reason times have 1 s resolution; a second drain must not restamp
    cli.drain("gpu-node-1", "remediation: xid 79")
    assert cli.get_node("gpu-node-1").reason_time == stamp
    cli.resume("gpu-node-1")
    assert not cli.get_node("gpu-node-1").flags - {"NOT_RESPONDING"}
    assert cli.get_node("gpu-node-1").reason == ("remediation: xid 79" if slurm.keeps_reason_on_resume else "")


@pytest.mark.parametrize("state", ["FAIL", "DOWN"])
def test_set_state(slurm: SlurmCluster, state: str) -> None:
    cli = CliSlurm(slurm.settings())
    cli.set_state("gpu-node-2", state, f"remediation: set {state}")  # type: ignore[arg-type]
    node = cli.get_node("gpu-node-2")
    assert state in node.states and node.reason == f"remediation: set {state}"
    cli.resume("gpu-node-2")
    assert not cli.get_node("gpu-node-2").states & {"FAIL", "DOWN", "DRAIN"}


def test_resume_of_an_idle_node_is_success(slurm: SlurmCluster) -> None:
    # scontrol itself refuses this: "Invalid node state specified" (22.05, 24.11), "... transition" (26.05).
    refused = slurm.scontrol("update", "nodename=gpu-node-3", "state=resume", check=False)
    assert refused.returncode != 0 and slurm.resume_refusal[0] in refused.stderr
    CliSlurm(slurm.settings()).resume("gpu-node-3")


def test_unknown_node_carries_slurms_message(slurm: SlurmCluster) -> None:
    cli = CliSlurm(slurm.settings())
    with pytest.raises(UnknownNode, match="not found"):
        cli.get_node("gpu-node-99")
    with pytest.raises(UnknownNode, match="Invalid node name"):
        cli.running_jobs("gpu-node-99")
    with pytest.raises(UnknownNode):
        cli.drain("gpu-node-99", "remediation: x")
    with pytest.raises(UnknownNode, match="Invalid node name specified"):
        cli.resume("gpu-node-99")


def test_running_jobs_counts_a_real_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    cli = CliSlurm(slurm.settings())
    assert cli.running_jobs("gpu-node-0") == 0
    script = slurm.workdir / "job.sh"  # seen by slurmd too, inside 24.11's chroot
    script.write_text("#!/bin/sh\nsleep 60\n")
    script.chmod(0o755)
    job = slurm.run("sbatch", "--parsable", "-w", "gpu-node-0", "-o", "/dev/null", "-D", str(slurm.workdir), str(script))
    job_id = job.stdout.strip().split(";")[0]
    deadline = within(15)
    while cli.running_jobs("gpu-node-0") == 0:
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.2)
    assert cli.running_jobs("gpu-node-0") == 1
    assert cli.running_jobs("gpu-node-1") == 0
    # A node draining under a job: the workflow sees the job until it ends.
    cli.drain("gpu-node-0", "remediation: test")
    assert cli.get_node("gpu-node-0").state in ("ALLOCATED", "MIXED")
    assert cli.running_jobs("gpu-node-0") == 1
    slurm.run("scancel", job_id)
    deadline = within(15)
    while cli.running_jobs("gpu-node-0"):
        assert time.monotonic() < deadline, "the job never ended"
        time.sleep(0.2)


def test_jobs_on_lists_ids_and_requeue_and_cancel_act_on_real_jobs(slurm: SlurmCluster, tmp_path: Path) -> None:
    """squeue -w NODE names the jobs; scontrol requeue and scancel act on them (argv, one job per call);
    a job that already ended is not an error; a malformed id never reaches Slurm. Every job it started
    has ended when it returns: Slurm requeues a finished batch job, to start it ~2 minutes later."""
    cli = CliSlurm(slurm.settings())

    def submit(*extra: str) -> str:
        out = slurm.run("sbatch", "--parsable", "-w", "gpu-node-3", "-o", "/dev/null", "-D", str(slurm.workdir), *extra,
                        "--wrap", "sleep 300")
        return out.stdout.strip().split(";")[0]

    def state(job: str) -> str:
        return next(w.split("=", 1)[1] for w in slurm.run("scontrol", "show", "job", "-o", job).stdout.split()
                    if w.startswith("JobState="))

    def wait_jobs(expected: list[str]) -> None:
        deadline = within(20)
        while cli.jobs_on("gpu-node-3") != expected:
            assert time.monotonic() < deadline, cli.jobs_on("gpu-node-3")
            time.sleep(0.2)

    first = submit("--requeue")
    wait_jobs([first])
    cli.drain("gpu-node-3", "remediation: jobs test")  # keeps the requeued job off this node
    cli.requeue_jobs([first])
    wait_jobs([])
    assert state(first) in ("PENDING", "REQUEUED") and int(
        next(w.split("=")[1] for w in slurm.run("scontrol", "show", "job", "-o", first).stdout.split()
             if w.startswith("Restarts="))) == 1
    slurm.run("scancel", first)
    cli.resume("gpu-node-3")
    second = submit()
    wait_jobs([second])
    cli.cancel_jobs([second])
    wait_jobs([])
    assert state(second) == "CANCELLED"
    cli.cancel_jobs([second])  # already ended: what we wanted has happened
    cli.requeue_jobs([second])
    # Not an error, but no no-op either: the ended job is back in the queue (eligible once the requeue
    # delay is over), and would start on gpu-node-3 after this test, or after its cluster stopped.
    assert state(second) in ("PENDING", "REQUEUED")
    slurm.run("scancel", second)
    assert state(second) == "CANCELLED"
    with pytest.raises(InvalidSlurmArgument):
        cli.cancel_jobs(["1; scancel -u root"])


LITERAL_REASONS = [
    "remediation: $(touch {marker})",
    "remediation: `touch {marker}`",
    "remediation: x; touch {marker} && echo y | cat > {marker}",
    'remediation: "quoted" and \'single\'',
    '"remediation: fully quoted"',
    '"',
    "remediation: x nodename=gpu-node-3 state=down",
    "remediation: ${{IFS}}*?~!#%^&()[]{{}}<>\\\\",
    "remediation: ünïcode ✓",
    "r" * MAX_REASON,
]


@pytest.mark.parametrize(
    "template",
    LITERAL_REASONS,
    ids=["dollar-paren", "backticks", "semicolon-pipe", "quotes", "wrapped-in-quotes", "lone-quote",
         "argument-lookalike", "glob-and-braces", "unicode", "max-length"],
)
def test_reasons_reach_slurm_literally_and_run_nothing(slurm: SlurmCluster, tmp_path: Path, template: str) -> None:
    marker = tmp_path / "executed"
    reason = template.format(marker=marker)
    cli = CliSlurm(slurm.settings())
    cli.drain("gpu-node-2", reason)
    assert cli.get_node("gpu-node-2").reason == reason
    assert slurm.nodes_now()["gpu-node-2"][2] == reason
    assert not marker.exists()
    # Only the named node changed.
    others = {n: v for n, v in slurm.nodes_now().items() if n != "gpu-node-2"}
    assert all(state == "IDLE" and not flags for state, flags, _ in others.values())


@pytest.fixture
def tripwire(tmp_path: Path) -> tuple[Path, Path]:
    """An executable that records being run; used as scontrol/sinfo/squeue to prove none ran."""
    log = tmp_path / "ran"
    exe = tmp_path / "tripwire"
    exe.write_text(f"#!/bin/sh\necho \"$@\" >> '{log}'\nexit 1\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe, log


BAD_NAMES = ["gpu-node-1;touch x", "gpu-node-1 gpu-node-2", "gpu-node-[0-1]", "gpu-node-0,gpu-node-1", "ALL",
             "all", "", "-h", "gpu-node-1\n", "$(touch x)", "../gpu-node-1", "n\x00"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=[repr(n) for n in BAD_NAMES])
def test_bad_node_names_are_rejected_before_anything_runs(
    slurm: SlurmCluster, tripwire: tuple[Path, Path], name: str
) -> None:
    exe, log = tripwire
    cli = CliSlurm(slurm.settings(scontrol=str(exe), sinfo=str(exe), squeue=str(exe)))
    for call in (
        lambda: cli.get_node(name),
        lambda: cli.drain(name, "remediation: x"),
        lambda: cli.set_state(name, "FAIL", "remediation: x"),
        lambda: cli.resume(name),
        lambda: cli.running_jobs(name),
    ):
        with pytest.raises(InvalidSlurmArgument, match="invalid Slurm node name"):
            call()
    assert not log.exists()
    # The tripwire is live: a valid call does run it.
    with pytest.raises(Exception):  # noqa: B017 - the tripwire exits 1; we only want it to have run
        cli.get_node("gpu-node-1")
    assert log.exists()


BAD_REASONS = ["remediation: a\nb", "remediation: a\rb", "remediation: a\x00b", "remediation: \tx", "", "   ",
               "r" * (MAX_REASON + 1), "remediation: \x1b[31mred"]


@pytest.mark.parametrize("reason", BAD_REASONS, ids=["newline", "cr", "nul", "tab", "empty", "blank", "too-long", "escape"])
def test_bad_reasons_are_rejected_before_anything_runs(
    slurm: SlurmCluster, tripwire: tuple[Path, Path], reason: str
) -> None:
    exe, log = tripwire
    cli = CliSlurm(slurm.settings(scontrol=str(exe), sinfo=str(exe), squeue=str(exe)))
    with pytest.raises(InvalidSlurmArgument):
        cli.drain("gpu-node-1", reason)
    with pytest.raises(InvalidSlurmArgument):
        cli.set_state("gpu-node-1", "DOWN", reason)
    assert not log.exists()


def test_unreachable_controller_is_transient(slurm: SlurmCluster) -> None:
    conf = slurm.workdir / "unreachable.conf"  # readable by 24.11's commands inside the chroot too
    lines = slurm.conf.read_text().splitlines()
    # The same cluster but a port nobody listens on.
    free = ["SlurmctldPort=1" if line.startswith("SlurmctldPort=") else line for line in lines]
    conf.write_text("\n".join(free) + "\n")
    cli = CliSlurm(slurm.settings(slurm_conf=str(conf), command_timeout_s=20))
    with pytest.raises(ControllerUnreachable, match="Unable to contact slurm controller") as info:
        cli.resume("gpu-node-1")
    assert info.value.scope is Scope.SYSTEM and info.value.self_healing  # pauses; never the node's fault
    quick = CliSlurm(slurm.settings(slurm_conf=str(conf), command_timeout_s=0.5))
    with pytest.raises(TransientError, match="timed out"):
        quick.list_nodes()


def test_slurm_conf_comes_from_settings_not_the_environment(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    assert len(CliSlurm(slurm.settings()).list_nodes()) == len(slurm.nodes)
    assert os.environ["SLURM_CONF"] == "/nonexistent/slurm.conf"


# ------------------------------------------------------------------------------------------- rest


def test_rest_unreachable_is_transient(tmp_path: Path, slurm: SlurmCluster) -> None:
    with RestSlurm(slurm.settings(backend="rest", rest_url=f"unix:{tmp_path / 'missing.sock'}")) as rest:
        with pytest.raises(TransientError):
            rest.list_nodes()


def test_a_heterogeneous_job_is_listed_by_component_and_acted_on_whole(slurm: SlurmCluster) -> None:
    """A heterogeneous job shows on each node by its component (``123+0``, ``123+1``); requeue, signal
    and cancel take it as Slurm does, whole, so a node running one is never refused its job safety."""
    cli = CliSlurm(slurm.settings())

    script = slurm.workdir / "het.sh"
    script.write_text("#!/bin/sh\n#SBATCH -w gpu-node-3\n#SBATCH hetjob\n#SBATCH -w gpu-node-2\nsleep 300\n")

    def submit(*extra: str) -> str:
        out = slurm.run("sbatch", "--parsable", "-o", "/dev/null", "-D", str(slurm.workdir), *extra, str(script))
        return out.stdout.strip().split(";")[0]

    def wait_jobs(expected: dict[str, list[str]]) -> None:
        deadline = within(30)
        while (seen := {n: cli.jobs_on(n) for n in expected}) != expected:
            assert time.monotonic() < deadline, seen
            time.sleep(0.2)

    het = submit("--requeue")
    wait_jobs({"gpu-node-3": [f"{het}+0"], "gpu-node-2": [f"{het}+1"]})
    cli.signal_jobs(cli.jobs_on("gpu-node-3"), "USR1", "full")  # a checkpoint request reaches it
    cli.drain("gpu-node-3", "remediation: heterogeneous job test")  # keeps the requeued job off the node
    cli.requeue_jobs(cli.jobs_on("gpu-node-3"))
    wait_jobs({"gpu-node-3": [], "gpu-node-2": []})
    slurm.run("scancel", het)
    cli.resume("gpu-node-3")
    again = submit()
    wait_jobs({"gpu-node-3": [f"{again}+0"], "gpu-node-2": [f"{again}+1"]})
    cli.cancel_jobs(cli.jobs_on("gpu-node-2"))
    wait_jobs({"gpu-node-3": [], "gpu-node-2": []})
