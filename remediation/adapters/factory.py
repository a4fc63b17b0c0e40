"""The one adapter factory: settings pick every backend, the way a mail backend is picked from config.

Selectors: :func:`slurm_backend`, :func:`kube_backend`, :func:`machine_backend`, :func:`rack_power_backend`,
:func:`make_bus`, :func:`make_lock` and :func:`evidence_storage`; each returns the ``memory``, ``noop`` or real backend, or None for a half the site
lacks. :func:`make_adapters` applies dry-run in one place. The policy rehearsal gets a private world
(:func:`memory_world`, :func:`memory_adapters`).

Why: docs/running.md#what-the-site-has-a-backend-per-half-or-none
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from remediation.adapters.memintents import MemoryIntents
from remediation.adapters.memory import MemoryKube, MemorySlurm, MemoryVM, MemoryWorld, OpTiming
from remediation.adapters.noop import (
    NoopKube,
    NoopMachine,
    NoopMachineByNode,
    NoopSlurm,
    NoopSlurmReboot,
    NoopValidator,
    Recorder,
)
from remediation.domain.step_bodies import Adapters
from remediation.hostlist import expand
from remediation.ports.cluster import KubeNodes, MachineProvider, MachinesByNode, SlurmControl
from remediation.ports.errors import ConfigError
from remediation.ports.evidence import EvidenceStorage, EvidenceStore
from remediation.settings import EffectivePolicy, Settings
from remediation.validation.port import Validator

if TYPE_CHECKING:
    import redis

    from remediation.adapters.bus import RedisEventBus
    from remediation.adapters.lock import LeaderLock
    from remediation.ports.intents import Intents
    from remediation.ports.rack import RackPower

_worlds: dict[tuple[str, str], MemoryWorld] = {}

# How long a watcher's publish and its leader lock wait on Redis before they take it as unreachable
# (the publisher keeps its events and retries).
WATCHER_REDIS_TIMEOUT_S = 5.0


def make_world(settings: Settings) -> MemoryWorld:
    """The simulated world. Without a journal it lives in this process, and every caller in the
    process (worker threads, watchers, the demo's scenario) gets the same one: each cluster its own."""
    key = (settings.cluster.name, settings.memory.nodes)
    if settings.memory.journal is None and key in _worlds:
        return _worlds[key]
    world = MemoryWorld(
        nodes=expand(settings.memory.nodes),
        journal=settings.memory.journal,
        timing=OpTiming(polls=settings.memory.op_polls),
        call_delay_s=settings.memory.call_delay_s,
    )
    if settings.memory.journal is None:
        _worlds[key] = world
    return world


def memory_world(nodes: list[str], clock: Callable[[], datetime], op_seconds: float) -> MemoryWorld:
    """A private simulated world on ``clock`` (the rehearsal's): a VM action completes ``op_seconds``
    after it started on that clock, and a restart clears the conditions a fault set. Nothing else in
    the process shares it."""
    return MemoryWorld(nodes=nodes, timing=OpTiming(clock=clock, seconds=op_seconds),
                       restart_clears_conditions=True)


def memory_adapters(world: MemoryWorld) -> Adapters:
    """The three adapters over ``world``, with no validation and no dry-run wrapping: the settings'
    backends are not consulted, since whoever asks for these means the simulated world."""
    return Adapters(MemorySlurm(world), MemoryKube(world), MemoryVM(world), intents=MemoryIntents())


def make_adapters(settings: Settings, world: MemoryWorld | None = None, intents: Intents | None = None) -> Adapters:
    """All three adapters the workflow drives; under ``dry_run`` every writer records instead. ``intents``
    (the database's, from the entry point) is where an action that cannot be repeated safely is
    recorded before it is sent (a redfish reset, a checkpoint request)."""
    slurm = slurm_backend(settings, world)
    kube = kube_backend(settings, world)
    machine = machine_backend(settings, world, intents)  # built even for a dry run: bad settings fail at start-up
    validator = validator_backend(settings)
    real = Adapters(slurm, kube, machine, validator, intents)
    return twin(settings, real) if settings.dry_run else real


def twin(settings: Settings, real: Adapters) -> Adapters:
    """The dry-run twin of ``real``: every writer records instead, every reader reads through."""
    recorder = Recorder()
    return Adapters(NoopSlurm(real.slurm, recorder), NoopKube(real.kube, recorder) if real.kube is not None else None,
                    noop_machine(settings, real.machine, recorder) if real.machine is not None else None,
                    NoopValidator(recorder) if real.validator is not None else None, real.intents)


class AdaptersByPolicy:
    """The adapters each remediation's recorded policy calls for: its profile's hammer
    (``machine.backend``) and validation, and the dry-run twins for a profile in ``shadow``. The
    Slurm and Kubernetes adapters are the service's own; what a policy changes is built once.
    ``base`` is what a remediation under the configuration's own policy uses (``real``, or under the
    service's dry-run its twins). ``machines`` and ``validators`` build a policy's hammer and validation
    (default: the backends its settings name, outside any world; :meth:`build` gives the world and the
    intents; the rehearsal maps them onto its world)."""

    def __init__(self, settings: Settings, real: Adapters, base: Adapters | None = None,
                 *, machines: Callable[[Settings], MachineProvider | None] | None = None,
                 validators: Callable[[Settings], Validator | None] | None = None) -> None:
        self.settings = settings
        self.machines = machines or machine_backend
        self.validators = validators or validator_backend
        self.real = real
        self.base = base if base is not None else twin(settings, real) if settings.dry_run else real
        self._built: dict[tuple[str, str, bool], Adapters] = {}

    @classmethod
    def build(cls, settings: Settings, world: MemoryWorld | None = None,
              intents: Intents | None = None) -> AdaptersByPolicy:
        real = make_adapters(settings.model_copy(update={"dry_run": False}), world, intents)
        return cls(settings, real, machines=lambda s: machine_backend(s, world, intents))

    def of(self, policy: EffectivePolicy | None, shadow: bool) -> Adapters:
        """The adapters of a remediation under ``policy`` (None: the configuration's own), in its
        profile's shadow or not."""
        own = policy is None or (policy.machine.backend == self.settings.machine.backend
                                 and policy.validation == self.settings.validation)
        if own and (not shadow or self.settings.dry_run):
            return self.base
        dry = shadow or self.settings.dry_run
        under = self.settings if policy is None else self.settings.under(policy)
        key = (under.machine.backend, under.validation.model_dump_json(), dry)
        if key not in self._built:
            real = self.real if own else replace(self.real, machine=self.machines(under),
                                                 validator=self.validators(under))
            self._built[key] = twin(under, real) if dry else real
        return self._built[key]


def noop_machine(settings: Settings, machine: MachineProvider, recorder: Recorder) -> MachineProvider:
    """The dry-run twin of ``machine``: redfish's reads the real BMCs (a bare-metal machine is found by
    its node, so the twin must find it too); Slurm's reboot names the node itself; ``auto`` beside a
    BMC inventory finds machines as the real router does; a cloud's reads nothing."""
    if settings.machine.backend == "redfish":
        from remediation.adapters.redfish.noop import NoopRedfish
        from remediation.adapters.redfish.provider import RedfishProvider

        assert isinstance(machine, RedfishProvider)
        return NoopRedfish(machine, recorder)
    if settings.machine.backend == "slurm":
        return NoopSlurmReboot(recorder)
    if isinstance(machine, MachinesByNode):  # auto beside a BMC inventory
        return NoopMachineByNode(machine, recorder)
    return NoopMachine(recorder)


def validator_backend(settings: Settings) -> Validator | None:
    """The validation ``validation.backend`` names (None: no validation, verify leads to return)."""
    backend = settings.validation.backend
    if backend == "none":
        return None
    if backend == "slurm":
        needs_slurm_commands(settings, "validation.backend=slurm runs sbatch and scontrol", "validation")
        from remediation.adapters.slurm.validator import SlurmValidator

        return SlurmValidator(settings.slurm, settings.validation, settings.policy.our_reason_prefix)
    if settings.kube.backend in ("memory", "noop"):
        raise ConfigError("validation.backend=kubernetes creates Jobs: it needs kube.backend kubernetes, not "
                          f"{settings.kube.backend}", component="validation")
    from remediation.adapters.kube.adapter import make_kube
    from remediation.adapters.kube.validator import KubeValidator

    kube = make_kube(settings)
    return KubeValidator(kube.api, settings.kube, settings.validation, node_for=kube.node_for)


def needs_slurm_commands(settings: Settings, what: str, component: str) -> None:
    """Refuse, at start-up, a backend that runs the Slurm commands beside a simulated or no-op Slurm."""
    if settings.slurm.backend in ("memory", "noop"):
        raise ConfigError(f"{what}: it needs slurm.backend cli or rest, not {settings.slurm.backend}",
                          component=component)


def slurm_backend(settings: Settings, world: MemoryWorld | None = None) -> SlurmControl:
    """The SlurmControl ``slurm.backend`` names (the watcher reads through this one directly)."""
    if settings.slurm.backend == "memory":
        return MemorySlurm(world or make_world(settings))
    if settings.slurm.backend == "noop":
        return NoopSlurm()
    from remediation.adapters.slurm.backend import make_slurm

    return make_slurm(settings)


def kube_backend(settings: Settings, world: MemoryWorld | None = None) -> KubeNodes | None:
    """The KubeNodes ``kube.backend`` names (None: ``none``, the site has no Kubernetes)."""
    if settings.kube.backend == "none":
        return None
    if settings.kube.backend == "memory":
        return MemoryKube(world or make_world(settings))
    if settings.kube.backend == "noop":
        return NoopKube()
    from remediation.adapters.kube.adapter import make_kube

    return make_kube(settings)


def machine_backend(settings: Settings, world: MemoryWorld | None = None,
                    intents: Intents | None = None) -> MachineProvider | None:
    """The MachineProvider ``machine.backend`` names (None: ``none``, the site has no machine action).
    With a ``world`` given, ``auto`` also routes ``memory:///`` VMs (the simulated cluster) to it; with
    ``redfish.inventory_file`` set, the nodes the inventory lists to their BMCs."""
    if settings.machine.backend == "none":
        return None
    if settings.machine.backend == "memory":
        return MemoryVM(world or make_world(settings))
    if settings.machine.backend == "noop":
        return NoopMachine()
    if settings.machine.backend == "slurm":
        needs_slurm_commands(settings, "machine.backend=slurm runs scontrol reboot", "slurm")
        from remediation.adapters.slurm.reboot import SlurmReboot

        return SlurmReboot(settings.slurm, settings.policy.our_reason_prefix)
    if settings.machine.backend == "redfish":
        from remediation.adapters.redfish import make_redfish

        return make_redfish(settings, intents)
    from remediation.adapters.cloud.router import make_vm_provider

    bare_metal = None
    if settings.machine.backend == "auto" and settings.redfish.inventory_file:
        from remediation.adapters.redfish import make_redfish

        bare_metal = make_redfish(settings, intents)  # the nodes its inventory lists: their BMCs
    if world is None:
        return make_vm_provider(settings, bare_metal=bare_metal)
    simulated = world
    return make_vm_provider(settings, extra={"memory": lambda: MemoryVM(simulated)}, bare_metal=bare_metal)


def rack_power_backend(settings: Settings, intents: Intents | None,
                       recorder: Recorder | None = None) -> RackPower | None:
    """The rack power of the NVLink domains (None: no ``redfish.inventory_file``, so no chassis is
    known); under ``dry_run`` its twin, recording into ``recorder``. The real one is built either way:
    bad settings fail at start-up."""
    if not settings.redfish.inventory_file:
        return None
    from remediation.adapters.redfish import make_rack_power

    real = make_rack_power(settings, intents)
    if not settings.dry_run:
        return real
    from remediation.adapters.redfish.noop import NoopRackPower

    return NoopRackPower(real, recorder)


def evidence_storage(settings: Settings, *, recorder: Recorder | None = None) -> EvidenceStorage:
    """Where collected evidence is kept (``evidence.store``): in the rows only (``database``), else the
    directory or the bucket for items over ``inline_bytes``. Given a ``recorder`` (a dry run's), the
    twin that stores nothing and records what it would; the real one is built all the same, so bad
    settings fail at start-up."""
    from remediation.adapters.evidence_store import DirectoryStore, NoopEvidenceStore, S3Store
    from remediation.evidence_collection.settings import StoreBackend

    cfg = settings.evidence.store
    blobs: EvidenceStore | None = None
    if cfg.backend is StoreBackend.DIRECTORY:
        blobs = DirectoryStore(cfg.path)
    elif cfg.backend is StoreBackend.S3:
        blobs = S3Store(cfg.bucket, cfg.prefix, endpoint_url=cfg.endpoint_url, region=cfg.region)
    if recorder is not None and blobs is not None:
        blobs = NoopEvidenceStore(recorder)
    return EvidenceStorage(cfg.inline_bytes, blobs)


def redis_client(settings: Settings, timeout: float) -> redis.Redis:
    """A client of the broker's Redis (``broker.redis_url``) that gives up on a connect or a reply
    after ``timeout`` seconds, so an unreachable Redis is an error the caller handles, never a hang.
    Each caller picks the bound its work can wait: a watcher's publish, a page's queue depth, a
    worker's stream read. The URL names the component's own ACL user; a ``rediss://`` URL speaks TLS
    (``broker.ca_file``). Under ``broker.sentinel`` the client is the sentinels' current primary."""
    import redis

    b = settings.broker
    if not b.sentinel.enabled:
        return redis.Redis.from_url(b.redis_url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                    **b.tls(b.redis_url))
    from redis.connection import parse_url
    from redis.sentinel import Sentinel

    # Under Sentinel the URL gives who we are (user, password, database, TLS); the sentinels say where.
    # A client asks them again whenever it (re)connects, so it follows a failover by itself.
    own = {k: v for k, v in parse_url(b.redis_url).items()  # type: ignore[no-untyped-call]
           if k not in ("host", "port", "connection_class")}
    tls = b.tls(b.redis_url)
    sentinel = Sentinel(b.sentinel.hosts(), sentinel_kwargs=b.sentinel_kwargs(timeout),  # type: ignore[no-untyped-call]
                        socket_timeout=timeout, socket_connect_timeout=timeout, **own,
                        **({"ssl": True, **tls} if tls else {}))
    primary: redis.Redis = sentinel.master_for(b.sentinel.master)  # type: ignore[no-untyped-call]
    return primary


def make_bus(settings: Settings, client: redis.Redis | None = None) -> RedisEventBus:
    """The bus watchers publish to. On Redis a publisher only appends: its ACL user may XADD to the
    stream and nothing else, and the workers' kick relay (remediation.workers.kick_relay) starts the ingest.
    ``memory://`` (embedded mode) gives the in-process bus, which kicks the ingest task itself."""
    if settings.broker.embedded:
        from remediation.adapters.celery import celery_dispatcher
        from remediation.adapters.memstream import MemoryEventBus

        return MemoryEventBus(kick=celery_dispatcher(settings).kick_ingest,  # type: ignore[return-value]
                              cluster=settings.cluster.name)
    from remediation.adapters.bus import RedisEventBus

    b = settings.broker
    client = client or redis_client(settings, WATCHER_REDIS_TIMEOUT_S)
    return RedisEventBus(client, b.key_prefix, replica_acks=b.replica_acks,
                         replica_ack_timeout_ms=b.replica_ack_timeout_ms, cluster=settings.cluster.name)


def make_lock(settings: Settings, kind: str, client: redis.Redis | None = None, *, ttl_s: float = 10.0,
              bus: RedisEventBus | None = None) -> LeaderLock:
    """The leader lock of one kind of watcher (only the holder publishes). Given the watcher's ``bus``,
    the bus stamps the lock's fencing token on what it publishes and refuses to publish without it."""
    if settings.broker.embedded:
        from remediation.adapters.memstream import LocalLock

        return LocalLock()  # type: ignore[return-value]
    from remediation.adapters.bus import Keys
    from remediation.adapters.lock import LeaderLock

    b = settings.broker
    client = client or redis_client(settings, WATCHER_REDIS_TIMEOUT_S)
    space = Keys(b.key_prefix, cluster=settings.cluster.name).space  # the cluster's own keys
    lock = LeaderLock(client, f"{space}:leader:{kind}", ttl_s, kind=kind, replica_acks=b.replica_acks,
                      replica_ack_timeout_ms=b.replica_ack_timeout_ms)
    if bus is not None:
        bus.fenced_by(lock)
    return lock
