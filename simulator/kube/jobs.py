"""batch/v1 Jobs for the fake kube-apiserver: the validation's check Jobs and the pods they run.

A Job makes one pod bound to its ``nodeName``, which runs and ends with an exit code and a log, or is
killed at ``activeDeadlineSeconds``; an Indexed Job makes one pod per index, each placed by the
scheduler's filters (:mod:`remediation.simulator.kube.schedule`). Pod Security and taint tolerations
are checked first. What the check does is ``outcome(k8s_node, argv)``, the fault injector's.

Why: docs/kubernetes.md#inside-the-local-kube-apiserver
"""

from __future__ import annotations

import copy
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from remediation.simulator.kube.podsecurity import forbidden
from remediation.simulator.kube.schedule import pick, tolerated
from remediation.simulator.kube.store import ApiError, Obj, Store, now_rfc3339, status

Outcome = tuple[int | None, str, float]
#: The label and annotation the Job controller puts on each pod of an Indexed Job.
INDEX = "batch.kubernetes.io/job-completion-index"
PASS: Outcome = (0, "Test Summary: all tests passed\n", 0.2)


@dataclass(frozen=True)
class PodRun:
    """A Job's pod the kubelet started: which Job, its index in an Indexed Job (None in a plain one), and
    the Node it ran on. Kept after the Job and its pods are deleted, as an audit of what ran where."""

    namespace: str
    job: str
    index: int | None
    node: str


class JobRunner:
    def __init__(self, store: Store, level: Callable[[str], str]) -> None:
        self.store = store
        self.level = level  # the namespace's Pod Security enforce level
        self.outcome: Callable[[str, list[str]], Outcome] = lambda node, argv: PASS
        self.logs: dict[tuple[str, str], str] = {}
        self.runs: list[PodRun] = []  # every pod started, in order
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
        indexes = _indexes(job["spec"])
        job["status"] = {"active": len(indexes) if indexes else 1, "startTime": now_rfc3339()}
        created = self.store.create("jobs", (namespace, name), job)
        deadline = job["spec"].get("activeDeadlineSeconds")
        if deadline is not None:
            self._after(float(deadline), lambda: self._deadline(namespace, name))
        for index in indexes or [None]:
            self._start_pod(namespace, created, index)
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

    def _start_pod(self, namespace: str, job: Obj, index: int | None) -> None:
        """The Job controller's pod (of ``index`` in an Indexed Job), then the scheduler and kubelet."""
        name = job["metadata"]["name"]
        spec = copy.deepcopy(job["spec"]["template"]["spec"])
        pod_name = f"{name}-{'' if index is None else f'{index}-'}{secrets.token_hex(3)[:5]}"
        labels = {**job["spec"]["template"].get("metadata", {}).get("labels", {}), "job-name": name,
                  "batch.kubernetes.io/job-name": name, "controller-uid": job["metadata"]["uid"]}
        annotations = {}
        if index is not None:  # what the Job controller adds to each pod of an Indexed Job
            labels[INDEX] = annotations[INDEX] = str(index)
            spec.setdefault("hostname", f"{name}-{index}")
            for container in spec["containers"]:
                container.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "valueFrom": {
                    "fieldRef": {"fieldPath": f"metadata.labels['{INDEX}']"}}})
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": namespace, "labels": labels, "annotations": annotations,
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                              "uid": job["metadata"]["uid"], "controller": True}]},
            "spec": spec, "status": {"phase": "Pending"},
        }
        refused = forbidden(pod_name, self.level(namespace), spec)
        if refused is not None:
            self._failed_create(namespace, job, f"Error creating: {refused}")
            return
        if "nodeName" not in spec and not self._schedule(namespace, pod):
            return  # stays Pending, Unschedulable: the Job runs into its deadline
        self.store.create("pods", (namespace, pod_name), pod)
        node = spec["nodeName"]
        k8s = self.store.tables["nodes"].get(node)
        if k8s is None or not tolerated(spec, k8s):
            return  # stays Pending: the Job runs into its deadline
        self.runs.append(PodRun(namespace, name, index, node))
        argv = list(spec["containers"][0].get("command", [])) + list(spec["containers"][0].get("args", []))
        code, log, seconds = self.outcome(node, argv)
        self._set_pod(namespace, pod_name, "Running", code=None)
        if code is not None:
            self._after(seconds, lambda: self._end(namespace, name, pod_name, code=code, log=log))

    def _schedule(self, namespace: str, pod: Obj) -> bool:
        """Place the pod as the scheduler would; one that fits no Node is stored Pending, Unschedulable."""
        node, why = pick(pod["spec"], self.store.tables["nodes"], self.store.tables["pods"].values(), namespace=namespace)
        scheduled = {"type": "PodScheduled", "status": "True" if node else "False",
                     "lastTransitionTime": now_rfc3339()}
        if node is None:
            scheduled.update(reason="Unschedulable", message=why)
            pod["status"]["conditions"] = [scheduled]
            self.store.create("pods", (namespace, pod["metadata"]["name"]), pod)
            return False
        pod["spec"]["nodeName"] = node
        pod["status"]["conditions"] = [scheduled]
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
        """A pod ended. A failure fails the Job (backoffLimit 0, as the check Jobs set: the pod is not
        replaced) and ends its other pods; the last index to succeed completes it."""
        current = self.store.tables["jobs"].get((namespace, job))
        if current is None or current["status"].get("conditions"):
            return  # deleted, or its deadline came first
        self.logs[(namespace, pod)] = log
        self._set_pod(namespace, pod, "Succeeded" if code == 0 else "Failed", code=code)
        if code != 0:
            self._finish_job(namespace, job, "Failed", reason="BackoffLimitExceeded",
                             message="Job has reached the specified backoff limit")
            self._end_active(namespace, job)
            return
        if _indexes(current["spec"]) and len(self._count(namespace, job, pod)) < int(current["spec"]["completions"]):
            return
        self._finish_job(namespace, job, "Complete", reason="", message="")

    def _count(self, namespace: str, job: str, pod: str) -> list[int]:
        """An Indexed Job's succeeded indexes, recorded on its status as the controller does."""
        index = int(self.store.tables["pods"][(namespace, pod)]["metadata"]["labels"][INDEX])
        done: list[int] = []

        def change(obj: Obj) -> None:
            st = obj["status"]
            got = sorted({*_parse_indexes(st.get("completedIndexes", "")), index})
            st["succeeded"], st["active"] = len(got), max(0, st.get("active", 0) - 1)
            st["completedIndexes"] = _format_indexes(got)
            done.extend(got)

        self.store.mutate("jobs", (namespace, job), change)
        return done

    def _end_active(self, namespace: str, job: str) -> None:
        """The Job controller deletes the pods still active once the Job has failed."""
        for key, pod in list(self.store.tables["pods"].items()):
            if key[0] == namespace and pod["metadata"]["labels"].get("job-name") == job \
                    and pod["status"].get("phase") in ("Pending", "Running"):
                self.store.delete("pods", key)

    def _deadline(self, namespace: str, job: str) -> None:
        current = self.store.tables["jobs"].get((namespace, job))
        if current is None or current["status"].get("conditions"):
            return
        for key, pod in list(self.store.tables["pods"].items()):
            if key[0] == namespace and pod["metadata"]["labels"].get("job-name") == job \
                    and pod["status"].get("phase") == "Running":
                self._set_pod(namespace, key[1], "Failed", code=137, reason="DeadlineExceeded")
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
            if cond == "Complete":
                st["succeeded"] = max(1, st.get("succeeded", 0))
            else:
                st["failed"] = 1
            st["conditions"] = [{"type": cond, "status": "True", "reason": reason, "message": message,
                                 "lastTransitionTime": now_rfc3339()}]
            if cond == "Complete":
                st["completionTime"] = now_rfc3339()

        try:
            self.store.mutate("jobs", (namespace, job), change)
        except ApiError:
            pass


def _indexes(spec: Obj) -> list[int]:
    """The indexes an Indexed Job runs at once (``parallelism`` of ``completions``); [] for a plain Job."""
    if spec.get("completionMode") != "Indexed":
        return []
    completions = int(spec.get("completions") or 1)
    return list(range(min(completions, int(spec.get("parallelism") or completions))))


def _parse_indexes(text: str) -> list[int]:
    """``status.completedIndexes`` ("0-2,4") as a list."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _format_indexes(indexes: list[int]) -> str:
    """Sorted indexes as the controller writes them: runs as intervals ("0-2,4")."""
    runs: list[list[int]] = []
    for i in indexes:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in runs)
