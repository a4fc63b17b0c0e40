"""Import, before a prefork worker forks, the SDK modules its adapters will need.

Imported once in the parent, the modules are in every child from the fork. Nothing is built here: no
client, socket or thread exists before the fork, only modules.

Why: docs/architecture.md#a-mass-failure-is-isolated-in-batches
"""

from __future__ import annotations

import importlib

from remediation.settings import Settings

# (section, backend) -> the modules that backend's builder in remediation.adapters.factory imports.
# ``auto`` builds each cloud's client on its first VM action, so it imports no SDK up front.
MODULES: dict[tuple[str, str], tuple[str, ...]] = {
    ("slurm", "cli"): ("remediation.adapters.slurm.cli",),
    ("slurm", "rest"): ("remediation.adapters.slurm.rest",),
    ("kube", "kubernetes"): ("remediation.adapters.kube.adapter", "kubernetes.client.api.core_v1_api"),
    ("machine", "gce"): ("remediation.adapters.cloud.gce",),
    ("machine", "azure"): ("remediation.adapters.cloud.azure",),
    ("machine", "aws"): ("remediation.adapters.cloud.aws",),
    ("machine", "redfish"): ("remediation.adapters.redfish",),
    ("machine", "slurm"): ("remediation.adapters.slurm.reboot",),
    ("validation", "slurm"): ("remediation.adapters.slurm.validator",),
    ("validation", "kubernetes"): (
        "remediation.adapters.kube.validator",
        "kubernetes.client.api.batch_v1_api",
    ),
}


def modules_for(settings: Settings) -> list[str]:
    """The modules the configured backends' builders import, each once, in order."""
    names: list[str] = []
    for (section, backend), modules in MODULES.items():
        if getattr(settings, section).backend == backend:
            names += [m for m in modules if m not in names]
    return names


def preload(settings: Settings) -> list[str]:
    """Import :func:`modules_for` ``settings`` now; returns their names."""
    names = modules_for(settings)
    for name in names:
        importlib.import_module(name)
    return names
