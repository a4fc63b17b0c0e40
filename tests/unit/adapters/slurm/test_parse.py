"""Parsing Slurm's node reports and diffing snapshots.

The fixtures in ``data/`` were captured from a real Slurm 22.05.8 (scripts/slurm-up.sh) with one node
DOWN (a reason full of shell characters), one FAIL, one DRAINed for maintenance and one IDLE.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remediation.adapters.slurm.diff import bad_state, condition_key, diff
from remediation.adapters.slurm.parse import (
    NodeRecord,
    NodesParser,
    SlurmFormatError,
    SlurmReportedError,
    parse_nodes_json,
    parse_scontrol_line,
    parse_scontrol_nodes,
)

DATA = Path(__file__).parent / "data"
SINFO = (DATA / "sinfo-22.05.json").read_text()
SCONTROL = (DATA / "scontrol-show-node-22.05.txt").read_text()
BAD = frozenset({"DOWN", "DRAIN", "FAIL", "NOT_RESPONDING"})
STAMP = 1795310111  # reason_changed_at of the three bad nodes in the fixtures
BOOT = 1795309342  # boot_time of every node in the fixtures (one host)


@pytest.fixture
def utc() -> Iterator[None]:
    """scontrol prints local time; the fixture was captured in UTC."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TZ", "UTC")
    time.tzset()
    yield
    mp.undo()
    time.tzset()


def doc() -> dict[str, Any]:
    return copy.deepcopy(json.loads(SINFO))


def pretty(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2)


# ------------------------------------------------------------------------------- sinfo --json


def test_real_22_05_document() -> None:
    nodes = parse_nodes_json(SINFO)
    assert list(nodes) == ["gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3"]
    assert nodes["gpu-node-0"] == NodeRecord(
        "gpu-node-0", "DOWN", frozenset(), 'a b "c" $(x) `y` ;z', "root", STAMP, nodes["gpu-node-0"].slurmd_start_time, BOOT,
        ("gpu",),
    )
    assert nodes["gpu-node-1"].states == {"IDLE", "FAIL"}
    assert nodes["gpu-node-1"].reason == "xid 79"
    assert nodes["gpu-node-2"].flags == {"DRAIN"}
    assert nodes["gpu-node-2"].reason == "maintenance: PSU swap"
    assert nodes["gpu-node-3"] == NodeRecord(
        "gpu-node-3", "IDLE", frozenset(), "", None, 0, nodes["gpu-node-3"].slurmd_start_time, BOOT, ("gpu",)
    )
    assert nodes["gpu-node-3"].slurmd_start_time > 1_700_000_000


def test_to_slurm_node() -> None:
    node = parse_nodes_json(SINFO)["gpu-node-1"].to_slurm_node()
    assert (node.name, node.state, node.flags, node.reason_user) == ("gpu-node-1", "IDLE", {"FAIL"}, "root")
    assert node.reason_time is not None and int(node.reason_time.timestamp()) == STAMP
    assert parse_nodes_json(SINFO)["gpu-node-3"].to_slurm_node().reason_time is None


def test_bytes_input() -> None:
    assert parse_nodes_json(SINFO.encode()) == parse_nodes_json(SINFO)


def test_v0_0_40_shape_state_list_and_number_objects() -> None:
    d = doc()
    node = d["nodes"][2]
    node["state"] = ["IDLE", "DRAIN"]
    del node["state_flags"]
    node["reason_changed_at"] = {"set": True, "infinite": False, "number": 1234}
    node["slurmd_start_time"] = {"set": False, "infinite": False, "number": 0}
    node["boot_time"] = {"set": True, "infinite": False, "number": 1795648336}
    status = parse_nodes_json(pretty(d))["gpu-node-2"]
    assert (status.state, status.flags, status.reason_changed_at, status.slurmd_start_time, status.boot_time) == (
        "IDLE",
        {"DRAIN"},
        1234,
        0,
        1795648336,
    )


def test_slurm_reported_errors_are_raised_with_slurms_message() -> None:
    # What sinfo --json prints (exit status 0!) when slurmctld cannot be reached.
    unreachable = {"meta": {}, "errors": [{"error": "Unspecified error", "errno": -1}], "nodes": []}
    with pytest.raises(SlurmReportedError, match="Unspecified error") as info:
        parse_nodes_json(json.dumps(unreachable))
    assert info.value.errors == ["Unspecified error (errno -1)"]


def _set(path: str, value: Any) -> dict[str, Any]:
    d = doc()
    target: Any = d
    keys = path.split("/")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last = keys[-1]
    if value is _DELETE:
        del target[last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return d


_DELETE = object()

MALFORMED: list[tuple[str, str | dict[str, Any], str]] = [
    ("not-json", "{nodes: [", "not valid JSON"),
    ("not-utf8", "", "not UTF-8"),
    ("top-level-list", "[]", "expected an object"),
    ("no-nodes", _set("nodes", _DELETE), "nodes: expected a list"),
    ("nodes-object", _set("nodes", {}), "nodes: expected a list"),
    ("errors-string", _set("errors", "boom"), "errors: expected a list"),
    ("node-not-object", _set("nodes/1", 7), r"nodes\[1\]: expected an object"),
    ("name-missing", _set("nodes/1/name", _DELETE), r"nodes\[1\].name"),
    ("name-shell", _set("nodes/1/name", "n1; rm -rf /"), r"nodes\[1\].name: not a valid node name"),
    ("name-hostlist", _set("nodes/1/name", "n[1-2]"), "not a valid node name"),
    ("name-trailing-newline", _set("nodes/1/name", "gpu-node-1\n"), "not a valid node name"),
    ("state-int", _set("nodes/1/state", 3), r"gpu-node-1\).state"),
    ("state-empty", _set("nodes/1/state", ""), r"gpu-node-1\).state"),
    ("flags-string", _set("nodes/1/state_flags", "DRAIN"), "state_flags: expected a list of strings"),
    ("flags-ints", _set("nodes/1/state_flags", [1]), "state_flags: expected a list of strings"),
    ("reason-int", _set("nodes/1/reason", 5), "reason: expected a string"),
    ("user-list", _set("nodes/1/reason_set_by_user", ["root"]), "reason_set_by_user"),
    ("changed-string", _set("nodes/1/reason_changed_at", "yesterday"), "reason_changed_at: expected a number"),
    ("changed-negative", _set("nodes/1/reason_changed_at", -5), "reason_changed_at: out of range"),
    ("changed-bool", _set("nodes/1/reason_changed_at", True), "expected a number"),
    ("start-huge", _set("nodes/1/slurmd_start_time", 10**30), "out of range"),
]


@pytest.mark.parametrize(("text", "message"), [(t, m) for _, t, m in MALFORMED], ids=[i for i, _, _ in MALFORMED])
def test_malformed_documents_raise_a_typed_error_naming_the_field(text: str | dict[str, Any], message: str) -> None:
    raw: str | bytes = pretty(text) if isinstance(text, dict) else text
    if message == "not UTF-8":
        raw = SINFO.encode().replace(b"xid 79", b"xid \xff79")
    with pytest.raises(SlurmFormatError, match=message):
        parse_nodes_json(raw)
    # The memoised parser gives the same verdict, whether or not it has seen a good document before.
    warm = NodesParser()
    warm.parse(SINFO)
    with pytest.raises(SlurmFormatError, match=message):
        warm.parse(raw)


# ---------------------------------------------------------------------------- memoised parser


def test_memoised_parser_decodes_only_changed_nodes() -> None:
    parser = NodesParser()
    first = parser.parse(SINFO)
    assert first == parse_nodes_json(SINFO)
    again = parser.parse(SINFO)
    assert parser.last_decoded == 0
    assert again == first and again["gpu-node-1"] is first["gpu-node-1"]
    parser.parse(pretty(doc()))  # Python's layout of the same document (escapes differ from Slurm's)
    d = doc()
    d["nodes"][3]["state_flags"] = ["DRAIN"]
    d["nodes"][3]["reason"] = "remediation: xid 79"
    changed = parser.parse(pretty(d))
    assert parser.last_decoded == 1
    assert changed == parse_nodes_json(pretty(d))
    assert changed["gpu-node-3"].flags == {"DRAIN"}


def test_memoised_parser_falls_back_to_a_full_parse_for_other_layouts() -> None:
    parser = NodesParser()
    compact = json.dumps(doc())
    assert parser.parse(compact) == parse_nodes_json(SINFO)
    assert parser.last_decoded == 4


_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**60), max_value=2**60), st.text(max_size=8)
)
_json = st.recursive(
    _json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
_FIELDS = ["name", "state", "state_flags", "reason", "reason_set_by_user", "reason_changed_at", "slurmd_start_time"]


@st.composite
def mutated_documents(draw: st.DrawFn) -> dict[str, Any]:
    """The real document with random fields of random nodes replaced by random JSON."""
    d = doc()
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        node = d["nodes"][draw(st.integers(min_value=0, max_value=3))]
        node[draw(st.sampled_from(_FIELDS))] = draw(_json)
    if draw(st.booleans()):
        d[draw(st.sampled_from(["errors", "nodes", "meta"]))] = draw(_json)
    return d


@given(mutated_documents())
@settings(max_examples=400, deadline=None)
def test_fuzz_parser_raises_only_typed_errors_and_memo_agrees(document: dict[str, Any]) -> None:
    text = pretty(document)
    try:
        expected: dict[str, NodeRecord] | type[SlurmFormatError] = parse_nodes_json(text)
    except SlurmFormatError:
        expected = SlurmFormatError
    parser = NodesParser()
    parser.parse(pretty(doc()))  # warm memo in the same layout, so the incremental path runs
    try:
        got: dict[str, NodeRecord] | type[SlurmFormatError] = parser.parse(text)
    except SlurmFormatError:
        got = SlurmFormatError
    assert got == expected


@given(st.text(max_size=200) | st.binary(max_size=200))
@settings(max_examples=400, deadline=None)
def test_fuzz_arbitrary_input(raw: str | bytes) -> None:
    for parse in (parse_nodes_json, NodesParser().parse):
        try:
            parse(raw)
        except SlurmFormatError:
            pass


# ---------------------------------------------------------------------- scontrol show node -o


def test_real_scontrol_lines(utc: None) -> None:
    nodes = parse_scontrol_nodes(SCONTROL)
    json_nodes = parse_nodes_json(SINFO)
    assert nodes == json_nodes  # same controller, same moment: both readers agree field for field


SCONTROL_LINES = [
    (
        "fail-not-responding",
        "NodeName=n1 Arch=x86_64 State=IDLE+FAIL+NOT_RESPONDING ThreadsPerCore=1 Reason=xid 79 [root@2026-11-22T01:09:04]",
        ("IDLE", {"FAIL", "NOT_RESPONDING"}, "xid 79", "root", 1795309744),
    ),
    (
        "reason-with-brackets-and-equals",
        "NodeName=n1 State=DOWN Reason=bad [gpu 3] state=x [slurm@2026-11-22T01:09:04] Comment=c",
        ("DOWN", set(), "bad [gpu 3] state=x", "slurm", 1795309744),
    ),
    ("no-reason", "NodeName=n1 NextState=IDLE State=MIXED+DRAIN Weight=1", ("MIXED", {"DRAIN"}, "", None, 0)),
    ("bare-reason", "NodeName=n1 State=DOWN* Reason=Not responding", ("DOWN", set(), "Not responding", None, 0)),
]


@pytest.mark.parametrize(("line", "expected"), [(li, e) for _, li, e in SCONTROL_LINES], ids=[i for i, _, _ in SCONTROL_LINES])
def test_scontrol_lines(utc: None, line: str, expected: tuple[Any, ...]) -> None:
    status = parse_scontrol_line(line)
    assert (status.state, status.flags, status.reason, status.reason_user, status.reason_changed_at) == expected


BAD_LINES = [
    ("empty", "", "does not start with NodeName="),
    ("no-name", "State=IDLE", "does not start with NodeName="),
    ("bad-name", "NodeName=a$(b) State=IDLE", "not a valid node name"),
    ("no-state", "NodeName=n1 Arch=x86_64", "no State="),
    ("bad-time", "NodeName=n1 State=IDLE SlurmdStartTime=soon", "SlurmdStartTime: not a time"),
    ("bad-boot-time", "NodeName=n1 State=IDLE BootTime=soon", "BootTime: not a time"),
]


@pytest.mark.parametrize(("line", "message"), [(li, m) for _, li, m in BAD_LINES], ids=[i for i, _, _ in BAD_LINES])
def test_malformed_scontrol_lines(line: str, message: str) -> None:
    with pytest.raises(SlurmFormatError, match=message):
        parse_scontrol_line(line)


@given(st.text(max_size=120))
@settings(max_examples=500, deadline=None)
def test_fuzz_scontrol_lines(line: str) -> None:
    try:
        parse_scontrol_line("NodeName=n1 " + line)
    except SlurmFormatError:
        pass


# ------------------------------------------------------------------------------------------ diff


def node(name: str = "n1", state: str = "IDLE", *flags: str, reason: str = "", at: int = 0, start: int = 100) -> NodeRecord:
    return NodeRecord(name, state, frozenset(flags), reason, "root" if reason else None, at, start)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (node(), None),
        (node("n1", "ALLOCATED"), None),
        (node("n1", "IDLE", "DRAIN"), "DRAIN"),
        (node("n1", "IDLE", "FAIL", "DRAIN"), "FAIL"),
        (node("n1", "DOWN", "DRAIN", "NOT_RESPONDING"), "DOWN"),
        (node("n1", "IDLE", "NOT_RESPONDING"), "NOT_RESPONDING"),
        (node("n1", "IDLE", "MAINTENANCE"), None),
    ],
    ids=["idle", "allocated", "drain", "fail-over-drain", "down-over-drain", "not-responding", "unwatched-flag"],
)
def test_bad_state_priority(status: NodeRecord, expected: str | None) -> None:
    assert bad_state(status, BAD) == expected


def test_condition_key_names_the_condition_instance() -> None:
    fail = node("n1", "IDLE", "FAIL", reason="xid 79", at=500)
    assert condition_key(fail, "FAIL") == condition_key(fail._replace(slurmd_start_time=999), "FAIL")
    assert condition_key(fail, "FAIL").startswith("slurm:n1:FAIL:500:")
    assert condition_key(fail, "FAIL") != condition_key(fail._replace(reason="xid 48"), "FAIL")
    assert condition_key(fail, "FAIL") != condition_key(fail._replace(reason_changed_at=501), "FAIL")
    # Without a reason time, the slurmd incarnation tells two outages apart.
    nr = node("n1", "IDLE", "NOT_RESPONDING", start=100)
    assert condition_key(nr, "NOT_RESPONDING") != condition_key(nr._replace(slurmd_start_time=200), "NOT_RESPONDING")


DIFFS: list[tuple[str, dict[str, NodeRecord], dict[str, NodeRecord], dict[str, list[Any]]]] = [
    ("unchanged", {"n1": node()}, {"n1": node()}, {}),
    ("healthy-slurmd-restart", {"n1": node(start=1)}, {"n1": node(start=2)}, {}),
    ("idle-to-fail", {"n1": node()}, {"n1": node("n1", "IDLE", "FAIL", reason="xid", at=5)}, {"unhealthy": [("n1", "FAIL")]}),
    ("fail-to-idle", {"n1": node("n1", "IDLE", "FAIL", reason="xid", at=5)}, {"n1": node()}, {"healthy": [("n1", "FAIL")]}),
    (
        "drain-reason-changed",
        {"n1": node("n1", "IDLE", "DRAIN", reason="maint", at=5)},
        {"n1": node("n1", "IDLE", "DRAIN", reason="remediation: x", at=6)},
        {"unhealthy": [("n1", "DRAIN")]},
    ),
    (
        "drain-turns-down",
        {"n1": node("n1", "IDLE", "DRAIN", reason="r", at=5)},
        {"n1": node("n1", "DOWN", "DRAIN", reason="r", at=5)},
        {"unhealthy": [("n1", "DOWN")]},
    ),
    (
        "same-bad-condition-other-start",
        {"n1": node("n1", "IDLE", "DRAIN", reason="r", at=5, start=1)},
        {"n1": node("n1", "IDLE", "DRAIN", reason="r", at=5, start=2)},
        {},
    ),
    ("first-seen-bad", {}, {"n2": node("n2", "DOWN", reason="Not responding", at=5)}, {"unhealthy": [("n2", "DOWN")], "added": ["n2"]}),
    ("first-seen-idle", {}, {"n2": node("n2")}, {"added": ["n2"]}),
    ("removed", {"n1": node(), "n2": node("n2")}, {"n1": node()}, {"removed": ["n2"]}),
    ("allocated-to-mixed", {"n1": node("n1", "ALLOCATED")}, {"n1": node("n1", "MIXED")}, {}),
]


@pytest.mark.parametrize(("before", "after", "expected"), [d[1:] for d in DIFFS], ids=[d[0] for d in DIFFS])
def test_diff(before: dict[str, NodeRecord], after: dict[str, NodeRecord], expected: dict[str, list[Any]]) -> None:
    result = diff(before, after, BAD)
    assert [(s.name, st_) for s, st_ in result.unhealthy] == expected.get("unhealthy", [])
    assert [(now.name, st_) for now, _, st_ in result.healthy] == expected.get("healthy", [])
    assert [s.name for s in result.added] == expected.get("added", [])
    assert result.removed == expected.get("removed", [])
    assert bool(result) == bool(expected)


# ------------------------------------------------------------------------ what a profile selects on


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NodeName=n1 AvailableFeatures=h100,ib ActiveFeatures=h100 State=IDLE Partitions=train,all Reason=x",
         (("train", "all"), ("h100", "ib"))),
        ("NodeName=n1 AvailableFeatures=(null) State=IDLE Partitions=gpu", (("gpu",), ())),
        ("NodeName=n1 State=IDLE", ((), ())),
    ],
    ids=["both", "null-features", "neither"],
)
def test_scontrol_partitions_and_features(utc: None, text: str, expected: tuple[Any, ...]) -> None:
    node = parse_scontrol_line(text)
    assert (node.partitions, node.features) == expected


@pytest.mark.parametrize(
    ("fields", "expected"),
    [({"partitions": ["train"], "features": "h100,ib"}, (("train",), ("h100", "ib"))),  # 22.05: a string
     ({"partitions": ["a", "b"], "features": ["B200"]}, (("a", "b"), ("B200",))),  # 23.02+: a list, case kept
     ({}, ((), ()))],
    ids=["v0.0.38", "v0.0.40", "absent"],
)
def test_json_partitions_and_features(fields: dict[str, Any], expected: tuple[Any, ...]) -> None:
    doc = {"nodes": [{"name": "n1", "state": "IDLE", **fields}], "errors": []}
    node = parse_nodes_json(json.dumps(doc))["n1"]
    assert (node.partitions, node.features) == expected
    assert node.to_slurm_node().partitions == expected[0]


def test_json_features_of_the_wrong_type_are_named() -> None:
    doc = {"nodes": [{"name": "n1", "state": "IDLE", "features": 7}], "errors": []}
    with pytest.raises(SlurmFormatError, match=r"nodes\[0\] \(n1\)\.features"):
        parse_nodes_json(json.dumps(doc))
