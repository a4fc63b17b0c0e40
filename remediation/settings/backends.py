"""The backends a site names, checked together at start-up.

What only makes sense across sections is checked here, by pure functions of the sections they read:
a half named ``none`` whose steps the configuration still asks for, and a ``noop`` backend outside
dry-run, are refused. :class:`remediation.settings.loader.Settings` turns every refusal into one
:class:`~remediation.settings.base.SettingsError` naming the fields.

Why: docs/architecture.md#a-half-the-site-lacks-is-no-step-and-nothing-returns-without-evidence
"""

from __future__ import annotations

from remediation.settings.faults import FaultSettings
from remediation.settings.kube import KubeSettings
from remediation.settings.machine import MachineSettings
from remediation.settings.slurm import SlurmSettings
from remediation.settings.workflow import WorkflowSettings
from remediation.validation.settings import ValidationSettings
from remediation.vocabulary import MACHINE_ACTIONS

NONE = "none"
NOOP = "noop"
#: The machine rungs a backend can carry out, where it cannot do them all (a cloud, the memory world and
#: the dry-run twin can): Slurm's own reboot only restarts, and a site with none does nothing.
RUNGS: dict[str, tuple[str, ...]] = {NONE: (), "slurm": ("restart",)}
#: ``workflow.ladder`` speaks the clouds' actions: each as the ladder rung it carries out.
_AS_RUNG = {"restart": "restart", "reimage": "reimage", "redeploy": "move-host", "stop_start": "move-host"}
#: Machine backends that find a node's machine by the node's name (the Slurm node itself, or a BMC
#: inventory): they need no Node's providerID.
NODE_ADDRESSED = frozenset({"slurm", "redfish"})


def ladders_beyond_the_machine(machine: MachineSettings, workflow: WorkflowSettings,
                               faults: FaultSettings) -> list[str]:
    """A refusal per ladder the site wrote with a machine rung its machine backend cannot carry out."""
    can = RUNGS.get(machine.backend, MACHINE_ACTIONS)
    if can == MACHINE_ACTIONS:
        return []
    if can:
        lacks = f"and machine.backend {machine.backend} can only {' and '.join(can)}"
        fix = f"give it {' or '.join(can)} rungs only, or name a machine backend that can"
    else:
        lacks = "and machine.backend is none: this site cannot restart, move or reimage a machine"
        fix = "name a machine backend"
    out = []
    written = [_AS_RUNG[a] for a in workflow.ladder]
    if workflow.ladder != WorkflowSettings.model_fields["ladder"].default and (beyond := _beyond(written, can)):
        unset = "leave it unset (at such a site the machine rungs are skipped) or " if not can else ""
        out.append(f"workflow.ladder {workflow.ladder} needs a machine action ({beyond}), {lacks}; {unset}{fix}")
    for name, ladder in sorted(faults.ladders.items()):
        if beyond := _beyond(ladder, can):
            out.append(f"policy.faults.ladders.{name} {ladder} needs a machine action ({beyond}), {lacks}; "
                       f"write [hold] or [quarantine], or {fix}")
    return out


def _beyond(ladder: list[str], can: tuple[str, ...]) -> str:
    """The ladder's machine rungs the backend cannot carry out, in order, without repeats."""
    return ", ".join(dict.fromkeys(a for a in ladder if a in MACHINE_ACTIONS and a not in can))


def without_kubernetes(kube: KubeSettings, machine: MachineSettings, validation: ValidationSettings) -> list[str]:
    """A refusal per backend that needs the Kubernetes a site without it (``kube.backend: none``) lacks."""
    if kube.backend != NONE:
        return []
    out = []
    if validation.backend == "kubernetes":
        out.append("validation.backend: kubernetes runs the GPU check as a Kubernetes Job, and kube.backend "
                   "is none; use validation.backend: slurm (a check job in a reservation) or none")
    if machine.backend != NONE and machine.backend not in NODE_ADDRESSED:
        out.append(f"machine.backend: {machine.backend} finds each node's machine through its Kubernetes "
                   "Node's providerID, and kube.backend is none; set machine.backend: slurm (Slurm's own "
                   "reboot), redfish (the BMCs of an inventory) or none")
    return out


def noop_outside_dry_run(dry_run: bool, slurm: SlurmSettings, kube: KubeSettings,
                         *, machine: MachineSettings) -> list[str]:
    """A refusal per ``noop`` backend named outside dry-run."""
    if dry_run:
        return []
    twin = ("is the dry-run twin: it acts on nothing and records steps that never happened, so it is "
            "refused outside dry-run")
    rehearse = "to act on nothing at all, set dry_run: true (every backend is then swapped for its twin)"
    out = [f"slurm.backend: noop {twin}; {rehearse}"] if slurm.backend == NOOP else []
    for section, half, backend in (("kube", "Kubernetes", kube.backend), ("machine", "machine action", machine.backend)):
        if backend == NOOP:
            out.append(f"{section}.backend: noop {twin}; a site with no {half} sets {section}.backend: none; "
                       f"{rehearse}")
    return out


#: The Slurm backends that can send a job a signal (``scancel --signal``): slurmrestd and pyslurm
#: cannot, as they cannot requeue or cancel.
SIGNALLING = frozenset({"cli", "memory", NOOP})


def checkpoint_without_signals(slurm: SlurmSettings, workflow: WorkflowSettings) -> list[str]:
    """A refusal when a checkpoint request is asked of a Slurm backend that cannot send it."""
    if not workflow.checkpoint_signal or slurm.backend in SIGNALLING:
        return []
    return [f"workflow.checkpoint_signal {workflow.checkpoint_signal} is sent with scancel, and "
            f"slurm.backend {slurm.backend} cannot signal a job; use slurm.backend: cli, or leave "
            "workflow.checkpoint_signal empty"]
