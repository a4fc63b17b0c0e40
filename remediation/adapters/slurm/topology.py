"""Where the Slurm watcher learns switch domains from, whatever the backend, and says so.

Three sources, the first that applies wins:

1. ``slurm.topology_conf``: the cluster's ``topology.conf``, re-read at every refresh
   (:func:`remediation.domain.topology.parse_topology_conf`). For a service that reaches Slurm only
   through slurmrestd, with the file mounted from the cluster's configuration.
2. ``scontrol show topology``: the cli backend's own reader, and the rest backend's too where
   ``slurm.scontrol`` is installed beside the watcher with a slurm.conf (``slurm.slurm_conf``,
   ``SLURM_CONF`` or /etc/slurm/slurm.conf; it then needs munge, like the cli backend).
3. slurmrestd itself serves no switch list: no release tested here does (22.05's v0.0.38, 24.11's
   v0.0.40-42, 26.05's v0.0.42-45). 26.05 has ``GET /conf`` (``TopologyPlugin`` names the plugin, not
   its switches) and a per-node ``topology`` string that stays empty for nodes topology.conf places.

Where none applies the watcher learns no switch domains, and says why at start-up (a warning), rather
than leaving the incident rule silently without them.
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
