"""The validation through Kubernetes: a ``batch/v1`` Job bound to the Node, read through BatchV1Api.

The Job is bound with ``spec.nodeName``, tolerates our cordon and quarantine taint, requests the node's
GPUs, runs once with a deadline, in ``validation.kube_namespace`` (privileged, no service-account token).
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
from remediation.validation.port import Backend, ValidationCheck, ValidationResult

UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
MANAGED_BY = ("app.kubernetes.io/managed-by", "node-remediation")
GATE_LABEL = "node-remediation/gate"
NONCE_LABEL = "node-remediation/nonce"
NODE_ANNOTATION = "node-remediation/slurm-node"
#: The check container's privileges (the module docstring says why): root in a privileged container.
CHECK_SECURITY: dict[str, Any] = {"privileged": True, "runAsUser": 0, "runAsNonRoot": False}


def job_manifest(check: ValidationCheck, k8s_node: str, cfg: ValidationSettings, *,
                 taint_key: str) -> dict[str, Any]:
    """The Job manifest (a plain dict: what is sent is what a reviewer reads)."""
    labels = {MANAGED_BY[0]: MANAGED_BY[1], GATE_LABEL: check.name}
    if check.nonce:
        labels[NONCE_LABEL] = check.nonce
    resources = {"limits": {"nvidia.com/gpu": str(cfg.kube_gpus)}} if cfg.kube_gpus else {}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": check.name, "namespace": cfg.kube_namespace, "labels": labels,
                     "annotations": {NODE_ANNOTATION: check.node,
                                     "node-remediation/cause-class": check.cause_class}},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": max(1, int(check.timeout_s)),
            "ttlSecondsAfterFinished": 86400,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeName": k8s_node,
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

    def job(self, check: ValidationCheck, k8s_node: str) -> dict[str, Any]:
        return job_manifest(check, k8s_node, self.cfg, taint_key=self.taint_key)

    def start(self, check: ValidationCheck) -> dict[str, Any]:
        k8s_node = self.node_for(check.node)
        with api_errors(f"create Job {self.namespace}/{check.name}"):
            try:
                self.batch.create_namespaced_job(self.namespace, self.job(check, k8s_node))
            except ApiException as exc:
                if exc.status != 409:
                    raise
                self._adopt(check, k8s_node)  # AlreadyExists: the first delivery's Job, if it is ours
        return {"job": check.name, "namespace": self.namespace, "k8s_node": k8s_node}

    def _adopt(self, check: ValidationCheck, k8s_node: str) -> None:
        """A Job of the check's name exists: the first delivery's, taken for the check only if it is
        ours (our labels, the nonce the step recorded, bound to the node). Anyone with Jobs in the
        namespace can make one of a name; its verdict must never return the node, and the name is
        taken, so the check cannot run: the node stays out (:class:`ForeignJob`)."""
        job = self.batch.read_namespaced_job(check.name, self.namespace)
        labels = job.metadata.labels or {}
        pod = job.spec.template.spec if job.spec and job.spec.template else None
        mismatched = [what for what, ok in (
            ("labels", labels.get(MANAGED_BY[0]) == MANAGED_BY[1] and labels.get(GATE_LABEL) == check.name),
            ("nonce", labels.get(NONCE_LABEL, "") == check.nonce),
            ("node", pod is not None and pod.node_name == k8s_node
             and (job.metadata.annotations or {}).get(NODE_ANNOTATION) == check.node),
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
        pod = pods[-1] if pods else None
        code, output = None, ""
        if pod is not None:
            for cs in (pod.status.container_statuses or []):
                if cs.state is not None and cs.state.terminated is not None:
                    code = cs.state.terminated.exit_code
            if code is not None or "Failed" in conditions:
                output = self._log(pod.metadata.name, ns)
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

    def finish(self, ref: dict[str, Any]) -> str:
        name, ns = ref["job"], ref["namespace"]
        with api_errors(f"delete Job {ns}/{name}"):
            try:
                self.batch.delete_namespaced_job(name, ns, propagation_policy="Background")
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return f"Job {ns}/{name} deleted"

    def _log(self, pod: str, ns: str) -> str:
        with api_errors(f"read log of {ns}/{pod}"):
            try:
                text = self.core.read_namespaced_pod_log(pod, ns, container="check",
                                                         limit_bytes=self.cfg.output_bytes * 4)
            except ApiException as exc:
                if exc.status == 404:
                    return ""
                raise
        return str(text or "")
