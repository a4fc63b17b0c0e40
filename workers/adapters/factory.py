"""Pick the adapters from settings, the way a mail backend is picked from config.

``dry_run`` swaps every writer for its no-op twin; the no-ops still read through the real backends, so
a dry run sees the real cluster. The ``memory`` backends share one simulated world (optionally a
journal file shared across worker processes).
"""

from __future__ import annotations

from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld
from remediation.adapters.noop import NoopKube, NoopSlurm, NoopVM, Recorder
from remediation.hostlist import expand
from remediation.interfaces import KubeNodes, SlurmControl, VMProvider
from remediation.settings import Settings
from remediation.steps import Adapters

_worlds: dict[str, MemoryWorld] = {}


def make_world(settings: Settings) -> MemoryWorld:
    """The simulated world. Without a journal it lives in this process, and every caller in the
    process (worker threads, watchers, the demo's scenario) gets the same one."""
    if settings.sim.journal is None and settings.sim.nodes in _worlds:
        return _worlds[settings.sim.nodes]
    world = MemoryWorld(
        nodes=expand(settings.sim.nodes),
        journal=settings.sim.journal,
        op_polls=settings.sim.op_polls,
        call_delay_s=settings.sim.call_delay_s,
    )
    if settings.sim.journal is None:
        _worlds[settings.sim.nodes] = world
    return world


def make_adapters(settings: Settings, world: MemoryWorld | None = None) -> Adapters:
    uses_memory = "memory" in (settings.slurm.backend, settings.kube.backend, settings.vm.backend)
    if uses_memory and world is None:
        world = make_world(settings)
    slurm = _slurm(settings, world)
    kube = _kube(settings, world)
    vm = _vm(settings, world)
    if settings.dry_run:
        recorder = Recorder()
        return Adapters(NoopSlurm(slurm, recorder), NoopKube(kube, recorder), NoopVM(recorder))
    return Adapters(slurm, kube, vm)


def _slurm(settings: Settings, world: MemoryWorld | None) -> SlurmControl:
    if settings.slurm.backend == "memory":
        assert world is not None
        return MemorySlurm(world)
    if settings.slurm.backend == "noop":
        return NoopSlurm()
    from workers.adapters.slurm import make_slurm

    return make_slurm(settings)


def _kube(settings: Settings, world: MemoryWorld | None) -> KubeNodes:
    if settings.kube.backend == "memory":
        assert world is not None
        return MemoryKube(world)
    if settings.kube.backend == "noop":
        return NoopKube()
    from workers.adapters.kube import make_kube

    return make_kube(settings)


def _vm(settings: Settings, world: MemoryWorld | None) -> VMProvider:
    if settings.vm.backend == "memory":
        assert world is not None
        return MemoryVM(world)
    if settings.vm.backend == "noop":
        return NoopVM()
    from workers.adapters.vm import make_vm_provider

    return make_vm_provider(settings)
