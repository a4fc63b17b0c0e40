"""What the fake kube-apiserver serves, and the discovery documents that tell clients so.

:data:`RESOURCES` is the one table the router and the documents are built from. Both formats are answered,
chosen by ``Accept``: the legacy documents and the aggregated ``apidiscovery.k8s.io/v2``.

Why: docs/kubernetes.md#inside-the-local-kube-apiserver
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

SERVER_VERSION: Obj = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.4",
    "gitCommit": "59526cd4867447956156ae3a602fcbac10a2c335",
    "gitTreeState": "clean",
    "buildDate": "2025-04-22T16:02:27Z",
    "goVersion": "go1.23.6",
    "compiler": "gc",
    "platform": "linux/amd64",
}

AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


@dataclass(frozen=True)
class Resource:
    name: str  # plural, as in the URL
    kind: str
    group: str  # "" for core
    version: str
    namespaced: bool
    verbs: tuple[str, ...]
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[
        tuple[str, str, str, str, tuple[str, ...]], ...
    ] = ()  # name, group, version, kind, verbs

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()


RESOURCES: tuple[Resource, ...] = (
    Resource(
        "nodes", "Node", "", "v1", False, ("get", "list", "patch", "watch"), ("no",),
        subresources=(("status", "", "v1", "Node", ("get", "patch")),),
    ),
    Resource(
        "pods", "Pod", "", "v1", True, ("get", "list", "watch", "patch"), ("po",), ("all",),
        subresources=(("eviction", "policy", "v1", "Eviction", ("create",)), ("log", "", "v1", "Pod", ("get",))),
    ),
    Resource("events", "Event", "", "v1", True, ("get", "list", "watch"), ("ev",)),
    Resource("daemonsets", "DaemonSet", "apps", "v1", True, ("get", "list", "watch"), ("ds",), ("all",)),
    Resource("poddisruptionbudgets", "PodDisruptionBudget", "policy", "v1", True, ("get", "list", "watch"), ("pdb",)),
    Resource("leases", "Lease", "coordination.k8s.io", "v1", True, ("get", "list", "watch")),
    Resource("jobs", "Job", "batch", "v1", True, ("create", "delete", "get", "list", "watch"), (), ("all",)),
)  # fmt: skip

BY_NAME = {r.name: r for r in RESOURCES}
GROUPS: dict[str, list[str]] = {}
for _r in RESOURCES:
    if _r.group and _r.version not in GROUPS.setdefault(_r.group, []):
        GROUPS[_r.group].append(_r.version)


def resource_for(group: str, version: str, name: str) -> Resource | None:
    r = BY_NAME.get(name)
    return r if r is not None and (r.group, r.version) == (group, version) else None


# ------------------------------------------------------------------------------------- legacy


def api_versions(server_address: str) -> Obj:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group(name: str) -> Obj:
    versions = [{"groupVersion": f"{name}/{v}", "version": v} for v in GROUPS[name]]
    return {"name": name, "versions": versions, "preferredVersion": versions[0]}


def api_group_list() -> Obj:
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g) for g in GROUPS]}


def api_group(name: str) -> Obj | None:
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name)} if name in GROUPS else None


def _names(r: Resource) -> Obj:
    """shortNames and categories, each only when the resource has some (both formats carry them)."""
    out: Obj = {}
    if r.short_names:
        out["shortNames"] = list(r.short_names)
    if r.categories:
        out["categories"] = list(r.categories)
    return out


def resource_list(group: str, version: str) -> Obj | None:
    """The APIResourceList of one group version, or None when we do not serve it."""
    served = [r for r in RESOURCES if (r.group, r.version) == (group, version)]
    if not served:
        return None
    items: list[Obj] = []
    for r in served:
        entry: Obj = {
            "name": r.name,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": list(r.verbs),
            **_names(r),
        }
        items.append(entry)
        for sub, sgroup, sversion, skind, sverbs in r.subresources:
            item: Obj = {
                "name": f"{r.name}/{sub}",
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": skind,
                "verbs": list(sverbs),
            }
            if (sgroup, sversion) != (group, version):
                item.update(group=sgroup, version=sversion)
            items.append(item)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": served[0].api_version,
        "resources": items,
    }


# ----------------------------------------------------------------------------------- aggregated


def _discovery_resource(r: Resource) -> Obj:
    entry: Obj = {
        "resource": r.name,
        "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
        "scope": "Namespaced" if r.namespaced else "Cluster",
        "singularResource": r.singular,
        "verbs": list(r.verbs),
        **_names(r),
    }
    subs = [
        {
            "subresource": sub,
            "responseKind": {"group": sgroup, "version": sversion, "kind": skind},
            "verbs": list(sverbs),
        }
        for sub, sgroup, sversion, skind, sverbs in r.subresources
    ]
    if subs:
        entry["subresources"] = subs
    return entry


def aggregated(core: bool) -> Obj:
    """``/api`` (core) or ``/apis`` (every named group) as an ``APIGroupDiscoveryList``."""
    groups = [""] if core else list(GROUPS)
    items = []
    for g in groups:
        versions = GROUPS.get(g, ["v1"])
        items.append(
            {
                "metadata": {"name": g, "creationTimestamp": None},
                "versions": [
                    {
                        "version": v,
                        "resources": [
                            _discovery_resource(r) for r in RESOURCES if (r.group, r.version) == (g, v)
                        ],
                        "freshness": "Current",
                    }
                    for v in versions
                ],
            }
        )
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    }


def wants_aggregated(accept: str) -> bool:
    """True when the client lists the v2 aggregated format among what it accepts."""
    return any(
        "g=apidiscovery.k8s.io" in part and "v=v2" in part and "as=APIGroupDiscoveryList" in part
        for part in accept.replace(" ", "").split(",")
        if "v=v2beta1" not in part
    )
