"""The validation through Kubernetes: a ``batch/v1`` Job bound to the Node, read through BatchV1Api.

The Job is bound with ``spec.nodeName``, tolerates our cordon and quarantine taint, requests the node's
GPUs, runs once with a deadline, in ``validation.kube_namespace`` (privileged, no service-account token).
A check across several Nodes is an Indexed Job, one pod per Node (required affinity and anti-affinity).
Its name carries the step's nonce, so a second ``start`` finds the first Job. ``finish`` deletes it.

Why: docs/policy.md#validate-before-return-a-gpu-validation-validationbackend-default-none
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from remediation.adapters.kube.client import api_errors
from remediation.ports.errors import PermanentError
from remediation.settings import KubeSettings, ValidationSettings
from remediation.validation.port import Backend, ValidationCheck, ValidationResult, output_limit

UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
MANAGED_BY = ("app.kubernetes.io/managed-by", "node-remediation")
GATE_LABEL = "node-remediation/gate"
NONCE_LABEL = "node-remediation/nonce"
NODE_ANNOTATION = "node-remediation/slurm-node"
NODES_ANNOTATION = "node-remediation/slurm-nodes"  # a check across several nodes: all of them, comma-separated
HOSTNAME = "kubernetes.io/hostname"
#: The label and annotation the Job controller puts on each pod of an Indexed Job.
INDEX = "batch.kubernetes.io/job-completion-index"
#: The check container's privileges (the module docstring says why): root in a privileged container.
CHECK_SECURITY: dict[str, Any] = {"privileged": True, "runAsUser": 0, "runAsNonRoot": False}


def placement(check: ValidationCheck, k8s_nodes: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Where the pods go, and the Job spec that makes them. One Node: the pod bound by ``nodeName``.
    Several: an Indexed Job of one pod per Node, each pod required onto one of exactly those Nodes and
    away from its siblings' (anti-affinity on the check's own label per hostname), all running at once."""
    if not check.nodes:
        return {"nodeName": k8s_nodes[0]}, {}
    one_per_node = {"labelSelector": {"matchLabels": {GATE_LABEL: check.name}}, "topologyKey": HOSTNAME}
    nodes = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": HOSTNAME, "operator": "In", "values": sorted(k8s_nodes)}]}]}
    pod = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": nodes},
                        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [one_per_node]}}}
    return pod, {"completionMode": "Indexed", "completions": len(k8s_nodes), "parallelism": len(k8s_nodes)}


def job_manifest(check: ValidationCheck, k8s_nodes: list[str], cfg: ValidationSettings, *,
                 taint_key: str) -> dict[str, Any]:
    """The Job manifest (a plain dict: what is sent is what a reviewer reads)."""
    labels = {MANAGED_BY[0]: MANAGED_BY[1], GATE_LABEL: check.name}
    if check.nonce:
        labels[NONCE_LABEL] = check.nonce
    resources = {"limits": {"nvidia.com/gpu": str(cfg.kube_gpus)}} if cfg.kube_gpus else {}
    annotations = {NODE_ANNOTATION: check.node, "node-remediation/cause-class": check.cause_class}
    if check.nodes:
        annotations[NODES_ANNOTATION] = ",".join(check.nodes)
    where, indexed = placement(check, k8s_nodes)
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": check.name, "namespace": cfg.kube_namespace, "labels": labels,
                     "annotations": annotations},
        "spec": {
            **indexed,
            "backoffLimit": 0,
            "activeDeadlineSeconds": max(1, int(check.timeout_s)),
            "ttlSecondsAfterFinished": 86400,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    **where,
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "tolerations": [
                        {"key": UNSCHEDULABLE, "operator": "Exists", "effect": "NoSchedule"},
                        {"key": taint_key, "operator": "Exists", "effect": "NoSchedule"},
                    ],
                    "containers": [{"name": "check", "image": cfg.kube_image,
                                    "command": list(check.command), "resources": resources,
                                    "securityContext": CHECK_SECURITY}],
                },
            },
        },
    }


class ForeignJob(PermanentError):
    """A Job of the check's name that is not the check's: its verdict is never the node's."""


class KubeValidator:
    backend: str = Backend.KUBERNETES

    def __init__(self, core: client.CoreV1Api, kube: KubeSettings, validation: ValidationSettings,
                 *, node_for: Callable[[str], str]) -> None:
        self.core = core
        self.batch = client.BatchV1Api(core.api_client)
        self.cfg = validation
        self.namespace = validation.kube_namespace
        self.taint_key = f"{kube.annotation_domain}/quarantined"
        self.node_for = node_for

    def job(self, check: ValidationCheck, k8s_nodes: list[str]) -> dict[str, Any]:
        return job_manifest(check, k8s_nodes, self.cfg, taint_key=self.taint_key)

    def start(self, check: ValidationCheck) -> dict[str, Any]:
        k8s_nodes = [self.node_for(node) for node in check.targets]
        with api_errors(f"create Job {self.namespace}/{check.name}"):
            try:
                self.batch.create_namespaced_job(self.namespace, self.job(check, k8s_nodes))
            except ApiException as exc:
                if exc.status != 409:
                    raise
                self._adopt(check, k8s_nodes)  # AlreadyExists: the first delivery's Job, if it is ours
        spans = {"k8s_nodes": k8s_nodes} if check.nodes else {}
        limit = {"output_bytes": check.output_bytes} if check.output_bytes else {}
        return {"job": check.name, "namespace": self.namespace, "k8s_node": k8s_nodes[0], **spans, **limit}

    def _adopt(self, check: ValidationCheck, k8s_nodes: list[str]) -> None:
        """A Job of the check's name exists: the first delivery's, taken for the check only if it is
        ours (our labels, the nonce the step recorded, placed on the nodes). Anyone with Jobs in the
        namespace can make one of a name; its verdict must never return the node, and the name is
        taken, so the check cannot run: the node stays out (:class:`ForeignJob`)."""
        job = self.batch.read_namespaced_job(check.name, self.namespace)
        labels = job.metadata.labels or {}
        annotations = job.metadata.annotations or {}
        pod = job.spec.template.spec if job.spec and job.spec.template else None
        mismatched = [what for what, ok in (
            ("labels", labels.get(MANAGED_BY[0]) == MANAGED_BY[1] and labels.get(GATE_LABEL) == check.name),
            ("nonce", labels.get(NONCE_LABEL, "") == check.nonce),
            ("node", pod is not None and _placed(pod, job.spec, k8s_nodes, several=bool(check.nodes))
             and annotations.get(NODE_ANNOTATION) == check.node
             and annotations.get(NODES_ANNOTATION, "") == ",".join(check.nodes)),
        ) if not ok]
        if mismatched:
            raise ForeignJob(f"Job {self.namespace}/{check.name} exists but is not this check's (its "
                             f"{', '.join(mismatched)} differ): not taken for it; the node stays out")

    def poll(self, ref: dict[str, Any]) -> ValidationResult:
        name, ns = ref["job"], ref["namespace"]
        with api_errors(f"read Job {ns}/{name}"):
            job = self.batch.read_namespaced_job(name, ns)
            pods = self.core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items
        conditions = {c.type: c for c in (job.status.conditions or []) if c.status == "True"}
        if ref.get("k8s_nodes"):
            return self._poll_indexed(job, pods, conditions=conditions, ns=ns)
        pod = pods[-1] if pods else None
        code, output = None, ""
        if pod is not None:
            for cs in (pod.status.container_statuses or []):
                if cs.state is not None and cs.state.terminated is not None:
                    code = cs.state.terminated.exit_code
            if code is not None or "Failed" in conditions:
                output = self._log(pod.metadata.name, ns, output_limit(ref, self.cfg.output_bytes * 4))
        if "Complete" in conditions:
            return ValidationResult(done=True, exit_code=code if code is not None else 0, output=output, state="Complete")
        if "Failed" in conditions:
            reason = conditions["Failed"].reason or "Failed"
            timed_out = reason == "DeadlineExceeded"
            return ValidationResult(done=True, exit_code=None if timed_out else code, output=output, state=reason,
                              timed_out=timed_out)
        phase = pod.status.phase if pod is not None else "no pod yet"
        return ValidationResult(done=False, state=str(phase).upper(),
                          waiting=f"pod {phase}" if phase != "Running" else "")

    def _poll_indexed(self, job: Any, pods: list[Any], *, conditions: dict[str, Any], ns: str) -> ValidationResult:
        """A check across Nodes: every index succeeded is a pass (exit 0, every pod's log); a pod that
        failed ends it with that pod's exit code and log; the deadline ends it timed out."""
        failed = conditions.get("Failed")
        if failed is not None and failed.reason == "DeadlineExceeded":
            return ValidationResult(done=True, state="DeadlineExceeded", timed_out=True, output=self._logs(pods, ns))
        for pod in sorted(pods, key=_index):
            code = _exit_code(pod)
            if pod.status.phase == "Failed" and code is not None and code != 0:
                return ValidationResult(done=True, exit_code=code, output=self._logs([pod], ns),
                                        state=f"Failed (index {_index(pod)} on {pod.spec.node_name})")
        total = job.spec.completions or 1
        if "Complete" in conditions or (job.status.succeeded or 0) >= total:
            return ValidationResult(done=True, exit_code=0, output=self._logs(pods, ns), state="Complete")
        if failed is not None:
            return ValidationResult(done=True, state=failed.reason or "Failed", output=self._logs(pods, ns))
        waiting = [f"index {_index(p)} {_why_pending(p)}" for p in sorted(pods, key=_index)
                   if p.status.phase == "Pending"]
        if len(pods) < total:
            waiting.append(f"{total - len(pods)} of {total} pods not created yet")
        running = sum(1 for p in pods if p.status.phase == "Running")
        return ValidationResult(done=False, state=f"{running}/{total} RUNNING", waiting="; ".join(waiting))

    def _logs(self, pods: list[Any], ns: str) -> str:
        """The pods' logs, each headed by its index and Node, in index order."""
        return "".join(f"== index {_index(p)} on {p.spec.node_name} ==\n{self._log(p.metadata.name, ns)}"
                       for p in sorted(pods, key=_index))

    def finish(self, ref: dict[str, Any]) -> str:
        name, ns = ref["job"], ref["namespace"]
        with api_errors(f"delete Job {ns}/{name}"):
            try:
                self.batch.delete_namespaced_job(name, ns, propagation_policy="Background")
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return f"Job {ns}/{name} deleted"

    def _log(self, pod: str, ns: str, limit: int | None = None) -> str:
        with api_errors(f"read log of {ns}/{pod}"):
            try:
                text = self.core.read_namespaced_pod_log(pod, ns, container="check",
                                                         limit_bytes=limit or self.cfg.output_bytes * 4)
            except ApiException as exc:
                if exc.status == 404:
                    return ""
                raise
        return str(text or "")


def _placed(pod: Any, spec: Any, k8s_nodes: list[str], *, several: bool) -> bool:
    """Whether a Job's pods go where the check's do: bound to the one Node, or one per Node of exactly
    ``k8s_nodes`` (the Indexed Job's completions and required node affinity)."""
    if not several:
        return bool(pod.node_name == k8s_nodes[0])
    required = pod.affinity.node_affinity.required_during_scheduling_ignored_during_execution \
        if pod.affinity and pod.affinity.node_affinity else None
    terms = required.node_selector_terms if required else []
    values = [sorted(e.values or []) for t in terms for e in (t.match_expressions or [])
              if e.key == HOSTNAME and e.operator == "In"]
    return (values == [sorted(k8s_nodes)] and spec.completion_mode == "Indexed"
            and spec.completions == len(k8s_nodes) and pod.node_name is None)


def _index(pod: Any) -> int:
    value = (pod.metadata.annotations or {}).get(INDEX) or (pod.metadata.labels or {}).get(INDEX) or ""
    return int(value) if str(value).isdigit() else -1


def _exit_code(pod: Any) -> int | None:
    for cs in (pod.status.container_statuses or []):
        if cs.state is not None and cs.state.terminated is not None:
            return int(cs.state.terminated.exit_code)
    return None


def _why_pending(pod: Any) -> str:
    for cond in (pod.status.conditions or []):
        if cond.type == "PodScheduled" and cond.status == "False":
            return f"unschedulable: {cond.message or cond.reason}"
    return "pending"
