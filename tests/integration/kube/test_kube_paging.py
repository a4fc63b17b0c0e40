"""Paged lists on the local kube-apiserver, as the real one serves them (``limit`` and ``continue``):
one snapshot across the pages, ``remainingItemCount`` without selectors, 410 Expired for a continue
whose snapshot is gone, 400 for a token that is not one."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from remediation.simulator.kube.api import KubeAPIServer


def test_pages_are_one_snapshot_and_say_how_many_remain(
    kube_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    for i in range(5):
        kube_api.add_node(f"n{i}")
    first = core.list_node(limit=2)
    assert [n.metadata.name for n in first.items] == ["n0", "n1"]
    assert first.metadata.remaining_item_count == 3 and first.metadata._continue
    kube_api.add_node("n2a")  # written after the first page: not in this list
    kube_api.set_condition("n3", "Ready", "False")
    second = core.list_node(limit=2, _continue=first.metadata._continue)
    third = core.list_node(limit=2, _continue=second.metadata._continue)
    assert [n.metadata.name for n in second.items] == ["n2", "n3"]
    assert [n.metadata.name for n in third.items] == ["n4"]
    assert third.metadata._continue is None and third.metadata.remaining_item_count is None
    ready = {c.type: c.status for c in second.items[1].status.conditions}["Ready"]
    assert ready == "True"  # as of the first page's resourceVersion
    assert {p.metadata.resource_version for p in (first, second, third)} == {first.metadata.resource_version}


def test_a_selected_list_pages_without_a_remaining_count(
    kube_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    for i in range(4):
        kube_api.add_node(f"n{i}", labels={"pool": "a" if i % 2 else "b"})
    page = core.list_node(limit=1, label_selector="pool=a")
    assert [n.metadata.name for n in page.items] == ["n1"]
    assert page.metadata.remaining_item_count is None and page.metadata._continue
    rest = core.list_node(limit=1, label_selector="pool=a", _continue=page.metadata._continue)
    assert [n.metadata.name for n in rest.items] == ["n3"] and rest.metadata._continue is None


def test_a_continue_after_compaction_is_410_expired(kube_api: KubeAPIServer, core: client.CoreV1Api) -> None:
    for i in range(3):
        kube_api.add_node(f"n{i}")
    token = core.list_node(limit=1).metadata._continue
    kube_api.compact()
    with pytest.raises(ApiException) as info:
        core.list_node(limit=1, _continue=token)
    assert info.value.status == 410 and json.loads(info.value.body)["reason"] == "Expired"


@pytest.mark.parametrize("token", ["not-a-token", "eyJ2IjogMX0"], ids=["garbage", "wrong-shape"])
def test_a_token_that_is_not_ours_is_400(kube_api: KubeAPIServer, core: client.CoreV1Api, token: str) -> None:
    kube_api.add_node("n0")
    with pytest.raises(ApiException) as info:
        core.list_node(limit=1, _continue=token)
    assert info.value.status == 400 and "continue key is not valid" in json.loads(info.value.body)["message"]
