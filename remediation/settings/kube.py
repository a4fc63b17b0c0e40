"""``kube``: how the service reads and acts on Kubernetes Nodes (``REMEDIATION_KUBE__*``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from remediation.settings.base import Section


class KubeSettings(Section):
    """How the service reads Kubernetes Nodes, maps Slurm nodes to them and acts on them."""

    backend: Literal["kubernetes", "memory", "noop", "none"] = Field(
        "kubernetes",
        description="Kubernetes access: kubernetes (the API server), or none: this site has no "
        "Kubernetes (Slurm only), so cordon, eviction and the quarantine taint are no steps at all and "
        "the Kubernetes watcher does not start. memory is the simulated world; noop is the dry-run twin, "
        "refused outside dry-run.",
    )
    host: str | None = Field(
        None,
        description="API server URL (https://...); unset = in-cluster config or kubeconfig. A host with a "
        "token must be https: a bearer token is never sent in clear (client-go refuses to, too).",
    )
    token: SecretStr | None = Field(None, description="Bearer token (with host).")
    ca_file: str | None = Field(
        None,
        description="PEM file of the cluster CA that signed the API server's certificate (a kubeconfig's "
        "certificate-authority, the in-cluster ca.crt), used with host. Unset = the system trust store. "
        "Safe either way: the server's certificate and name are always verified, never skipped; a "
        "missing or unreadable file is a configuration error (automation pauses), never a node's fault.",
    )
    mapping: Literal["pod", "node", "static"] = Field(
        "pod", description="How a Slurm node name resolves to a Kubernetes Node."
    )
    pod_namespace: str = Field("slurm", description="Namespace of the slurmd pods (mapping=pod).")
    pod_label_selector: str = Field(
        "app.kubernetes.io/component=slurmd", description="Label selector of slurmd pods (mapping=pod)."
    )
    workload_namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces whose pods the workers evict from a Node (and ask to checkpoint), each "
        "listed on its own, so the workers need pods list and pods/eviction only there (a Role per "
        "namespace; deploy/ ships one for slurm). Empty: every namespace, one cluster-wide pod list, "
        "which needs a ClusterRole; pods elsewhere are left on the cordoned Node.",
    )
    static_map_file: str | None = Field(None, description="YAML {slurm_node: k8s_node} (mapping=static).")
    annotation_domain: str = Field(
        "remediation.gpu.io", description="Domain prefix of our annotations and taints."
    )
    min_condition_s: float = Field(
        300.0,
        ge=0,
        description="A bad condition must hold this long before it is published (flap suppression; "
        "MachineHealthCheck and NHC use 5 minutes).",
    )
    resync_interval_s: float = Field(300.0, gt=0, description="Watcher relist interval.")
    list_page_size: int = Field(
        500,
        ge=1,
        le=10_000,
        description="Nodes per page of the watcher's relist (limit and continue, as kubectl's 500): the "
        "watcher holds one page's JSON at a time, so its memory does not grow with the fleet's answer.",
    )
    queue_max_items: int = Field(
        10_000,
        ge=1,
        description="Watch events the list+watch thread may queue ahead of the publisher before it "
        "stops reading the stream (memory back-pressure; the API server buffers, and a watch that "
        "falls too far behind is expired and relisted).",
    )
    watch_timeout_s: int = Field(300, ge=1, description="timeoutSeconds of one watch request.")
    evict_backoff_s: float = Field(5.0, gt=0, description="Wait before retrying a 429 eviction.")
    request_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Timeout of one API request, seconds (watches use watch_timeout_s plus this). "
        "Bounds how long a worker can hang on an unresponsive API server.",
    )
    condition_skew_s: float = Field(
        5.0,
        ge=0,
        description="A condition's lastTransitionTime (another machine's clock, 1 s resolution) only "
        "shortens the min_condition_s hold when it is older than our first sighting by more than "
        "this many seconds; clock skew can therefore never make a flap look held.",
    )
    leader_ttl_s: float = Field(
        15.0,
        gt=1,
        description="TTL of the Kubernetes watcher's leader lock, seconds; a standby takes over this "
        "long after the leader dies. Renewed every third of it.",
    )

    @model_validator(mode="after")
    def _tls_for_tokens(self) -> KubeSettings:
        if self.host and self.token is not None and not self.host.lower().startswith("https://"):
            raise ValueError(f"host {self.host!r} must be https:// to carry a bearer token")
        return self
