"""A simulated Slurm-on-Kubernetes GPU cluster that speaks the real wire protocols.

:class:`SimCluster` starts the kube-apiserver subset, the GCE and Azure fakes, the slurmrestd stand-in
and, with ``bare_metal=N``, a Redfish BMC, and links them as Slurm-on-Kubernetes does: a clock thread
(``tick_s``) turns each VM's state into its Node's and slurmd's. Faults: :mod:`remediation.simulator.fault_injection`.
``python -m remediation.simulator.cluster`` serves it (:mod:`remediation.simulator.standalone`).

Why: docs/wire-protocols.md#the-simulated-cluster
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import os
import secrets
import shlex
import socket
import socketserver
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remediation.simulator.azure_api import AzureFake, make_self_signed_cert
from remediation.simulator.fault_injection import FaultInjector
from remediation.simulator.gce_api import GceFake
from remediation.simulator.kube.api import KubeAPIServer, ServingPki
from remediation.simulator.redfish_bmc import RedfishBmc
from remediation.simulator.slurmctld import SlurmCtld
from remediation.simulator.slurmrestd import SlurmRestd

PROJECT, ZONE = "sim-project", "us-central1-a"
SUBSCRIPTION, GROUP = "00000000-0000-4000-8000-00000000c0de", "sim-gpu-rg"
SLURM_NAMESPACE, SLURMD_LABEL = "slurm", ("app.kubernetes.io/component", "slurmd")
# GKE's compact-placement labels: every GKE Node of the reservation is in one block, and each run of
# SUBBLOCK_SIZE consecutive GKE Nodes shares a sub-block (one rack, one leaf switch).
BLOCK_LABEL = "cloud.google.com/gce-topology-block"
SUBBLOCK_LABEL = "cloud.google.com/gce-topology-subblock"
SUBBLOCK_SIZE = 4
#: The Node label GPU Feature Discovery sets to the NVLink clique: ``<cluster uuid>.<clique id>``.
CLIQUE_LABEL = "nvidia.com/gpu.clique"


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _rebind(httpd: socketserver.TCPServer, host: str, port: int) -> None:
    """Move a constructed server that is not serving yet to ``host:port``. The fakes bind 127.0.0.1 on
    a free port in their constructors (right for tests, which run in parallel); the standalone
    simulator needs a fixed address reachable from other containers."""
    httpd.server_close()
    httpd.socket = socket.socket(httpd.address_family, httpd.socket_type)
    httpd.server_address = (host, port)
    httpd.server_bind()
    httpd.server_activate()


#: The GPU tools of a simulated node, for the evidence job (what each prints comes from its environment).
NODE_TOOLS = {
    "nvidia-smi": '#!/bin/sh\ncase "$1" in\n  -q) printf "==============NVSMI LOG==============\\n%s" "$NR_SIM_SMI_Q" ;;\n'
                  '  *) printf "gpu_bus_id, remapped_rows.uncorrectable, remapped_rows.pending\\n'
                  '00000000:3B:00.0, 0, No\\n" ;;\nesac\n',
    "journalctl": '#!/bin/sh\nprintf "%s" "$NR_SIM_KERNEL"\n',
    "logger": '#!/bin/sh\nshift 3\necho "$*" >> "$NR_SIM_JOURNAL"\n',
}


class LinkedGce(GceFake):
    advertise = "127.0.0.1"  # the host name in every URL we hand out

    @property
    def url(self) -> str:
        return f"http://{self.advertise}:{self.port}"

    def vm_state(self, key: tuple[str, ...]) -> tuple[int, bool]:
        """(boot count, busy): busy while an operation on the instance runs or it is not RUNNING."""
        with self._lock:
            self._advance()
            inst = self._instances[(key[0], key[1], key[2])]
            running_op = any(
                not op.done and (op.project, op.zone, op.instance) == key for op in self._ops.values()
            )
            return int(inst["boot_count"]), running_op or inst["status"] != "RUNNING"


class LinkedAzure(AzureFake):
    advertise = "127.0.0.1"

    @property
    def url(self) -> str:  # also the base of the Azure-AsyncOperation and Location headers
        return f"https://{self.advertise}:{self.port}"

    def vm_state(self, key: tuple[str, ...]) -> tuple[int, bool]:
        with self._lock:
            self._advance()
            vm = self._vms[self._key(*key)]
            return int(vm["boot_count"]), vm["provisioning"] == "updating" or vm["power"] != "running"


class LinkedSlurmRestd(SlurmRestd):
    advertise = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.advertise}:{self.port}"


@dataclass
class Link:
    """One Slurm node and everything under it."""

    slurm: str
    k8s: str
    provider: str  # "gce", "azure" or "redfish"
    vm_key: tuple[str, ...]
    provider_id: str
    boot_seen: int = 1
    vm_down: bool = False
    back_at: float | None = None
    broken: bool = False
    flapping_until: float = 0.0
    reboot_delay_s: float | None = None  # this VM's boot time, if not the cluster's reboot_delay_s
    relapse_after_s: float | None = None  # a lemon that boots fine, then faults again this much later
    bad_hbm: bool = False  # a GPU memory fault a reboot does not cure: only the validation's check sees it


@dataclass(frozen=True)
class Timing:
    """How fast the simulated world moves, in seconds."""

    reboot_delay_s: float = 1.0  # a VM's boot
    op_seconds: float = 0.5  # a cloud or BMC operation, from accepted to done
    slurmd_timeout_s: float = 1.0  # slurmctld's SlurmdTimeout: a silent node goes DOWN after it
    not_responding_after_s: float = 0.3  # a silent node is NOT_RESPONDING after it
    tick_s: float = 0.05  # the clock thread's tick


@dataclass(frozen=True)
class NvlRack:
    """The cluster is one NVL72 rack: every node a compute tray, a GKE A4X VM named ``<prefix>-<i>``
    whose Node carries the rack's NVLink ``clique`` label (``<cluster uuid>.<clique id>``)."""

    clique: str
    prefix: str = "nvl-tray"


@dataclass(frozen=True)
class Listen:
    """Where the endpoints listen, the host name their URLs carry, and where the certificate is kept.

    ``bind``/``base_port`` choose the address and ports (kube, GCE, Azure, slurmrestd on
    ``base_port``..+3; 0 = free ports), ``advertise`` the host name in the URLs (default: ``bind``,
    or 127.0.0.1 when binding every interface), ``state_dir`` where the certificate is kept (default:
    a temp dir)."""

    bind: str = "127.0.0.1"
    advertise: str | None = None
    base_port: int = 0
    state_dir: Path | None = None


def as_entry(env: dict[str, str], cluster: str | None) -> dict[str, str]:
    """``env`` (``REMEDIATION_<SECTION>__<FIELD>``) as the fields of the ``clusters`` entry ``cluster``
    (``REMEDIATION_CLUSTERS__<NAME>__<SECTION>__<FIELD>``), so that several simulated clusters' files
    can be sourced by one worker; ``env`` itself for None."""
    if cluster is None:
        return env
    name = cluster.upper().replace("-", "_")
    return {f"REMEDIATION_CLUSTERS__{name}__{k.removeprefix('REMEDIATION_')}": v for k, v in env.items()}


class SimCluster(FaultInjector):
    """The linked endpoints; use as a context manager or call :meth:`start` / :meth:`stop`.

    By default every endpoint listens on 127.0.0.1 on a free port and the Azure certificate lives in
    a temp dir; :class:`Listen` says otherwise, :class:`Timing` how fast the world moves."""

    def __init__(
        self,
        nodes: int = 8,
        *,
        timing: Timing | None = None,
        listen: Listen | None = None,
        seed: int = 0,
        bare_metal: int = 0,
        rack: NvlRack | None = None,
    ) -> None:
        super().__init__(seed)
        timing, listen = timing or Timing(), listen or Listen()
        self.reboot_delay_s = timing.reboot_delay_s
        self.tick_s = timing.tick_s
        self.rack = rack
        self.names = [f"{rack.prefix if rack else 'gpu-node'}-{i}" for i in range(nodes + bare_metal)]
        self.clouds = nodes  # gpu-node-0..nodes-1 are cloud VMs, the rest bare metal
        self.ctld = SlurmCtld(
            self.names,
            not_responding_after_s=timing.not_responding_after_s,
            slurmd_timeout_s=timing.slurmd_timeout_s,
        )
        self.kube_token, self.slurm_token, self.azure_token = (secrets.token_hex(12) for _ in range(3))
        self.bind, self.base_port = listen.bind, listen.base_port
        self.advertise = listen.advertise or (listen.bind if listen.bind not in ("0.0.0.0", "") else "127.0.0.1")
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        valid_days = 365  # a docker-compose simulator may well run for longer than a test
        state_dir = listen.state_dir
        if state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="simcluster-")
            state_dir, valid_days = Path(self._tmp.name), 1
        self.state_dir: Path = state_dir
        self._make_servers(timing.op_seconds, valid_days, bare_metal=bare_metal)
        self.links: dict[str, Link] = {}
        self.subblocks: dict[str, list[str]] = {}  # GKE sub-block label value -> its Slurm nodes
        self.lock = threading.RLock()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _make_servers(self, op_seconds: float, valid_days: int, *, bare_metal: int) -> None:
        """The kube-apiserver, GCE, Azure, slurmrestd and (with bare metal) BMC fakes, their
        certificates in ``state_dir``, each rebound where :class:`Listen` asked."""
        state_dir = self.state_dir
        self.cert_file, key_file = make_self_signed_cert(
            state_dir, ["localhost", self.advertise], valid_days=valid_days
        )
        self.kube = KubeAPIServer(
            token=self.kube_token, pki=ServingPki(state_dir, [self.advertise], valid_days=valid_days)
        )
        self.gce = LinkedGce(op_seconds=op_seconds, wait_seconds=0.5)
        self.azure = LinkedAzure(self.cert_file, key_file, op_seconds=op_seconds)
        # TLS, as slurmrestd must be wherever its JWT crosses a network (slurm.rest_token over http:// to
        # anything but loopback is refused); the Azure fake's certificate names the advertised host.
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(self.cert_file, key_file)
        self.slurmrestd = LinkedSlurmRestd(self.ctld, token=self.slurm_token, ssl_context=tls)
        self.bmc = (
            RedfishBmc(state_dir, op_seconds=op_seconds, hosts=(self.advertise,)) if bare_metal else None
        )
        servers: tuple[LinkedGce | LinkedAzure | LinkedSlurmRestd | RedfishBmc, ...] = (
            self.gce,
            self.azure,
            self.slurmrestd,
            *([self.bmc] if self.bmc else []),
        )
        for offset, server in enumerate(servers, start=1):
            server.advertise = self.advertise
            if (self.bind, self.base_port) != ("127.0.0.1", 0):
                _rebind(server._httpd, self.bind, self.base_port + offset if self.base_port else 0)

    # -------------------------------------------------------------------------------- lifecycle

    def start(self) -> SimCluster:
        self.kube.start()
        if (self.bind, self.base_port) != ("127.0.0.1", 0):
            self._move_kube()
        assert self.kube._httpd is not None
        self.kube.url = f"https://{self.advertise}:{self.kube._httpd.server_address[1]}"
        for server in self._servers():
            server.start()
        for i, name in enumerate(self.names):
            self._add_node(i, name)
        self.kube.jobs.outcome = self.check_outcome
        self._thread = threading.Thread(target=self._run, name="simcluster-clock", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.kube.stop()
        for server in self._servers():
            server.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _servers(self) -> tuple[Any, ...]:
        return (self.gce, self.azure, self.slurmrestd, *([self.bmc] if self.bmc else []))

    def _fake(self, link: Link) -> Any:
        """The endpoint that holds a node's machine (its cloud's, or its BMC)."""
        return {"gce": self.gce, "azure": self.azure, "redfish": self.bmc}[link.provider]

    def _move_kube(self) -> None:
        """KubeAPIServer binds 127.0.0.1:0 and serves from ``start``: stop its loop, move the socket
        to the chosen address and serve again (no request can have arrived in between)."""
        httpd = self.kube._httpd
        assert httpd is not None
        httpd.shutdown()
        _rebind(httpd, self.bind, self.base_port)
        threading.Thread(target=httpd.serve_forever, args=(0.05,), name="kube-api", daemon=True).start()

    def __enter__(self) -> SimCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _add_node(self, i: int, name: str) -> None:
        topology: dict[str, str] = {}
        if i >= self.clouds and self.bmc is not None:
            k8s = f"bm-hgx-{i}"  # a bare-metal kubelet sets no providerID
            self.bmc.add_system(k8s)
            link = Link(name, k8s, "redfish", (k8s,), "")
        elif self.rack is not None or i % 2 == 0:
            k8s = f"gke-{'a3' if self.rack is None else 'a4x'}-pool-{i}"
            self.gce.add_instance(PROJECT, ZONE, k8s)
            link = Link(name, k8s, "gce", (PROJECT, ZONE, k8s), f"gce://{PROJECT}/{ZONE}/{k8s}")
            topology = self._gke_topology(i, name)
        else:
            k8s = f"aks-ndv4-{i}"
            self.azure.add_vm(SUBSCRIPTION, GROUP, k8s)
            rid = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/Microsoft.Compute/virtualMachines/{k8s}"
            link = Link(name, k8s, "azure", (SUBSCRIPTION, GROUP, k8s), f"azure://{rid}")
        labels = {"nvidia.com/gpu.present": "true", "kubernetes.io/hostname": k8s, **topology}
        self.kube.add_node(k8s, provider_id=link.provider_id, labels=labels)
        self.kube.add_pod(
            SLURM_NAMESPACE, name, node_name=k8s, labels=dict([SLURMD_LABEL]), owner_kind="DaemonSet",
            owner_name="slurmd",
        )  # fmt: skip
        self.kube.add_pod(
            "training", f"llama-405b-worker-{i}", node_name=k8s, labels={"app": "llama-405b"},
            owner_kind="StatefulSet", owner_name="llama-405b-worker", empty_dir=True,
        )  # fmt: skip
        self.links[name] = link

    def _gke_topology(self, i: int, name: str) -> dict[str, str]:
        """A GKE Node's placement labels: the rack's NVLink clique, or else the reservation's block and the
        sub-block of its run of SUBBLOCK_SIZE GKE Nodes."""
        if self.rack is not None:
            return {CLIQUE_LABEL: self.rack.clique}
        subblock = f"sb-{i // 2 // SUBBLOCK_SIZE}"
        self.subblocks.setdefault(subblock, []).append(name)
        return {BLOCK_LABEL: "block-0", SUBBLOCK_LABEL: subblock}

    def check_outcome(self, k8s_node: str, argv: list[str]) -> tuple[int | None, str, float]:
        """What a validation check Job's pod does on ``k8s_node`` (remediation.simulator.kube.jobs): a node with a
        bad HBM row fails DCGM's memory test however often it reboots; every other node passes. The
        gpu-reset rung's Job (its script is named ``nr-gpu-reset``) fails on a broken VM, whose GPU is
        gone, and elsewhere succeeds and clears the GPU conditions injected on the node, as NVSentinel
        does when it sees the reset in the kernel log; a bad HBM row survives it (the check finds it)."""
        link = next((lk for lk in self.links.values() if lk.k8s == k8s_node), None)
        run = " ".join(argv)
        if "nr-evidence" in argv and link is not None:
            return self.evidence_outcome(link, argv)
        if "nr-gpu-reset" in argv and link is not None:
            if link.broken:
                return 1, "Unable to reset GPU 00000000:3B:00.0: the GPU is lost; a reboot is required\n", 1.0
            for type_ in self.injected_conditions.pop(link.slurm, set()):
                self.kube.set_condition(link.k8s, type_, "False", reason="NoFault", message="after GPU reset")
            return 0, "GPU 00000000:3B:00.0 was successfully reset.\n", 1.0
        gpus = self.gpu_identity_lines(link) if link is not None else ""
        if link is not None and link.bad_hbm:
            return 1, (f"$ {run}\n| Diagnostic       | Result                                   |\n"
                       "| Memory           | Fail - GPU 3: uncorrectable ECC error; row remapping "
                       f"failed (bank 12, row 4821)     |\n{gpus}"), 1.0
        return 0, f"$ {run}\n| Diagnostic       | Result |\n| Memory           | Pass   |\n{gpus}", 1.0

    def evidence_outcome(self, link: Link, argv: list[str]) -> tuple[int | None, str, float]:
        """The evidence job's pod: its own script, run here as the node's shell would, against the GPU
        tools of this simulated node (:data:`NODE_TOOLS`): ``nvidia-smi -q`` names the node's GPUs, the
        kernel log holds its fault, and ``logger`` writes to the node's journal (``journal(node)``)."""
        tools = self.state_dir / "node-tools"
        if not tools.is_dir():
            tools.mkdir()
            for name, text in NODE_TOOLS.items():
                (tools / name).write_text(text)
                (tools / name).chmod(0o755)
        fault = "79, GPU has fallen off the bus" if link.broken else "48, DBE (double bit error) ECC error"
        env = {"PATH": f"{tools}:/usr/bin:/bin", "NR_SIM_SMI_Q": self.gpu_identity_lines(link),
               "NR_SIM_KERNEL": f"kernel: NVRM: Xid (PCI:0000:3b:00): {fault}\n",
               "NR_SIM_JOURNAL": str(self.journal(link.slurm))}
        started = time.monotonic()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
        return done.returncode, done.stdout, max(0.1, time.monotonic() - started)

    def journal(self, node: str) -> Path:
        """The file a simulated node's ``logger`` writes its journal lines to."""
        return self.state_dir / f"journal-{node}.log"

    def gpu_identity_lines(self, link: Link, count: int = 8) -> str:
        """The ``nvidia-smi -q`` lines a check script prints after its diagnostic: each GPU's serial and
        UUID, which belong to the hardware (a GCE VM's physical host, a BMC's system), not the name."""
        where = self.gce.vm(*link.vm_key).get("host") if link.provider == "gce" else None
        board = where or "/".join(link.vm_key)
        lines = []
        for i in range(count):
            digest = hashlib.sha256(f"{board}/{i}".encode()).hexdigest()
            lines.append(f"GPU 00000000:{0x18 + i:02X}:00.0\n    Serial Number                         : "
                         f"{int(digest[:12], 16) % 10**13:013d}\n    GPU UUID                              : "
                         f"GPU-{digest[12:20]}-{digest[20:24]}-{digest[24:28]}-{digest[28:32]}-{digest[32:44]}")
        return "\n".join(lines) + "\n"

    # ---------------------------------------------------------------------------- settings

    def settings_overrides(self, *, min_condition_s: float = 1.0) -> dict[str, str]:
        """The ``REMEDIATION_*`` environment that points the real adapters and watchers here."""
        return {
            "REMEDIATION_SLURM__BACKEND": "rest",
            "REMEDIATION_SLURM__REST_URL": self.slurmrestd.url,
            "REMEDIATION_SLURM__REST_API_VERSION": "v0.0.40",
            "REMEDIATION_SLURM__REST_USER": "remediation",
            "REMEDIATION_SLURM__REST_TOKEN": self.slurm_token,
            "REMEDIATION_SLURM__REST_CA_FILE": str(self.cert_file),
            "REMEDIATION_KUBE__BACKEND": "kubernetes",
            "REMEDIATION_KUBE__HOST": self.kube.url,
            "REMEDIATION_KUBE__TOKEN": self.kube_token,
            "REMEDIATION_KUBE__CA_FILE": str(self.kube.ca_file),
            "REMEDIATION_KUBE__MAPPING": "pod",
            "REMEDIATION_KUBE__POD_NAMESPACE": SLURM_NAMESPACE,
            "REMEDIATION_KUBE__POD_LABEL_SELECTOR": "=".join(SLURMD_LABEL),
            "REMEDIATION_KUBE__MIN_CONDITION_S": f"{min_condition_s:g}",
            "REMEDIATION_MACHINE__BACKEND": "auto",
            "REMEDIATION_MACHINE__GCE_ENDPOINT": self.gce.url,
            "REMEDIATION_MACHINE__GCE_ANONYMOUS": "true",
            "REMEDIATION_MACHINE__AZURE_ENDPOINT": self.azure.url,
            "REMEDIATION_MACHINE__AZURE_CA_FILE": str(self.cert_file),
            "REMEDIATION_MACHINE__AZURE_TEST_TOKEN": self.azure_token,
            "REMEDIATION_MACHINE__REQUEST_TIMEOUT_S": "10",
            # The test token is refused on anything but loopback unless the host is named here.
            **({} if self.advertise in LOOPBACK else {"REMEDIATION_MACHINE__AZURE_TEST_HOST": self.advertise}),
            **(self.bmc.settings_overrides(self.state_dir, [lk.k8s for lk in self.links.values()
                                                             if lk.provider == "redfish"]) if self.bmc else {}),
        }

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig for ``kubectl`` against this cluster's apiserver (its CA, its token)."""
        return self.kube.write_kubeconfig(path)

    def write_env_file(self, path: Path, *, min_condition_s: float = 1.0, cluster: str | None = None) -> None:
        """:meth:`settings_overrides` as ``export`` lines for ``sh``'s ``.``; written atomically (a
        reader never sees half a file) and readable by every container's user. ``cluster``: as the
        settings of that entry of ``clusters`` (:func:`as_entry`)."""
        env = as_entry(self.settings_overrides(min_condition_s=min_condition_s), cluster)
        lines = [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.chmod(0o644)
        os.replace(tmp, path)

    def settings_kwargs(self, *, min_condition_s: float = 1.0) -> dict[str, dict[str, Any]]:
        """The same as nested keyword arguments for ``remediation.settings.load_settings``."""
        out: dict[str, dict[str, Any]] = {}
        for key, value in self.settings_overrides(min_condition_s=min_condition_s).items():
            section, field = key.removeprefix("REMEDIATION_").lower().split("__")
            out.setdefault(section, {})[field] = value
        return out

    # ------------------------------------------------------------------------------- reading

    def link(self, node: str) -> Link:
        return self.links[node]

    def vm(self, node: str) -> dict[str, Any]:
        link = self.links[node]
        return dict(self._fake(link).vm(*link.vm_key))

    def vm_actions(self, node: str) -> int:
        """VM actions (reset, stop/start, restart, redeploy, reimage, powerOff) the cloud took for this
        node's VM, or the resets its BMC accepted. On GCE a call repeated with the same requestId (a
        worker resuming the step, a retry after a timed-out answer) returns the first operation and does
        not act again, so it is not counted; :meth:`vm_requests` counts the calls themselves."""
        link = self.links[node]
        if link.provider == "gce":
            return sum(self.gce.actions(verb, link.k8s) for verb in ("reset", "stop"))
        return self.vm_requests(node)

    def vm_requests(self, node: str) -> int:
        """The VM action calls the cloud answered with success for this node's VM, from its request log
        (Azure acts on every one; GCE not on a requestId it has seen), or the resets its BMC accepted."""
        link = self.links[node]
        if self.bmc is not None and link.provider == "redfish":
            return self.bmc.resets(link.k8s)
        if link.provider == "gce":
            verbs, log = ("reset", "stop"), self.gce.log
        else:
            verbs, log = ("restart", "redeploy", "reimage", "poweroff"), self.azure.log
        return sum(
            log.count("POST", f"/{link.k8s}/{verb}", status=status) for verb in verbs for status in (200, 202)
        )

    def slurm_state(self, node: str) -> tuple[str, frozenset[str], str]:
        """(base state, flags, reason) as slurmctld holds them."""
        with self.ctld.lock:
            n = self.ctld.node(node)
            return self.ctld.base_state(n), frozenset(n.flags), n.reason

    def node_ready(self, node: str) -> str:
        conditions = self.kube.node(self.links[node].k8s)["status"]["conditions"]
        return str(next(c["status"] for c in conditions if c["type"] == "Ready"))

    def boot_id(self, node: str) -> str:
        return str(self.kube.node(self.links[node].k8s)["status"]["nodeInfo"]["bootID"])

    # --------------------------------------------------------------------------------- clock

    def at(self, delay_s: float, action: Callable[[], None]) -> None:
        """Run ``action`` on the cluster's clock thread ``delay_s`` from now."""
        with self.lock:
            heapq.heappush(self._timers, (time.monotonic() + delay_s, next(self._seq), action))

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a fake must keep running; the error is printed for the user
                import traceback

                traceback.print_exc()

    def tick(self) -> None:
        now = time.monotonic()
        due: list[Callable[[], None]] = []
        with self.lock:
            while self._timers and self._timers[0][0] <= now:
                due.append(heapq.heappop(self._timers)[2])
        for action in due:
            action()
        self.ctld.tick()
        for link in list(self.links.values()):
            self._follow_vm(link, now)

    def _follow_vm(self, link: Link, now: float) -> None:
        boot, busy = self._fake(link).vm_state(link.vm_key)
        with self.lock:
            if busy and not link.vm_down:
                link.vm_down = True
                self._go_down(link)
            if boot != link.boot_seen:
                link.boot_seen = boot
                delay = self.reboot_delay_s if link.reboot_delay_s is None else link.reboot_delay_s
                link.back_at = now + delay
                if not link.vm_down:
                    link.vm_down = True
                    self._go_down(link)
            if link.vm_down and not busy and (link.back_at is None or now >= link.back_at):
                rebooted = link.back_at is not None
                link.vm_down, link.back_at = False, None
                self._come_up(link, rebooted)

    def _go_down(self, link: Link) -> None:
        link.flapping_until = 0.0
        self.kube.add_event(link.k8s, "NodeNotReady", f"Node {link.k8s} status is now: NodeNotReady",
                            component="node-controller")  # fmt: skip
        self.kube.set_condition(
            link.k8s,
            "Ready",
            "Unknown",
            reason="NodeStatusUnknown",
            message="Kubelet stopped posting node status.",
        )
        self.ctld.slurmd_stop(link.slurm)

    def _come_up(self, link: Link, rebooted: bool) -> None:
        if rebooted:
            self.kube.bump_boot_id(link.k8s)
            self.kube.add_event(
                link.k8s, "Rebooted", f"Node {link.k8s} has been rebooted, boot id: "
                f"{self.kube.node(link.k8s)['status']['nodeInfo']['bootID']}", type_="Warning",
            )  # fmt: skip
            for type_ in self.injected_conditions.pop(link.slurm, set()):
                self.kube.set_condition(link.k8s, type_, "False", reason="NoFault", message="after reboot")
        self.kube.set_condition(
            link.k8s, "Ready", "True", reason="KubeletReady", message="kubelet is posting ready status"
        )
        if link.broken:
            self.gpu_condition(link.slurm, message="XID 79: GPU has fallen off the bus (again after reboot)")
            return  # slurmd never registers: the GPU fails its health check at start-up
        if rebooted and link.relapse_after_s is not None:
            self.at(link.relapse_after_s, lambda: self.gpu_condition(
                link.slurm, message="XID 48: double-bit ECC error (relapse after reboot)"))
        self.ctld.slurmd_start(link.slurm, booted=rebooted)


if __name__ == "__main__":  # python -m remediation.simulator.cluster: see remediation.simulator.standalone
    from remediation.simulator.standalone import main

    raise SystemExit(main())
