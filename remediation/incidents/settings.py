"""``incidents``: topology-correlated incidents (``REMEDIATION_INCIDENTS__*``)."""

from __future__ import annotations

from pydantic import Field

from remediation.settings.base import Section


class IncidentSettings(Section):
    """Topology-correlated incidents: when at least ``min_nodes`` nodes, or a fraction ``min_fraction``,
    of one failure domain (a Slurm switch, a Node label value such as a zone or an NVLink clique) fail
    within ``window_s``, they are one incident: drained in Slurm, no VM action, one page, never
    counted as repeat offenders. See docs/policy.md ("Correlated incidents")."""

    enabled: bool = Field(
        True, description="Open incidents at all. Off: every node is remediated on its own, as before."
    )
    min_nodes: int = Field(
        4,
        ge=2,
        description="K: an incident opens when at least this many nodes of one domain fail within "
        "window_s. 4 is a leaf switch's worth on most GPU fabrics (4-8 nodes per leaf); two nodes of a "
        "large domain failing together is chance, not a switch.",
    )
    min_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="F: ... or when at least this fraction of the domain's known nodes fail within "
        "window_s (and at least two do: one node is never a correlated fault). Half a leaf switch or "
        "half an NVLink domain going down together is the domain, not its nodes.",
    )
    window_s: float = Field(
        120.0,
        gt=0,
        description="T, seconds: failures of one domain this close together are one event. A switch "
        "that dies takes its nodes' slurmds out of reach within one SlurmdTimeout (300 s default), "
        "but slurmctld marks them in the same ping sweep; 120 s covers one sweep and a watcher poll.",
    )
    vm_grace_s: float = Field(
        120.0,
        ge=0,
        description="Seconds a remediation of a node that belongs to a domain waits after it opened "
        "before its first VM action, so that the failures of the same domain still to come can fold "
        "it into an incident first. Set it at least window_s: a remediation older than the window "
        "can no longer be part of a new incident. 0 turns the wait off.",
    )
    min_nodes_by_kind: dict[str, int] = Field(
        default_factory=dict,
        description="K for one kind of domain (a label key, or leaf-switch, switch, block), e.g. "
        '{"topology.kubernetes.io/zone": 64}: a zone holds thousands of nodes, and four of them failing '
        "in the same two minutes is chance, not the zone. Kinds not named use min_nodes.",
    )
    nvlink_domain_min_trays: int = Field(
        2,
        ge=2,
        description="K for NVLink faults: this many trays of one NVLink domain (a Slurm block, a "
        "nvidia.com/gpu.clique) with an NVLink fault within nvlink_domain_window_s are a fault of the "
        "domain, not of each tray. 2: every NVLink of an NVL72 tray runs to the same nine switch trays, so "
        "two trays losing links together point at the switches; by chance, at this doc's failure rates, "
        "once in over a century per rack. See docs/policy.md (\"Domain faults\").",
    )
    nvlink_domain_window_s: float = Field(
        600.0,
        gt=0,
        description="The window, seconds, in which nvlink_domain_min_trays NVLink faults of one domain "
        "make a domain fault. Longer than window_s: an NVLink error is raised when traffic crosses the "
        "link, so a tray idle when its switch failed reports it only when its next job starts; 600 s "
        "covers a scheduler's backfill cycle and a job's start-up.",
    )
    drain_partial_domains: bool = Field(
        False,
        description="When a topology/block block's healthy trays drop below its smallest block size "
        "(BlockSizes), drain the rest too, and give them back once it is whole again (NVSentinel #367's "
        "rule). Off by default: the rest still serve smaller jobs. Set it in a profile for the racks whose "
        "jobs only ever take whole domains. See docs/policy.md (\"A partial domain\").",
    )
    label_keys: list[str] = Field(
        default_factory=list,
        description="Node label keys whose values are failure domains; the Kubernetes watcher carries "
        "them to the service. Empty by default (only the Slurm topology is learnt): name the ones your "
        "cloud sets, e.g. nvidia.com/gpu.clique (NVIDIA GPU operator/DRA driver: the NVLink clique), "
        "cloud.google.com/gce-topology-subblock (GKE: the sub-block, the NVL72 domain on A4X), "
        "cloud.google.com/gce-topology-block (GKE: the reserved block) or topology.kubernetes.io/zone "
        "(well-known; give it a larger K in min_nodes_by_kind). See docs/policy.md.",
    )
    slurm_topology: bool = Field(
        True,
        description="Learn switch domains from `scontrol show topology` (topology/tree or "
        "topology/block), or from slurm.topology_conf when set (the rest backend's way: slurmrestd serves "
        "no switch list). A cluster without a topology plugin simply has no switch domains.",
    )
    topology_refresh_s: float = Field(
        600.0, gt=0, description="How often the Slurm watcher re-reads the topology, seconds."
    )
