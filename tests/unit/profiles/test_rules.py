"""Profiles: the settings refuse what cannot work, naming it; the first match wins; explain names
the layer of every field."""

from __future__ import annotations

from pathlib import Path

import pytest

from remediation.profiles.rules import Layer, NodeFacts, explain, resolve, winners
from remediation.settings import CONFIG_ENV, SettingsError, load_settings
from remediation.settings.selector import parse_selector

CONFIG = """
policy:
  max_concurrent: 6
workflow:
  drain_timeout_s: 1800
profiles:
  - name: training
    select: {partitions: [train], features: [h100]}
    policy: {max_concurrent: 2, faults: {ladders: {gpu-memory: [move-host, quarantine]}}}
  - name: inference
    select: {labels: "pool in (inference, serving),!experimental"}
    mode: shadow
    workflow: {on_jobs_timeout: requeue}
  - name: rack7
    select: {hostlist: "gpu-[700-799]"}
    mode: drain-only
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("REMEDIATION_"):
            monkeypatch.delenv(key)


def _load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "config.yaml"
    path.write_text(text)
    monkeypatch.setenv(CONFIG_ENV, str(path))
    return load_settings()


@pytest.mark.parametrize(
    ("node", "winner", "also"),
    [
        (NodeFacts("gpu-001", frozenset({"train"}), frozenset({"h100", "ib"})), "training", ()),
        (NodeFacts("gpu-002", frozenset({"train"}), frozenset({"a100"})), None, ()),
        (NodeFacts("gpu-003", labels={"pool": "serving"}), "inference", ()),
        (NodeFacts("gpu-004", labels={"pool": "serving", "experimental": "yes"}), None, ()),
        (
            NodeFacts("gpu-705", frozenset({"train"}), frozenset({"h100"}), {"pool": "inference"}),
            "training",
            ("inference", "rack7"),
        ),
        (NodeFacts("gpu-705"), "rack7", ()),
    ],
    ids=["partition-and-feature", "feature-missing", "label-in", "label-excluded", "first-wins", "hostlist"],
)
def test_first_matching_profile_wins(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    node: NodeFacts,
    winner: str | None,
    also: tuple[str, ...],
) -> None:
    s = _load(monkeypatch, tmp_path, CONFIG)
    got = resolve(s.profiles, node)
    assert (got.name, got.also) == (winner, also)


def test_profile_policy_merges_over_the_base(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    s = _load(monkeypatch, tmp_path, CONFIG)
    training = s.policy_of("training")
    assert training.policy.max_concurrent == 2 and training.workflow.drain_timeout_s == 1800
    assert training.policy.faults.ladders == {"gpu-memory": ["move-host", "quarantine"]}
    assert s.policy_of("inference").mode == "shadow"
    assert s.policy_of(None).policy.max_concurrent == 6 and s.policy_of("gone").profile is None


def test_explain_names_the_layer_of_every_field(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    s = _load(monkeypatch, tmp_path, CONFIG)
    fields = {f.path: f for f in explain(s.base_policy(), s.profile("training"))}
    assert (fields["policy.max_concurrent"].value, fields["policy.max_concurrent"].layer) == (
        2,
        Layer.PROFILE,
    )
    assert fields["policy.faults.ladders"].layer is Layer.PROFILE
    assert (fields["workflow.drain_timeout_s"].value, fields["workflow.drain_timeout_s"].layer) == (
        1800,
        Layer.BASE,
    )
    assert fields["workflow.on_jobs_timeout"].layer is Layer.DEFAULT
    assert fields["mode"].value == "act" and "machine.azure_test_token" not in fields
    base = {f.path: f.layer for f in explain(s.base_policy(), None)}
    assert base["policy.max_concurrent"] is Layer.BASE and base["mode"] is Layer.DEFAULT


def test_winners_flag_an_empty_profile(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    s = _load(monkeypatch, tmp_path, CONFIG)
    nodes = [NodeFacts("gpu-001", frozenset({"train"}), frozenset({"h100"})), NodeFacts("gpu-750")]
    assert winners(s.profiles, nodes) == {"training": ["gpu-001"], "inference": [], "rack7": ["gpu-750"]}


@pytest.mark.parametrize(
    ("profile", "named"),
    [
        ("{name: a, select: {labels: 'pool in (x'}}", "malformed label selector 'pool in (x'"),
        ("{name: a, select: {labels: 'pool=has space'}}", "not a label value"),
        ("{name: a, select: {hostlist: 'gpu-[3-1]'}}", "malformed hostlist 'gpu-[3-1]'"),
        ("{name: a, select: {}}", "select names no node"),
        ("{name: a, select: {partitions: [p]}, colour: red}", "profiles.0.colour"),
        (
            "{name: a, select: {partitions: [p]}, policy: {our_reason_prefix: 'x:'}}",
            "unknown field(s) ['our_reason_prefix']",
        ),
        (
            "{name: a, select: {partitions: [p]}, policy: {max_concurrent: 0}}",
            "profiles.a.policy.max_concurrent",
        ),
        (
            "{name: a, select: {partitions: [p]}, workflow: {on_jobs_timeout: kill}}",
            "profiles.a.workflow.on_jobs_timeout",
        ),
        ("{name: a, select: {partitions: [p]}, mode: loud}", "profiles.0.mode"),
        (
            "{name: a, select: {partitions: [p]}, machine: {backend: none}, workflow: {ladder: [reimage]}}",
            "profiles.a: workflow.ladder ['reimage'] needs a machine action",
        ),
    ],
    ids=[
        "selector-paren",
        "selector-value",
        "hostlist",
        "empty-select",
        "unknown-field",
        "not-overridable",
        "bad-value",
        "bad-choice",
        "bad-mode",
        "ladder-beyond-hammer",
    ],
)
def test_bad_profiles_fail_at_start_up_naming_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, profile: str, named: str
) -> None:
    with pytest.raises(SettingsError) as err:
        _load(monkeypatch, tmp_path, f"profiles:\n  - {profile}\n")
    assert named in str(err.value)


def test_a_name_given_twice_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="'a' is given twice"):
        _load(
            monkeypatch,
            tmp_path,
            "profiles:\n  - {name: a, select: {partitions: [p]}}\n  - {name: a, select: {partitions: [q]}}\n",
        )


@pytest.mark.parametrize(
    ("selector", "labels", "want"),
    [
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "2"}, False),
        ("a!=1", {}, True),
        ("a", {"a": ""}, True),
        ("!a", {"a": "1"}, False),
        ("a notin (1, 2)", {"a": "3"}, True),
        ("x.io/k in (v)", {"x.io/k": "v"}, True),
    ],
    ids=["eq", "eqeq", "neq-absent", "exists", "absent", "notin", "prefixed-key"],
)
def test_label_selector(selector: str, labels: dict[str, str], want: bool) -> None:
    assert all(r.holds(labels) for r in parse_selector(selector)) is want


def test_a_profile_asks_its_own_jobs_to_checkpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    s = _load(monkeypatch, tmp_path, "profiles:\n  - {name: train, select: {partitions: [train]}, workflow: "
                                     "{checkpoint_signal: USR1, checkpoint_wait_s: 300}}\n")
    train = s.policy_of("train").workflow
    assert (train.checkpoint_signal, train.checkpoint_wait_s) == ("USR1", 300)
    fields = {f.path: f.layer for f in explain(s.base_policy(), s.profile("train"))}
    assert fields["workflow.checkpoint_signal"] is Layer.PROFILE


def test_a_profile_checkpoint_is_checked_as_the_base_one_is(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"profiles\.train\.workflow"):
        _load(monkeypatch, tmp_path, "profiles:\n  - {name: train, select: {partitions: [train]}, workflow: "
                                     "{checkpoint_signal: '', checkpoint_pods: true}}\n")
