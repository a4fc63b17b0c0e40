"""The CLI's tables: a CLUSTER column only when the rows shown span more than one cluster."""

from __future__ import annotations

from remediation.cli.render import clustered

HEADERS = ["name", "status"]


def test_rows_of_one_cluster_keep_their_columns() -> None:
    rows = [["gpu-node-0", "healthy"], ["gpu-node-1", "quarantined"]]
    assert clustered(HEADERS, rows, ["default", "default"]) == (HEADERS, rows)
    assert clustered(HEADERS, rows, ["west", "west"]) == (HEADERS, rows)  # one cluster, whichever it is


def test_rows_of_several_clusters_lead_with_their_cluster() -> None:
    rows = [["gpu-node-0", "healthy"], ["gpu-node-0", "remediating"]]
    headers, out = clustered(HEADERS, rows, ["east", "west"])
    assert headers == ["cluster", "name", "status"]
    assert out == [["east", "gpu-node-0", "healthy"], ["west", "gpu-node-0", "remediating"]]


def test_no_rows_no_column() -> None:
    assert clustered(HEADERS, [], []) == (HEADERS, [])
