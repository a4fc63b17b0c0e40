"""From a Kubernetes Node to the Slurm nodes it hosts, and from a held condition to a NodeEvent.

:class:`SlurmNames` holds the Node -> Slurm nodes map of ``kube.mapping`` (``node``, ``static``, or
``pod``: the slurmd pods, LISTed on demand at most every :data:`POD_LIST_INTERVAL_S`).
:meth:`SlurmNames.on` answers only with a map listed after the moment given, else None and the caller
keeps the change queued. Pure apart from that LIST.

Why: docs/kubernetes.md#the-kubernetes-watcher
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from remediation.adapters.kube.mapping import StaticMap
from remediation.domain.events import NodeEvent, Source
from remediation.domain.flap import Change, Condition
from remediation.ports.errors import RemediationError
from remediation.settings import KubeSettings

log = logging.getLogger("remediation.watchers.kube.watcher")

POD_LIST_INTERVAL_S = 2.0  # at most one slurmd pod LIST per this many seconds, and only when needed


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def conditions_of(node: dict[str, Any]) -> list[Condition]:
    return [
        Condition(
            c["type"],
            c.get("status", ""),
            ": ".join(p for p in (c.get("reason"), c.get("message")) if p),  # "KubeletNotReady: PLEG ..."
            parse_time(c.get("lastTransitionTime")),
        )
        for c in (node.get("status") or {}).get("conditions") or []
        if isinstance(c, dict) and "type" in c
    ]


# ------------------------------------------------------------------- Node -> Slurm node names


def pod_placement(pods: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """slurmd pods (raw JSON) -> ``{slurm_node: k8s_node}``; a pod not yet scheduled runs nowhere."""
    return {
        str(p["metadata"]["name"]): str(p["spec"]["nodeName"])
        for p in pods
        if (p.get("metadata") or {}).get("name") and (p.get("spec") or {}).get("nodeName")
    }


def invert(placement: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """``{slurm_node: k8s_node}`` -> ``{k8s_node: (slurm_node, ...)}``, names sorted (stable output)."""
    by_node: dict[str, list[str]] = {}
    for slurm_node, k8s_node in placement.items():
        by_node.setdefault(k8s_node, []).append(slurm_node)
    return {k8s_node: tuple(sorted(names)) for k8s_node, names in by_node.items()}


class SlurmNames:
    """The Slurm nodes running on a Kubernetes Node, per ``kube.mapping`` (see the module docstring)."""

    def __init__(
        self,
        settings: KubeSettings,
        api: Callable[[], client.CoreV1Api],
        *,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.s, self.api, self.timeout_s, self.clock = settings, api, timeout_s, clock
        self.static = StaticMap(settings.static_map_file)
        self._by_node: dict[str, tuple[str, ...]] = {}
        self._listed_at = float("-inf")  # when the LIST behind _by_node started (monotonic)
        self._tried_at = float("-inf")
        self._failing = False

    def on(self, node: str, since: float) -> tuple[str, ...] | None:
        """The Slurm nodes on ``node`` per a map read at or after ``since`` (monotonic); ``()`` for
        none; None while no such map can be had yet (rate limit, API error, bad mapping file)."""
        if self.s.mapping == "node":
            return (node,)
        if self.s.mapping == "static":
            try:
                by_node = invert(self.static.load())  # a stat per call; re-read only when edited
            except RemediationError as exc:  # a bad mapping file: the configuration's fault
                self._warn(exc.message)
                return None
            self._failing = False
            return by_node.get(node, ())
        if self._listed_at < since and not self._list_pods():
            return None
        return self._by_node.get(node, ())

    def _list_pods(self) -> bool:
        now = self.clock()
        if now - self._tried_at < POD_LIST_INTERVAL_S:
            return False
        self._tried_at = now
        try:
            resp: Any = self.api().list_namespaced_pod(  # raw urllib3 response: _preload_content=False
                self.s.pod_namespace,
                label_selector=self.s.pod_label_selector,
                _preload_content=False,
                _request_timeout=self.timeout_s,
            )
            self._by_node = invert(pod_placement(json.loads(resp.data).get("items") or []))
        except ApiException as exc:
            self._warn(f"HTTP {exc.status} {exc.reason}")
            return False
        except (urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as exc:
            self._warn(str(exc))
            return False
        self._listed_at, self._failing = now, False
        return True

    def _warn(self, why: str) -> None:
        if not self._failing:  # once per failure streak, not every half second
            log.warning(
                "cannot map Nodes to Slurm nodes (kube.mapping=%s): %s; will retry", self.s.mapping, why
            )
        self._failing = True


def to_event(change: Change, slurm_node: str) -> NodeEvent:
    """One NodeEvent for ``slurm_node``, which runs on the Node ``change`` is about. It is observed
    when the filter decided it (not when a slow translation or a Redis outage let it out), and says
    when its condition began, so the ingest can order it and attribute it to our own reboot."""
    detail = change.message or change.state
    return NodeEvent(
        source=Source.KUBERNETES,
        node=slurm_node,
        kind=change.kind,
        state=change.state,
        reason=f"Node {change.node}: {detail}"[:2048],
        observed_at=change.at or datetime.now(UTC),
        since=change.since,
        dedupe_key=f"k8s:{slurm_node}@{change.key.removeprefix('k8s:')}",
    )
