"""The watcher's cheap reads against the real slurmctld: the change probe and the delta reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from remediation.adapters.slurm.cli import CliSlurm
from remediation.adapters.slurm.delta import DeltaReader
from tests.integration.slurm.conftest import SlurmCluster

BAD = frozenset({"DOWN", "DRAIN", "FAIL", "NOT_RESPONDING"})


# The probe runs in a process of its own: libslurm reads one slurm.conf per process, and this pytest
# process may already have probed another of the suite's clusters.
PROBE_SCRIPT = r"""
import json, subprocess, sys, time
from remediation.adapters.slurm.probe import NodeTableProbe

conf, release, scontrol = sys.argv[1], tuple(int(x) for x in sys.argv[2].split(".")), sys.argv[3:]
probe = NodeTableProbe.open(conf, release=release)
if probe is None:
    print(json.dumps({"probe": None}))
    raise SystemExit(0)
deadline = time.monotonic() + 5
while probe.changed():  # a change in the current second answers "changed"
    assert time.monotonic() < deadline, "slurmctld kept reporting changes"
    time.sleep(0.2)
settled = {"unchanged": probe.unchanged, "errors": probe.errors}
# A second controller's configuration: this process's libslurm already serves the first, so refused.
other = NodeTableProbe.open(conf + ".other", release=release)
subprocess.run([*scontrol, "update", "nodename=gpu-node-2", "state=drain", "reason=probe test"], check=True)
try:
    after = probe.changed()
finally:
    subprocess.run([*scontrol, "update", "nodename=gpu-node-2", "state=resume"], check=True)
print(json.dumps({"probe": settled, "changed_after_update": after, "second_conf_refused": other is None}))
"""


def test_the_probe_answers_no_change_until_a_node_changes(slurm: SlurmCluster) -> None:
    out = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-c", PROBE_SCRIPT, str(slurm.conf), ".".join(map(str, slurm.release)), "scontrol"],
        env={**os.environ, **slurm.env}, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[3],
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if slurm.bin is not None:
        # 24.11 and 26.05 in their chroots: their libslurm needs the root's newer glibc, so this process
        # can only load
        # the host's 22.05 one, which the probe refuses (another release) before it reads slurm.conf.
        assert result["probe"] is None
        return
    assert result["probe"] is not None, f"libslurm could not be loaded beside the Slurm commands: {out.stderr}"
    assert result["probe"]["unchanged"] >= 1 and result["probe"]["errors"] == 0
    assert result["changed_after_update"] is True  # the update returned: slurmctld's table is newer
    assert result["second_conf_refused"] is True


def test_the_delta_reader_sees_what_a_full_read_sees(slurm: SlurmCluster) -> None:
    cli = CliSlurm(slurm.settings())
    reader = cli.delta_source(BAD)
    assert isinstance(reader, DeltaReader)
    if slurm.bin is not None:
        assert reader.probe is None  # 24.11 or 26.05 in a chroot: no libslurm of its own
    reader.snapshot()
    slurm.scontrol("update", "nodename=gpu-node-3", "state=drain", "reason=delta test")
    slurm.scontrol("update", "nodename=gpu-node-[0-1]", "state=down", "reason=xid|79 : two  spaces")
    slurm.scontrol("update", "nodename=gpu-node-2", "state=fail", "reason=fail test")
    try:
        now = reader.poll()
        # Taken from sinfo's bad-set lines, no detail read: each equal to what scontrol says of it.
        assert reader.from_lines == 4 and reader.detail_reads == 0 and not reader.pending
        full = CliSlurm(slurm.settings()).delta_source(BAD).snapshot()  # type: ignore[union-attr]
        assert now["gpu-node-3"] == full["gpu-node-3"] and "DRAIN" in now["gpu-node-3"].flags
        assert now["gpu-node-3"].reason == "delta test"
        assert now["gpu-node-0"].reason == "xid|79 : two  spaces" and now["gpu-node-0"].state == "DOWN"
        assert "FAIL" in now["gpu-node-2"].flags
        assert {n: s for n, s in now.items()} == full
    finally:
        slurm.scontrol("update", "nodename=gpu-node-[0-3]", "state=resume")
    # Leaving the bad set is read in detail by the poll right after.
    reader.poll()
    assert reader.pending
    now = reader.poll()
    assert reader.detail_reads == 1 and not reader.pending
    for n in ("gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3"):  # resumed (perhaps NOT_RESPONDING a moment)
        assert not now[n].states & {"DOWN", "DRAIN", "FAIL"}, now[n]
