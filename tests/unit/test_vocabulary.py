"""Cluster names and how a figure over several clusters names a node."""

from __future__ import annotations

import pytest

from remediation.vocabulary import checked_cluster, node_label


def test_a_node_is_named_by_its_cluster_only_across_clusters() -> None:
    assert node_label("west", "gpu-node-0", fleet=True) == "west/gpu-node-0"
    assert node_label("west", "gpu-node-0", fleet=False) == "gpu-node-0"


def test_a_cluster_name_is_a_dns_label_so_it_never_holds_the_labels_slash() -> None:
    assert checked_cluster("west-2") == "west-2"
    with pytest.raises(ValueError, match="not a cluster name"):
        checked_cluster("west/2")
