"""Which Kubernetes Node a Slurm node runs on (``kube.mapping``): ``pod``, ``node`` or ``static``.

- ``pod``: the Slurm node is a slurmd pod (``kube.pod_namespace``, ``kube.pod_label_selector``); its
  Node is the pod's ``spec.nodeName``.
- ``node``: the Slurm node name is the Node name.
- ``static``: ``kube.static_map_file``, a YAML map read by :class:`StaticMap`, which the Kubernetes
  watcher shares (and inverts), so both sides always agree.

An unknown or unmappable node is :class:`~remediation.ports.errors.UnknownNode`: a fault of that node,
never of the system.

Why: docs/kubernetes.md#the-kubernetes-watcher
"""

from __future__ import annotations

import os
from collections.abc import Callable

import yaml
from kubernetes import client

from remediation.adapters.kube.client import api_errors
from remediation.domain.events import NODE_NAME
from remediation.ports.errors import (
    ConfigError,
    NotFound,
    UnknownNode,
)
from remediation.settings import KubeSettings


class NodeMapping:
    """Resolves Slurm node names to Node names with the API client and the reader it is given."""

    def __init__(self, api: client.CoreV1Api, settings: KubeSettings, read_node: Callable[[str], object]) -> None:
        self.api = api
        self.s = settings
        self._read = read_node
        self._static = StaticMap(settings.static_map_file)

    def node_for(self, slurm_node: str) -> str:
        if not NODE_NAME.fullmatch(slurm_node):
            raise UnknownNode(f"{slurm_node!r} is not a valid node name")
        if self.s.mapping == "pod":
            return self._node_of_pod(slurm_node)
        name = self._static_map().get(slurm_node) if self.s.mapping == "static" else slurm_node
        if name is None:
            raise UnknownNode(f"{slurm_node} is not in the mapping file {self.s.static_map_file}")
        try:
            self._read(name)
        except NotFound as exc:
            raise UnknownNode(f"Slurm node {slurm_node}: no Kubernetes Node {name} ({exc.message})") from exc
        return name

    def _node_of_pod(self, slurm_node: str) -> str:
        ns, selector = self.s.pod_namespace, self.s.pod_label_selector
        with api_errors(f"find the pod of Slurm node {slurm_node}"):
            pods = self.api.list_namespaced_pod(
                ns,
                field_selector=f"metadata.name={slurm_node}",
                label_selector=selector,
                _request_timeout=self.s.request_timeout_s,
            ).items
        if not pods:
            raise UnknownNode(f"no pod {ns}/{slurm_node} matching {selector!r}")
        node_name = pods[0].spec.node_name if pods[0].spec else None
        if not node_name:
            raise UnknownNode(f"pod {ns}/{slurm_node} is not scheduled on any Node")
        return str(node_name)

    def _static_map(self) -> dict[str, str]:
        return self._static.load()


class StaticMap:
    """``kube.static_map_file``: YAML ``{slurm_node: k8s_node}``, shared by this adapter and the
    Kubernetes watcher (which inverts it). Re-read when its mtime changes, so edits apply without a
    restart; an unset, unreadable or malformed file is a ConfigError (the system's fault: it pauses
    automation rather than count against a node) that names the setting."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._cache: tuple[float, dict[str, str]] | None = None

    def load(self) -> dict[str, str]:
        path = self.path
        if not path:
            raise ConfigError("kube.mapping is 'static' but kube.static_map_file is not set", component="kubernetes")
        try:
            mtime = os.stat(path).st_mtime
            if self._cache is None or self._cache[0] != mtime:
                with open(path, encoding="utf-8") as fh:
                    data = yaml.safe_load(fh) or {}
                if not isinstance(data, dict):
                    raise ConfigError(f"{path}: expected a mapping of Slurm node to Kubernetes Node",
                                      component="kubernetes")
                self._cache = (mtime, {str(k): str(v) for k, v in data.items()})
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read kube.static_map_file {path}: {exc}", component="kubernetes") from exc
        return self._cache[1]
