"""batch/v1 Jobs for the fake kube-apiserver: the validation's check Jobs and the pods they run.

A Job makes one pod bound to its ``nodeName``, which runs and ends with an exit code and a log, or is
killed at ``activeDeadlineSeconds``. Pod Security and taint tolerations are checked first. What the check
does is ``outcome(k8s_node, argv)``, the fault injector's.

Why: docs/kubernetes.md#inside-the-local-kube-apiserver
"""

from __future__ import annotations

import copy
import secrets
import threading
from collections.abc import Callable
from typing import Any

from remediation.simulator.kube.podsecurity import forbidden
from remediation.simulator.kube.store import ApiError, Obj, Store, now_rfc3339, status

Outcome = tuple[int | None, str, float]
PASS: Outcome = (0, "Test Summary: all tests passed\n", 0.2)


class JobRunner:
    def __init__(self, store: Store, level: Callable[[str], str]) -> None:
        self.store = store
        self.level = level  # the namespace's Pod Security enforce level
        self.outcome: Callable[[str, list[str]], Outcome] = lambda node, argv: PASS
        self.logs: dict[tuple[str, str], str] = {}
        self._timers: list[threading.Timer] = []

    def create(self, namespace: str, body: Any) -> Obj:
        if not isinstance(body, dict) or body.get("kind") not in (None, "Job"):
            raise ApiError(status(400, "BadRequest", "body must be a batch/v1 Job"))
        job = copy.deepcopy(body)
        meta = job.setdefault("metadata", {})
        name = meta.get("name")
        if not name:
            raise ApiError(status(422, "Invalid", "Job.batch is invalid: metadata.name: Required value"))
        if (namespace, name) in self.store.tables["jobs"]:
            raise ApiError(status(409, "AlreadyExists", f'jobs.batch "{name}" already exists',
                                  details={"name": name, "group": "batch", "kind": "jobs"}))
        meta["namespace"] = namespace
        job.update(apiVersion="batch/v1", kind="Job")
        job["status"] = {"active": 1, "startTime": now_rfc3339()}
        created = self.store.create("jobs", (namespace, name), job)
        self._start_pod(namespace, created)
        return created

    def delete(self, namespace: str, name: str) -> Obj:
        gone = self.store.delete("jobs", (namespace, name))
        for key, pod in list(self.store.tables["pods"].items()):
            if key[0] == namespace and pod["metadata"].get("labels", {}).get("job-name") == name:
                self.store.delete("pods", key)
        return {**status(200, "Success", ""), "details": {"name": name, "group": "batch", "kind": "jobs",
                                                          "uid": gone["metadata"]["uid"]}}

    def log(self, namespace: str, pod: str) -> str:
        self.store.get("pods", (namespace, pod))  # 404 as the real server
        return self.logs.get((namespace, pod), "")

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()

    # ----------------------------------------------------------------------------- internals

    def _start_pod(self, namespace: str, job: Obj) -> None:
        name = job["metadata"]["name"]
        spec = copy.deepcopy(job["spec"]["template"]["spec"])
        node = spec.get("nodeName", "")
        pod_name = f"{name}-{secrets.token_hex(3)[:5]}"
        labels = {**job["spec"]["template"].get("metadata", {}).get("labels", {}), "job-name": name,
                  "batch.kubernetes.io/job-name": name, "controller-uid": job["metadata"]["uid"]}
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": namespace, "labels": labels,
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                              "uid": job["metadata"]["uid"], "controller": True}]},
            "spec": spec, "status": {"phase": "Pending"},
        }
        deadline = job["spec"].get("activeDeadlineSeconds")
        refused = forbidden(pod_name, self.level(namespace), spec)
        if refused is not None:
            self._failed_create(namespace, job, f"Error creating: {refused}")
            if deadline is not None:
                self._after(float(deadline), lambda: self._deadline(namespace, name, None))
            return
        self.store.create("pods", (namespace, pod_name), pod)
        if not self._tolerated(spec, node):
            return  # stays Pending: the Job runs into its deadline
        argv = list(spec["containers"][0].get("command", [])) + list(spec["containers"][0].get("args", []))
        code, log, seconds = self.outcome(node, argv)
        self._set_pod(namespace, pod_name, "Running", code=None)
        if deadline is not None:
            self._after(float(deadline), lambda: self._deadline(namespace, name, pod_name))
        if code is not None:
            self._after(seconds, lambda: self._end(namespace, name, pod_name, code=code, log=log))

    def _tolerated(self, spec: Obj, node: str) -> bool:
        k8s = self.store.tables["nodes"].get(node)
        if k8s is None:
            return False
        tolerations = spec.get("tolerations") or []
        for taint in k8s["spec"].get("taints") or []:
            if taint.get("effect") not in ("NoSchedule", "NoExecute"):
                continue
            if not any(t.get("operator") == "Exists" and t.get("key") in (None, taint["key"])
                       and t.get("effect") in (None, "", taint["effect"]) for t in tolerations):
                return False
        if k8s["spec"].get("unschedulable") and not any(
                t.get("key") == "node.kubernetes.io/unschedulable" for t in tolerations):
            return False
        return True

    def _after(self, seconds: float, action: Callable[[], None]) -> None:
        timer = threading.Timer(seconds, action)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _set_pod(self, namespace: str, pod: str, phase: str, *, code: int | None, reason: str = "") -> bool:
        def change(obj: Obj) -> None:
            obj["status"]["phase"] = phase
            state: Obj = {"running": {"startedAt": now_rfc3339()}}
            if code is not None:
                state = {"terminated": {"exitCode": code, "reason": reason or ("Completed" if code == 0 else "Error"),
                                        "finishedAt": now_rfc3339()}}
            container = obj["spec"]["containers"][0]
            image = container.get("image", "")
            obj["status"]["containerStatuses"] = [{
                "name": container["name"], "state": state, "ready": phase == "Running", "restartCount": 0,
                "image": image, "imageID": f"{image.split(':')[0]}@sha256:{'0' * 64}", "started": phase == "Running",
            }]

        try:
            self.store.mutate("pods", (namespace, pod), change)
            return True
        except ApiError:
            return False  # deleted meanwhile

    def _end(self, namespace: str, job: str, pod: str, *, code: int, log: str) -> None:
        current = self.store.tables["jobs"].get((namespace, job))
        if current is None or current["status"].get("conditions"):
            return  # deleted, or its deadline came first
        self.logs[(namespace, pod)] = log
        self._set_pod(namespace, pod, "Succeeded" if code == 0 else "Failed", code=code)
        ok = code == 0
        self._finish_job(namespace, job, "Complete" if ok else "Failed",
                         reason="" if ok else "BackoffLimitExceeded",
                         message="" if ok else "Job has reached the specified backoff limit")

    def _deadline(self, namespace: str, job: str, pod: str | None) -> None:
        current = self.store.tables["jobs"].get((namespace, job))
        if current is None or current["status"].get("conditions"):
            return
        if pod is not None:
            self._set_pod(namespace, pod, "Failed", code=137, reason="DeadlineExceeded")
        self._finish_job(namespace, job, "Failed", reason="DeadlineExceeded",
                         message="Job was active longer than specified deadline")

    def _failed_create(self, namespace: str, job: Obj, message: str) -> None:
        """The Job controller's Warning event for a pod the API server refused; the Job has no pod."""
        name, now = job["metadata"]["name"], now_rfc3339()
        self.store.mutate("jobs", (namespace, name), lambda obj: obj["status"].pop("active", None))
        event_name = f"{name}.{secrets.token_hex(8)}"
        self.store.create("events", (namespace, event_name), {
            "kind": "Event", "apiVersion": "v1", "metadata": {"name": event_name, "namespace": namespace},
            "involvedObject": {"kind": "Job", "namespace": namespace, "name": name, "apiVersion": "batch/v1",
                               "uid": job["metadata"]["uid"]},
            "reason": "FailedCreate", "message": message, "type": "Warning",
            "source": {"component": "job-controller"}, "reportingComponent": "job-controller",
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        })

    def _finish_job(self, namespace: str, job: str, cond: str, *, reason: str, message: str) -> None:
        def change(obj: Obj) -> None:
            st = obj["status"]
            st.pop("active", None)
            st["succeeded" if cond == "Complete" else "failed"] = 1
            st["conditions"] = [{"type": cond, "status": "True", "reason": reason, "message": message,
                                 "lastTransitionTime": now_rfc3339()}]
            if cond == "Complete":
                st["completionTime"] = now_rfc3339()

        try:
            self.store.mutate("jobs", (namespace, job), change)
        except ApiError:
            pass
