"""The adapter's Node decoding (remediation.adapters.kube.wire): the fields it reads, taints whole."""

from __future__ import annotations

import json

from remediation.adapters.kube.wire import Taint, as_json, decode_node


def test_a_registered_node_decodes_to_what_the_adapter_reads() -> None:
    node = {
        "metadata": {"name": "gke-a3-0", "resourceVersion": "42", "annotations": {"team": "ml"},
                     "managedFields": [{"manager": "kubelet"}] * 20, "labels": {"zone": "a"}},
        "spec": {"providerID": "gce://p/z/gke-a3-0",
                 "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule",
                             "timeAdded": "2026-11-26T06:00:00Z"}]},
        "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}],
                   "nodeInfo": {"bootID": "b-1", "kubeletVersion": "v1.32.0"},
                   "images": [{"names": ["nvcr.io/nvidia/pytorch:24.10"], "sizeBytes": 10**10}] * 50},
    }
    got = decode_node(json.dumps(node).encode())
    assert (got.metadata.name, got.metadata.resourceVersion, got.annotations) == ("gke-a3-0", "42", {"team": "ml"})
    assert not got.cordoned and got.spec.providerID == "gce://p/z/gke-a3-0"
    assert [(c.type, c.status) for c in got.status.conditions or []] == [("Ready", "False")]
    assert got.status.nodeInfo is not None and got.status.nodeInfo.bootID == "b-1"
    # The taint patch writes the list back: every field a taint had is kept, none is invented.
    assert as_json([*got.taints, Taint(key="ours", effect="NoSchedule", value="remediation")]) == [
        node["spec"]["taints"][0], {"key": "ours", "effect": "NoSchedule", "value": "remediation"}]


def test_a_bare_node_has_safe_defaults() -> None:
    got = decode_node(b'{"metadata": {"name": "n1"}}')
    assert not got.cordoned and got.taints == [] and got.annotations == {} and got.status.nodeInfo is None
