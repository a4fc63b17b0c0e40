"""Fault injection for :class:`remediation.simulator.cluster.SimCluster`: each fault is what the real system would show,
put where the real system keeps it.

Faults: ``researcher_fail``, ``slurmd_stop``, ``node_not_ready``, ``gpu_condition``, ``flap``,
``repeat_offender``, ``bad_hbm``, ``storm``, ``switch_down``/``switch_up``, ``nvswitch_fault``,
``human_drain`` and ``replay``. What is no fault, for the false-positive soak: ``app_xid``,
``condition_pulse`` (a condition set, then cleared), ``slurmd_blip`` and ``slurmctld_stall``. A VM
reboot undoes Node faults, never a human's Slurm state. Each injection is logged in ``injections``.

Why: docs/wire-protocols.md#the-simulated-cluster
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from remediation.rehearsal.trace import read_mix
from remediation.simulator import replay as trace
from remediation.simulator.slurmctld import SlurmError

if TYPE_CHECKING:
    from remediation.simulator.cluster import Link
    from remediation.simulator.kube.api import KubeAPIServer
    from remediation.simulator.slurmctld import SlurmCtld


#: What an NVLink tray's driver logs when an NVSwitch of its rack fails (the NVSwitch driver's SXid line).
SXID = "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Fatal, Link 32 egress non-posted PRIV error"
#: What the driver logs for the application-level XIDs (NVIDIA: RESTART_APP or IGNORE): the job's fault.
APP_XIDS = {
    13: "Graphics Exception: ESR 0x404600=0x80000002",
    31: "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_c0000000",
    43: "Ch 00000008, engmask 00000101",
    45: "Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x1c000",
}
#: What ``human_drain`` reasons start with when a trace or a soak plans maintenance.
MAINTENANCE_PREFIX = "maintenance:"


@dataclass(frozen=True)
class Injection:
    node: str
    kind: str
    detail: str
    at: float  # time.time()


class FaultInjector:
    """Mixed into SimCluster, which provides ``names``, ``links``, ``lock``, ``ctld``, ``kube`` and ``at``."""

    names: list[str]
    links: dict[str, Link]
    lock: threading.RLock
    ctld: SlurmCtld
    kube: KubeAPIServer
    at: Callable[[float, Callable[[], None]], None]
    slurm_state: Callable[[str], tuple[str, frozenset[str], str]]

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.injected_conditions: dict[str, set[str]] = {}
        self.injections: list[Injection] = []

    def _log(self, node: str, kind: str, detail: str) -> None:
        self.injections.append(Injection(node, kind, detail, time.time()))

    # --------------------------------------------------------------------------- Slurm faults

    def researcher_fail(
        self, node: str, reason: str = "xid 79: GPU fell off the bus", user: str = "alice"
    ) -> None:
        self.ctld.update(node, "FAIL", reason, user=user)
        self._log(node, "researcher_fail", reason)

    def slurmd_stop(self, node: str) -> None:
        self.ctld.slurmd_stop(node)
        self._log(node, "slurmd_stop", "slurmd stopped answering")

    def human_drain(self, node: str, reason: str = "maintenance: PSU swap", user: str = "root") -> None:
        self.ctld.update(node, "DRAIN", reason, user=user)
        self._log(node, "human_drain", reason)

    def end_human_drain(self, node: str) -> bool:
        """The admin resumes a maintenance drain, if the node still carries it (any other state is
        someone else's now, not the admin's to undo); returns whether it was resumed."""
        _, flags, reason = self.slurm_state(node)
        if "DRAIN" not in flags or not reason.startswith(MAINTENANCE_PREFIX):
            return False
        try:
            self.ctld.update(node, "RESUME", user="root")
        except SlurmError:
            return False
        self._log(node, "maintenance_done", "admin: scontrol update state=resume")
        return True

    def nvswitch_fault(self, nodes: list[str], line: str = SXID) -> None:
        """An NVSwitch of the trays' rack fails and their drivers log its SXID: the node health check on
        each of ``nodes`` drains its tray in Slurm with the driver's line as the reason."""
        for node in nodes:
            self.ctld.update(node, "DRAIN", f"NHC: {line}", user="root")
            self._log(node, "nvswitch_fault", line)

    # ------------------------------------------------------------------------------- no faults

    def slurmd_blip(self, node: str, seconds: float) -> None:
        """slurmd does not answer slurmctld's pings for ``seconds`` (a network hiccup) and then does
        again, as the same process: shorter than SlurmdTimeout, the node is NOT_RESPONDING, never DOWN."""
        self.ctld.slurmd_stop(node)
        self._log(node, "slurmd_blip", f"slurmd silent for {seconds:g}s")

        def back() -> None:
            if not self.links[node].vm_down:
                self.ctld.slurmd_start(node, restarted=False)

        self.at(seconds, back)

    def slurmctld_stall(self, seconds: float) -> None:
        """slurmctld answers no RPC for ``seconds``: every slurmrestd call times out meanwhile. Logged
        under the node name "" (it is the controller's, not a node's)."""
        self.ctld.stall(seconds)
        self._log("", "slurmctld_stall", f"slurmctld RPCs time out for {seconds:g}s")

    def app_xid(self, node: str, xid: int, seconds: float) -> None:
        """An application-level XID on the node's GpuXidError condition, as a GPU health monitor posts
        the kernel's line, cleared ``seconds`` later (the job that caused it ended)."""
        line = f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=40213, name=python3, {APP_XIDS[xid]}"
        self.condition_pulse(node, "GpuXidError", seconds, message=line, kind="app_xid")

    def condition_pulse(
        self, node: str, type: str, seconds: float, *, status: str = "True", message: str = "",  # noqa: A002
        kind: str = "condition_pulse",
    ) -> None:
        """The Node condition ``type`` is ``status`` for ``seconds``, then back to healthy (Ready=True,
        else False) as its detector clears it; logged as ``kind``."""
        k8s = self.links[node].k8s
        healthy = "False" if status == "True" else "True"
        self.kube.set_condition(k8s, type, status, reason=type, message=message)
        self._log(node, kind, f"{type}={status} for {seconds:g}s: {message}")

        def clear() -> None:
            if not self.links[node].vm_down:  # a reboot sets the Node's conditions itself
                self.kube.set_condition(k8s, type, healthy, reason="KubeletReady" if type == "Ready" else "NoFault")

        self.at(seconds, clear)

    # ---------------------------------------------------------------------------- Node faults

    def node_not_ready(
        self, node: str, message: str = "PLEG is not healthy: pleg was last seen active 3m0s ago"
    ) -> None:
        self.kube.set_condition(
            self.links[node].k8s, "Ready", "False", reason="KubeletNotReady", message=message
        )
        self._log(node, "node_not_ready", message)

    def gpu_condition(
        self,
        node: str,
        type: str = "GpuXidError",
        message: str = "XID 79: GPU has fallen off the bus",  # noqa: A002
    ) -> None:
        status = "False" if type.endswith("Healthy") else "True"
        self.kube.set_condition(self.links[node].k8s, type, status, reason=type, message=message)
        self.injected_conditions.setdefault(node, set()).add(type)
        self._log(node, "gpu_condition", f"{type}={status}: {message}")

    def flap(self, node: str, period_s: float = 0.4, duration_s: float = 4.0) -> None:
        """Ready goes False for half of each period, then True, until ``duration_s`` has passed."""
        link = self.links[node]
        link.flapping_until = time.monotonic() + duration_s
        self._log(node, "flap", f"Ready toggling every {period_s / 2:g}s for {duration_s:g}s")

        def toggle(bad: bool) -> None:
            if time.monotonic() >= link.flapping_until:
                if link.flapping_until:  # not cut short by a reboot, which sets Ready itself
                    self.kube.set_condition(link.k8s, "Ready", "True", reason="KubeletReady")
                return
            status, why = ("False", "KubeletNotReady") if bad else ("True", "KubeletReady")
            self.kube.set_condition(link.k8s, "Ready", status, reason=why, message="flapping")
            self.at(period_s / 2, lambda: toggle(not bad))

        toggle(True)

    def repeat_offender(
        self, node: str, reason: str = "xid 48: double-bit ECC error", *, relapse_after_s: float | None = None
    ) -> None:
        """A lemon: restarts do not fix its VM. It fails now, as a researcher reports it.

        By default the broken VM never passes verify (its GPU fault is back at boot and slurmd never
        registers), so the escalation ladder ends in quarantine. With ``relapse_after_s`` it boots
        and registers, and its GPU condition comes back that long after each boot: every restart
        "succeeds", and only the repeat-offender rule can take it out of the pool."""
        if relapse_after_s is None:
            self.links[node].broken = True
        else:
            self.links[node].relapse_after_s = relapse_after_s
        self.researcher_fail(node, reason, user="bob")
        self._log(node, "repeat_offender", f"broken VM ({'relapses' if relapse_after_s is not None else 'fails verify'})")

    def hold_boot(self, node: str) -> None:
        """The VM's next boot does not end until :meth:`end_boot`: the node stays down, so its workflow
        waits in verify for as long as a test needs to land there, however slow the machine."""
        with self.lock:
            self.links[node].reboot_delay_s = math.inf
        self._log(node, "hold_boot", "the next boot lasts until end_boot")

    def end_boot(self, node: str) -> None:
        """End a held boot: the node comes up at the clock's next tick (or after the usual boot time, if
        its restart has not begun)."""
        with self.lock:
            link = self.links[node]
            link.reboot_delay_s = None
            if link.back_at is not None:
                link.back_at = time.monotonic()
        self._log(node, "end_boot", "boot ended")

    def bad_hbm(self, node: str, reason: str = "xid 48: double-bit ECC error") -> None:
        """A GPU with a failing HBM row: the restart brings the node back with a new bootID, slurmd
        registers and verify passes, but the validation's memory check fails on it every time (see
        :meth:`remediation.simulator.cluster.SimCluster.check_outcome`). It fails now, as a researcher reports it."""
        self.links[node].bad_hbm = True
        self.researcher_fail(node, reason, user="carol")
        self._log(node, "bad_hbm", "HBM row failure: passes verify, fails the GPU check")

    # ------------------------------------------------------------------------------- at scale

    def storm(self, fraction: float, *, exclude: tuple[str, ...] = ()) -> list[str]:
        """slurmd stops on ``round(fraction * N)`` nodes at once (at least one); returns them sorted."""
        pool = [n for n in self.names if n not in exclude]
        count = max(1, min(len(pool), round(fraction * len(self.names))))
        hit = sorted(self.rng.sample(pool, count), key=self.names.index)
        for node in hit:
            self.ctld.slurmd_stop(node)
            self._log(node, "storm", f"mass failure: {count} nodes lost slurmd at once")
        return hit

    def switch_down(self, nodes: list[str], switch: str) -> None:
        """The leaf switch ``switch`` dies: slurmd on every node behind it stops answering at once."""
        for node in nodes:
            self.ctld.slurmd_stop(node)
            self._log(node, "switch_down", f"leaf switch {switch} down: {len(nodes)} nodes unreachable")

    def switch_up(self, nodes: list[str], switch: str) -> None:
        """``switch`` is replaced: the nodes behind it are reachable again and their slurmds (which never
        stopped) register with slurmctld. Nodes a VM action has taken down meanwhile stay down."""
        for node in nodes:
            if not self.links[node].vm_down:
                self.ctld.slurmd_start(node, restarted=False)
            self._log(node, "switch_up", f"leaf switch {switch} replaced")

    def replay(
        self,
        trace_csv: str | Path,
        *,
        scale_nodes: int | None = None,
        speedup: float = 300_000.0,
        seed: int = 0,
        until_s: float | None = None,
        nodes: list[str] | None = None,
    ) -> list[trace.PlannedFault]:
        """Schedule a trace's faults (scaled to ``scale_nodes``, default the cluster size) on the
        cluster's clock, among ``nodes`` (default all); returns the plan."""
        planned = trace.plan(
            read_mix(trace_csv), nodes or self.names,
            scale_nodes=scale_nodes if scale_nodes is not None else len(self.names),
            speedup=speedup, seed=seed, until_s=until_s,
        )  # fmt: skip
        for fault in planned:
            self.at(fault.at_s, lambda f=fault: self.apply(f))  # type: ignore[misc]
        return planned

    def apply(self, fault: trace.PlannedFault) -> None:
        """Inject one planned fault now."""
        label = f"{fault.category} (trace)"
        actions: dict[str, Callable[[str], Any]] = {
            "gpu_condition": lambda n: self.gpu_condition(n, message=f"{label}: XID 48"),
            "researcher_fail": lambda n: self.researcher_fail(n, f"{label}: job died, GPU suspect"),
            "slurmd_stop": self.slurmd_stop,
            "node_not_ready": lambda n: self.node_not_ready(n, message=f"{label}"),
            "human_drain": lambda n: self.human_drain(n, f"{MAINTENANCE_PREFIX} {label}"),
        }
        for node in fault.nodes:
            if fault.kind == "none":
                self._log(node, "none", f"{label}: job failure only, the node stays healthy")
            else:
                actions[fault.kind](node)
