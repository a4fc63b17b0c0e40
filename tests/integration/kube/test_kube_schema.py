"""Schema conformance: everything the local kube-apiserver answers validates against the official
Kubernetes schema for its kind (kubernetes-validate's strict JSON schemas of the version the fake
claims, 1.32: unknown fields are errors too).

Checked over HTTP, as a client reads them: every discovery document, /version, every list and object
of every resource (Nodes and Pods as a GPU cluster carries them, DaemonSets, PDBs with their status,
Leases, Events), Node status, watch events (ADDED/MODIFIED/DELETED, BOOKMARK, the 410 ERROR), the
Status of every error the fake can answer and of an eviction. Then a property test: random sequences of
mutations through the API (merge, strategic and JSON patches on labels, annotations, taints, cordon and
conditions, ill-typed ones included; evictions; the kubelet's changes) never leave an object behind that
does not validate: the fake refuses what a real server refuses (422) and stores only valid Nodes.

Tables (``kubectl get``'s format) and the aggregated discovery list have no published JSON schema;
their rows' metadata and their resources are checked instead.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from functools import cache
from importlib.resources import files
from typing import Any

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from referencing import Registry, Resource

from remediation.adapters.kube.validator import job_manifest
from remediation.settings import ValidationSettings
from remediation.simulator.kube.api import KubeAPIServer
from remediation.simulator.kube.discovery import AGGREGATED, GROUPS, RESOURCES
from remediation.validation.port import ValidationCheck

SCHEMAS = files("kubernetes_validate") / "kubernetes-json-schema" / "v1.32.0-local-strict"
META_KINDS = {"Status", "APIResourceList", "APIGroupList", "APIVersions", "APIGroup", "WatchEvent"}
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"

Obj = dict[str, Any]


@cache
def _validator(filename: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / filename).read_text())
    definitions = json.loads((SCHEMAS / "_definitions.json").read_text())
    registry: Registry[Any] = Resource.from_contents(schema) @ Registry()
    registry = Resource.from_contents(definitions) @ registry
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def schema_file(kind: str, api_version: str) -> str:
    if kind in META_KINDS:
        return f"{kind.lower()}-meta-v1.json"
    group, _, version = api_version.rpartition("/")
    group = group.split(".")[0]
    return f"{kind.lower()}-{group + '-' if group else ''}{version}.json"


def conforms(obj: Obj, kind: str | None = None, api_version: str | None = None) -> None:
    """Validate ``obj`` (and each item of a list) against the official schema; raises with the path."""
    kind, api_version = kind or obj["kind"], api_version or obj.get("apiVersion", "v1")
    try:
        _validator(schema_file(kind, api_version)).validate(obj)
    except jsonschema.ValidationError as exc:
        raise AssertionError(
            f"{kind} {obj.get('metadata', {}).get('name')}: {exc.message} at {list(exc.absolute_path)}"
        ) from None
    if kind.endswith("List") and kind not in META_KINDS:
        for item in obj["items"]:
            conforms(item, kind.removesuffix("List"), api_version)


def trusting(api: KubeAPIServer) -> ssl.SSLContext:
    """A TLS context that trusts the local apiserver's per-run CA (httpx takes a context, not a path)."""
    return ssl.create_default_context(cafile=api.ca_file)


@pytest.fixture
def http(kube_api: KubeAPIServer) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=kube_api.url,
        verify=trusting(kube_api),
        headers={"Authorization": f"Bearer {kube_api.token}"},
    ) as c:
        yield c


def _populate(api: KubeAPIServer) -> None:
    for i in range(2):
        node = f"gke-a3-{i}"
        api.add_node(node, provider_id=f"gce://proj/us-central1-a/{node}",
                     taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])  # fmt: skip
        api.add_pod("slurm", f"slurmd-{i}", node_name=node, labels={"app": "slurmd"}, owner_kind="DaemonSet",
                    owner_name="slurmd")  # fmt: skip
        api.add_pod("training", f"llama-{i}", node_name=node, labels={"app": "llama"}, owner_kind="StatefulSet",
                    owner_name="llama", empty_dir=True)  # fmt: skip
    api.add_node("aks-ndv4-1", provider_id="azure:///subscriptions/s/resourceGroups/g/providers/"
                 "Microsoft.Compute/virtualMachines/aks-ndv4-1", ready="Unknown", unschedulable=True)  # fmt: skip
    api.add_pod("kube-system", "kube-proxy-gke-a3-0", node_name="gke-a3-0", mirror=True)
    api.add_pod("training", "done", node_name="gke-a3-1", phase="Succeeded")
    api.add_pod("training", "pending", labels={"app": "llama"}, phase="Pending")
    api.add_pdb("training", "llama", "app=llama,tier notin (debug)", min_available=2)
    api.add_pdb("slurm", "slurmd", "app", max_unavailable=1)
    api.add_event("gke-a3-0", "Rebooted", "Node gke-a3-0 has been rebooted", type_="Warning")
    # A validation check Job as KubeValidator creates it; the simulator runs its pod on gke-a3-0.
    check = ValidationCheck("gpu-node-0", "nr-gate-r1-a1", ("dcgmi", "diag", "-r", "2"), 600)
    cfg = ValidationSettings()
    api.jobs.create(cfg.kube_namespace, job_manifest(check, ["gke-a3-0"], cfg,
                                                     taint_key="example.com/quarantined"))


def test_every_read_answer_validates(kube_api: KubeAPIServer, http: httpx.Client) -> None:
    _populate(kube_api)
    conforms(http.get("/version").json(), "Info", "pkg/version")
    anonymous = httpx.get(f"{kube_api.url}/version", verify=trusting(kube_api))  # public, as on a cluster
    wrong = httpx.get(
        f"{kube_api.url}/version", verify=trusting(kube_api), headers={"Authorization": "Bearer x"}
    )
    assert (anonymous.status_code, wrong.status_code) == (200, 401)
    assert httpx.get(f"{kube_api.url}/readyz", verify=trusting(kube_api)).text == "ok"
    conforms(http.get("/api").json())
    conforms(http.get("/apis").json())
    for group, versions in GROUPS.items():
        conforms(http.get(f"/apis/{group}").json())
        for version in versions:
            conforms(http.get(f"/apis/{group}/{version}").json())
    conforms(http.get("/api/v1").json())
    aggregated = [http.get(p, headers={"Accept": AGGREGATED}) for p in ("/api", "/apis")]
    assert all(r.headers["content-type"] == AGGREGATED for r in aggregated)
    assert {
        (g["metadata"]["name"], v["version"], res["resource"])
        for r in aggregated for g in r.json()["items"] for v in g["versions"] for res in v["resources"]
    } == {(r.group, r.version, r.name) for r in RESOURCES}  # fmt: skip
    seen: set[str] = set()
    for res in RESOURCES:
        prefix = f"/apis/{res.api_version}" if res.group else "/api/v1"
        listed = http.get(f"{prefix}/{res.name}").json()
        conforms(listed)
        assert listed["items"], res.name
        for item in listed["items"]:
            ns = item["metadata"].get("namespace")
            path = (
                f"{prefix}/namespaces/{ns}/{res.name}/{item['metadata']['name']}"
                if ns
                else f"{prefix}/{res.name}/{item['metadata']['name']}"
            )
            conforms(http.get(path).json())
            table = http.get(path, headers={"Accept": TABLE}).json()
            assert table["kind"] == "Table" and len(table["rows"]) == 1
            conforms(table["rows"][0]["object"]["metadata"], "ObjectMeta", "meta/v1")
            seen.add(item["kind"])
    assert seen == {r.kind for r in RESOURCES}
    conforms(http.get("/api/v1/nodes/gke-a3-0/status").json())


def test_every_error_and_eviction_answer_is_a_valid_status(
    kube_api: KubeAPIServer, http: httpx.Client
) -> None:
    _populate(kube_api)
    rv = http.get("/api/v1/nodes/gke-a3-0").json()["metadata"]["resourceVersion"]
    merge = {"Content-Type": "application/merge-patch+json"}
    answers = {
        401: httpx.get(f"{kube_api.url}/api/v1/nodes", verify=trusting(kube_api)),
        404: http.get("/api/v1/nodes/nope"),
        400: http.get("/api/v1/pods", params={"fieldSelector": "spec.bogus=1"}),
        405: http.delete("/api/v1/nodes/gke-a3-0"),
        415: http.patch("/api/v1/nodes/gke-a3-0", content=b"{}", headers={"Content-Type": "text/plain"}),
        409: http.patch("/api/v1/nodes/gke-a3-0", json={"metadata": {"resourceVersion": "1"}}, headers=merge),
        422: http.patch("/api/v1/nodes/gke-a3-0", headers={"Content-Type": "application/json-patch+json"},
                        json=[{"op": "test", "path": "/metadata/resourceVersion", "value": "0"}]),
        429: http.post("/api/v1/namespaces/training/pods/llama-0/eviction",
                       json={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "llama-0"}}),
    }  # fmt: skip
    kube_api.add_pod("training", "llama-spare", node_name="gke-a3-1", labels={"app": "llama"})
    answers[201] = http.post("/api/v1/namespaces/training/pods/llama-0/eviction",
                             json={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "llama-0"}})  # fmt: skip
    kube_api.fail_next(1, 503, retry_after=2)
    answers[503] = http.get("/api/v1/nodes")
    for code, answer in answers.items():
        assert answer.status_code == code, (code, answer.text)
        body = answer.json()
        assert body["kind"] == "Status" and body["code"] == code
        conforms(body)
    assert http.get("/api/v1/nodes/gke-a3-0").json()["metadata"]["resourceVersion"] == rv


def _watch(http: httpx.Client, path: str, params: dict[str, str], until_rv: int | None = None) -> list[Obj]:
    """The events of one watch, read until the stream ends or an event at ``until_rv`` arrived."""
    events: list[Obj] = []
    with http.stream("GET", path, params={"watch": "true", **params}) as stream:
        for line in stream.iter_lines():
            if not line:
                continue
            events.append(json.loads(line))
            rv = events[-1]["object"].get("metadata", {}).get("resourceVersion")
            if until_rv is not None and rv is not None and int(rv) >= until_rv:
                break
    return events


def _conforms_event(event: Obj) -> None:
    conforms(event, "WatchEvent", "meta/v1")
    obj = event["object"]
    conforms(obj)


def test_watch_events_validate_bookmarks_and_410_included(
    kube_api: KubeAPIServer, http: httpx.Client
) -> None:
    _populate(kube_api)
    start = kube_api.resource_version
    kube_api.set_condition("gke-a3-0", "GpuXidError", "True", reason="XID79", message="fallen off the bus")
    kube_api.mutate_node("gke-a3-1", lambda n: n["spec"].__setitem__("unschedulable", True))
    kube_api.remove_node("aks-ndv4-1")
    # 3 s, not 1: a bookmark comes only once the stream is quiet, and on a loaded machine the three
    # changes alone can take most of a second to go out.
    events = _watch(http, "/api/v1/nodes", {"resourceVersion": str(start), "allowWatchBookmarks": "true",
                                              "timeoutSeconds": "3"})  # fmt: skip
    assert [e["type"] for e in events if e["type"] != "BOOKMARK"] == ["MODIFIED", "MODIFIED", "DELETED"]
    assert any(e["type"] == "BOOKMARK" for e in events)  # kube_api bookmarks every 0.2 s when idle
    for event in events:
        _conforms_event(event)
    kube_api.compact()
    (gone,) = _watch(http, "/api/v1/nodes", {"resourceVersion": str(start)})
    assert gone["type"] == "ERROR" and gone["object"]["code"] == 410
    _conforms_event(gone)


# ------------------------------------------------------------------------------------- property

_NAME = st.from_regex(r"[a-z0-9]([a-z0-9._-]{0,20}[a-z0-9])?", fullmatch=True)
_KEY = st.one_of(
    _NAME, st.builds(lambda p, n: f"{p}.io/{n}", st.from_regex(r"[a-z]{1,8}", fullmatch=True), _NAME)
)
_VALUE = st.one_of(st.just(""), _NAME)
_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
_BAD = st.one_of(st.integers(), st.booleans(), st.lists(st.integers(), max_size=2), st.just({"x": 1}))
_TAINT = st.fixed_dictionaries(
    {"key": _KEY, "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])},
    optional={"value": _VALUE},
)
_CONDITION = st.fixed_dictionaries(
    {"type": st.sampled_from(["Ready", "GpuXidError", "KernelDeadlock", "NetworkUnavailable"]),
     "status": st.sampled_from(["True", "False", "Unknown"])},
    optional={"reason": _NAME, "message": _TEXT},
)  # fmt: skip
MERGE, STRATEGIC, JSON = (
    "application/merge-patch+json", "application/strategic-merge-patch+json", "application/json-patch+json",
)  # fmt: skip

# (subresource, content type, body)
_PATCHES = st.one_of(
    st.tuples(st.just(""), st.sampled_from([MERGE, STRATEGIC]),
              st.builds(lambda k, v: {"metadata": {"labels": {k: v}}}, _KEY, st.one_of(_VALUE, st.none()))),
    st.tuples(st.just(""), st.sampled_from([MERGE, STRATEGIC]),
              st.builds(lambda k, v: {"metadata": {"annotations": {k: v}}}, _KEY, st.one_of(_TEXT, st.none()))),
    st.tuples(st.just(""), st.sampled_from([MERGE, STRATEGIC]),
              st.builds(lambda u: {"spec": {"unschedulable": u}}, st.booleans())),
    st.tuples(st.just(""), st.sampled_from([MERGE, STRATEGIC]),
              st.builds(lambda t: {"spec": {"taints": t}}, st.lists(_TAINT, max_size=3))),
    st.tuples(st.just(""), st.just(JSON),
              st.builds(lambda k, v: [{"op": "add", "path": "/metadata/annotations/" + k.replace("/", "~1"), "value": v}],
                        _KEY, _TEXT)),
    st.tuples(st.just("status"), st.sampled_from([STRATEGIC, MERGE]),
              st.builds(lambda c: {"status": {"conditions": c}}, st.lists(_CONDITION, min_size=1, max_size=2,
                                                                           unique_by=lambda c: c["type"]))),
    # What a buggy client sends: wrong JSON types, unknown taint effects, bad label keys.
    st.tuples(st.just(""), st.sampled_from([MERGE, STRATEGIC]), st.one_of(
        st.builds(lambda b: {"spec": {"unschedulable": b}}, _BAD),
        st.builds(lambda k, b: {"metadata": {"labels": {k: b}}}, _KEY, _BAD),
        st.builds(lambda k: {"metadata": {"labels": {k: "v"}}}, st.sampled_from(["-bad", "a/b/c", "UPPER.io/x", "x" * 64])),
        st.builds(lambda e: {"spec": {"taints": [{"key": "k", "effect": e}]}}, st.sampled_from(["", "Sometimes"])),
    )),
    st.tuples(st.just("status"), st.just(STRATEGIC),
              st.builds(lambda b: {"status": {"conditions": [{"type": "Ready", "status": b}]}}, _BAD)),
)  # fmt: skip
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("patch"), st.sampled_from(["gke-a3-0", "gke-a3-1"]), _PATCHES),
        st.tuples(st.just("evict"), st.sampled_from(["llama-0", "llama-1"]), st.none()),
        st.tuples(st.just("kubelet"), st.sampled_from(["gke-a3-0", "gke-a3-1"]), _CONDITION),
        st.tuples(st.just("reboot"), st.sampled_from(["gke-a3-0", "gke-a3-1"]), st.none()),
    ),
    min_size=1,
    max_size=8,
)


@pytest.fixture(scope="module")
def shared_api() -> Iterator[KubeAPIServer]:
    """One server for every example: state accumulates, as on a cluster that has seen many clients."""
    with KubeAPIServer(token="property") as api:
        _populate(api)
        yield api


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
def test_no_sequence_of_mutations_leaves_an_invalid_object(shared_api: KubeAPIServer, ops: list[Any]) -> None:
    api = shared_api
    with httpx.Client(
        base_url=api.url, verify=trusting(api), headers={"Authorization": "Bearer property"}
    ) as http:
        start = api.resource_version
        for op, target, arg in ops:
            if op == "patch":
                sub, content_type, body = arg
                path = f"/api/v1/nodes/{target}" + (f"/{sub}" if sub else "")
                before = http.get(f"/api/v1/nodes/{target}").json()
                answer = http.patch(
                    path, content=json.dumps(body).encode(), headers={"Content-Type": content_type}
                )
                assert answer.status_code in (200, 422), answer.text
                conforms(answer.json())
                if answer.status_code == 422:  # refused: nothing changed
                    assert http.get(f"/api/v1/nodes/{target}").json() == before
            elif op == "evict":
                answer = http.post(f"/api/v1/namespaces/training/pods/{target}/eviction",
                                   json={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": target}})  # fmt: skip
                assert answer.status_code in (201, 404, 429), answer.text
                conforms(answer.json())
            elif op == "kubelet":
                api.set_condition(target, arg["type"], arg["status"], reason=arg.get("reason", ""),
                                  message=arg.get("message", ""))  # fmt: skip
            else:
                api.bump_boot_id(target)
        for res in ("nodes", "pods", "poddisruptionbudgets"):
            prefix = "/apis/policy/v1" if res == "poddisruptionbudgets" else "/api/v1"
            conforms(http.get(f"{prefix}/{res}").json())
        # A last Node write marks the end of this example's history for the watch below.
        mark = api.mutate_node(
            "gke-a3-0", lambda n: n["metadata"]["annotations"].__setitem__("example.io/mark", str(start))
        )
        end = int(mark["metadata"]["resourceVersion"])
        events = _watch(http, "/api/v1/nodes", {"resourceVersion": str(start)}, until_rv=end)
        assert events and events[-1]["object"]["metadata"]["resourceVersion"] == str(end)
        for event in events:
            _conforms_event(event)
