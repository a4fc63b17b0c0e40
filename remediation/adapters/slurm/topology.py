"""Where the Slurm watcher learns switch domains from, whatever the backend, and says so.

First that applies: ``slurm.topology_conf``, then ``scontrol show topology``; slurmrestd serves no switch
list. With none, the watcher warns at start-up.

Why: docs/slurm-releases.md#topology
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from remediation.domain.topology import Switch, parse_topology_conf
from remediation.ports.errors import ConfigError
from remediation.settings import SlurmSettings


@dataclass(frozen=True)
class TopologySource:
    """``read`` returns the switches now (None: no source); ``origin`` says where they come from, or why
    there is no source, for the start-up log."""

    read: Callable[[], list[Switch]] | None
    origin: str


def topology_source(settings: SlurmSettings, slurm: object) -> TopologySource:
    """The source of switch domains for a watcher that reads Slurm through ``slurm`` (a SlurmControl)."""
    if settings.topology_conf:
        path = Path(settings.topology_conf)
        return TopologySource(
            lambda: read_topology_conf(path), f"topology.conf at {path} (slurm.topology_conf)"
        )
    read = getattr(slurm, "topology", None)
    if callable(read):
        return TopologySource(read, "scontrol show topology")
    if settings.backend != "rest":
        return TopologySource(
            None,
            f"nowhere: the {settings.backend} backend has no topology reader and "
            "slurm.topology_conf is unset",
        )
    conf = settings.slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    if shutil.which(settings.scontrol) is not None and Path(conf).is_file():
        from remediation.adapters.slurm.cli import CliSlurm

        return TopologySource(
            CliSlurm(settings).topology, "scontrol show topology (slurmrestd serves no switch list)"
        )
    return TopologySource(
        None,
        f"nowhere: slurmrestd serves no switch list, slurm.topology_conf is unset "
        f"and {settings.scontrol!r} is not installed here or has no slurm.conf ({conf}); set "
        "slurm.topology_conf to the cluster's topology.conf",
    )


def read_topology_conf(path: Path) -> list[Switch]:
    """The switches ``path`` defines. A file that cannot be read is a configuration fault (the watcher
    logs it and keeps the domains it last published); one that cannot be parsed names its line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"slurm.topology_conf {path}: {exc.strerror or exc}", component="slurm") from None
    return parse_topology_conf(text, source=str(path))
