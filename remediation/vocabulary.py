"""The vocabulary: the names of fault classes, ladder actions and clusters, spelled once.

:mod:`remediation.domain.causes` classifies into them and the workflow climbs their ladders, while the
settings check a site's overrides against them at start-up; so they sit at the bottom of the house,
beside the settings and the clock, where both can import them. Pure names, no rules.

Why: docs/architecture.md#the-house-layers-imports-pointing-down
"""

from __future__ import annotations

import re

#: The cluster of a site that names none, and of every row written before clusters had names; a node is
#: ``(cluster, name)`` (docs/architecture.md, "One service, many clusters").
DEFAULT_CLUSTER = "default"

# A DNS label: it names Redis keys, Kubernetes objects and metric labels, so nothing else is allowed.
CLUSTER_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def checked_cluster(value: str) -> str:
    """``value`` when it is a valid cluster name; otherwise a ValueError that says what one is."""
    if not CLUSTER_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a cluster name (lower-case letters, digits and '-', at most 63, "
                         "starting and ending with a letter or digit)")
    return value


def node_label(cluster: str, node: str, *, fleet: bool) -> str:
    """How a figure over several clusters names a node: ``cluster/name`` (a cluster name has no ``/``, so
    the label is unambiguous); over one cluster (``fleet`` False) its name alone, as before clusters."""
    return f"{cluster}/{node}" if fleet else node


UNKNOWN = "unknown"
#: A pseudo-class for application-level XIDs (NVIDIA: RESTART_APP, IGNORE): recorded, and remediated
#: only when they repeat. Never a remediation's class.
APP = "app"

#: Fault classes (``unknown`` when nothing in the signal names a cause). ``remediation/data/causes.yaml``
#: describes each one and must list exactly these.
FAULT_CLASSES = ("gpu-transient", "gpu-memory", "gpu-hardware", "gpu-rma", "nvlink", "nvswitch", "imex", "ib-link",
                 "fabric", "host", "software", UNKNOWN)

#: The GPU reset: ``nvidia-smi -r`` run on the node as a job, through the validation's backend. A rung
#: before any reboot (a reboot resets every GPU anyway). Not a machine action: no machine backend is
#: needed, only one that runs jobs on the node (``validation.backend``).
GPU_RESET = "gpu-reset"

#: Ladder actions: gpu-reset, restart (same host), move-host (GCE/AWS stop+start, Azure redeploy),
#: reimage, hold (drain, page, hold for a human; only on its own), quarantine (the end of a ladder; RMA
#: for hardware classes).
#: The ladder's machine rungs: what a machine backend does; a site with none (``machine.backend: none``)
#: skips them.
MACHINE_ACTIONS = ("restart", "move-host", "reimage")
#: The rung that drains and holds for a human, and the end of every ladder.
HOLD = "hold"
QUARANTINE = "quarantine"
FAULT_ACTIONS = (GPU_RESET, *MACHINE_ACTIONS, HOLD, QUARANTINE)
#: Ladder actions renamed, old name -> new name: a site's configuration may still say ``none`` for
#: ``hold`` (the word now names the backends a site lacks).
RENAMED_ACTIONS = {"none": "hold"}

#: The broker's queues: the ingest, the workflow steps and the levers' requests. A worker consumes all
#: three (``remediation worker`` passes them as ``-Q``, and isolate_queue()s each).
INGEST_QUEUE = "ingest"
WORKFLOW_QUEUE = "workflow"
REQUEST_QUEUE = "requests"
WORKER_QUEUES = (INGEST_QUEUE, WORKFLOW_QUEUE, REQUEST_QUEUE)
