"""``python -m remediation.simulator.cluster``: serve a simulated cluster until SIGTERM, for docker-compose or a shell.

Prints the ``REMEDIATION_*`` environment as ``export`` lines. Options: ``--bind``, ``--base-port``,
``--advertise``, ``--state-dir`` (certificates, a kubeconfig and ``simulator.env``, written last as the
ready signal), ``--replay`` and ``--cluster`` (the settings as that entry of ``clusters``).

Why: docs/wire-protocols.md#the-simulated-cluster
"""

from __future__ import annotations

import argparse
import shlex
import signal
import threading
import time
from importlib import resources
from pathlib import Path

from remediation.simulator.cluster import Listen, SimCluster, Timing, as_entry
from remediation.vocabulary import checked_cluster

ENV_FILE = "simulator.env"
# The Llama 3 failure mix shipped with the package (remediation/data), found as a package resource.
TRACE = Path(str(resources.files("remediation.data").joinpath("llama3-405b-interruptions.csv")))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m remediation.simulator.cluster",
        description="Serve a simulated Slurm-on-Kubernetes GPU cluster (kube-apiserver, GCE, Azure and "
        "slurmrestd endpoints) until SIGTERM.",
    )
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument(
        "--reboot-delay", type=float, default=2.0, help="seconds from VM operation done to Ready"
    )
    parser.add_argument("--op-seconds", type=float, default=1.0, help="seconds a cloud operation takes")
    parser.add_argument("--bind", default="127.0.0.1", help="listen address (0.0.0.0 in a container)")
    parser.add_argument(
        "--advertise", help="host name the service reaches us by (default: --bind, or 127.0.0.1)"
    )
    parser.add_argument(
        "--base-port", type=int, default=0,
        help="kube-apiserver, GCE, Azure, slurmrestd on N, N+1, N+2, N+3 (0: free ports)",
    )  # fmt: skip
    parser.add_argument(
        "--state-dir", type=Path,
        help=f"write the Azure certificate and {ENV_FILE} (the REMEDIATION_* settings) here",
    )  # fmt: skip
    parser.add_argument(
        "--replay", action="store_true",
        help="keep injecting the Llama 3 failure mix, plus a storm every --storm-every seconds",
    )  # fmt: skip
    parser.add_argument(
        "--speedup", type=float,
        help="time compression of the trace (default: one fault every ~20 s on average)",
    )  # fmt: skip
    parser.add_argument("--storm-every", type=float, default=240.0, help="seconds between storms (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cluster", type=checked_cluster,
        help="write the settings as this entry of `clusters` (REMEDIATION_CLUSTERS__<NAME>__...), so that "
        "one worker can serve several simulated clusters (docs/running.md, 'Many clusters')",
    )  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if args.state_dir is not None:
        args.state_dir.mkdir(parents=True, exist_ok=True)
    cluster = SimCluster(
        args.nodes, timing=Timing(reboot_delay_s=args.reboot_delay, op_seconds=args.op_seconds), seed=args.seed,
        listen=Listen(bind=args.bind, advertise=args.advertise, base_port=args.base_port, state_dir=args.state_dir),
    )  # fmt: skip
    env_file = args.state_dir / ENV_FILE if args.state_dir is not None else None
    with cluster:
        for key, value in as_entry(cluster.settings_overrides(), args.cluster).items():
            print(f"export {key}={shlex.quote(value)}", flush=True)
        if args.replay:
            from remediation.simulator.continuous import ContinuousReplay, Storms, Tempo

            ContinuousReplay(cluster, TRACE, tempo=Tempo(speedup=args.speedup),
                             storms=Storms(every_s=args.storm_every), seed=args.seed).start()
        if args.state_dir is not None:
            kubeconfig = cluster.write_kubeconfig(args.state_dir / "kubeconfig")
            print(f"# kubectl --kubeconfig {kubeconfig} get nodes", flush=True)
        if env_file is not None:
            cluster.write_env_file(env_file, cluster=args.cluster)  # last: its presence means "ready" to the healthcheck
        printed = 0
        try:
            while not stop.wait(0.2):  # a short wait: the signal handler runs between waits
                new = cluster.injections[printed:]
                printed += len(new)
                for inj in new:
                    print(f"{time.strftime('%H:%M:%S')} {inj.kind} {inj.node}: {inj.detail}", flush=True)
        finally:
            if env_file is not None:
                env_file.unlink(missing_ok=True)  # its tokens die with this process
    return 0
