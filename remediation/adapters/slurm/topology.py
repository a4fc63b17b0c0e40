"""Where the Slurm watcher learns switch domains from, whatever the backend, and says so.

First that applies: ``slurm.topology_conf`` (a topology.conf, a topology.yaml or the directory holding
them; topology.yaml wins, as in Slurm), then ``scontrol show topology``; slurmrestd serves no switch
list. With none, the watcher warns at start-up.

Why: docs/slurm-releases.md#topology
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from remediation.domain.topology import Switch, parse_topology_conf, parse_topology_yaml
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
        chosen = topology_file(path)
        kind = "topology.yaml" if chosen.suffix in YAML_SUFFIXES else "topology.conf"
        origin = f"{kind} at {chosen} (slurm.topology_conf)"
        if chosen != path:
            origin += f"; Slurm reads it before any topology.conf (slurm.topology_conf is {path})"
        return TopologySource(lambda: read_topology_conf(path), origin)
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


YAML_SUFFIXES = (".yaml", ".yml")


def topology_file(path: Path) -> Path:
    """The file slurmctld would read for ``path`` (``slurm.topology_conf``): a directory's topology.yaml,
    else its topology.conf; a topology.yaml (by its suffix) itself; a topology.conf, unless a
    topology.yaml sits beside it, which Slurm 25.05 and later read first and then ignore topology.conf."""
    if path.is_dir():
        yaml_file = path / "topology.yaml"
        return yaml_file if yaml_file.is_file() else path / "topology.conf"
    if path.suffix in YAML_SUFFIXES:
        return path
    beside = path.with_name("topology.yaml")
    return beside if beside.is_file() else path


def read_topology_conf(path: Path) -> list[Switch]:
    """The switches and blocks the file :func:`topology_file` picks for ``path`` defines, chosen again at
    each read (a site may add a topology.yaml). A file that cannot be read is a configuration fault (the
    watcher logs it and keeps the domains it last published); one that cannot be parsed names its line."""
    chosen = topology_file(path)
    try:
        text = chosen.read_text()
    except OSError as exc:
        raise ConfigError(f"slurm.topology_conf {chosen}: {exc.strerror or exc}", component="slurm") from None
    if chosen.suffix in YAML_SUFFIXES:
        return parse_topology_yaml(text, source=str(chosen))
    return parse_topology_conf(text, source=str(chosen))
