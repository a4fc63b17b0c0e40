"""deploy/base/prometheus-rules.yaml validates offline: its shape is a PrometheusRule, `promtool check
rules` accepts its groups (PromQL syntax and annotation templates), and `promtool test rules` shows each
alert firing on made-up series of the condition it names and staying quiet on a healthy cluster.
tests/integration/test_health_endpoints.py checks that every series the rules name is exported."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy/base/prometheus-rules.yaml"
# What the issue asks alerts for, and the one more this project adds (failing tasks).
ALERTS = {
    "RemediationWatcherStale",
    "RemediationBreakerOpen",
    "RemediationAutomationPaused",
    "RemediationStuck",
    "RemediationQuarantineRateHigh",
    "RemediationRejectedEvents",
    "RemediationEventLag",
    "RemediationTasksFailing",
}
PROMQL_WORDS = {
    "time", "max", "sum", "by", "without", "or", "and", "unless", "increase", "rate", "absent",
    "label_replace", "on", "ignoring", "histogram_quantile", "min",
}  # fmt: skip


def rule() -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(RULES.read_text()) if d]
    return doc  # type: ignore[no-any-return]


def alerts() -> list[dict[str, Any]]:
    return [r for g in rule()["spec"]["groups"] for r in g["rules"] if "alert" in r]


def series_names(expr: str) -> set[str]:
    """The metric names an expression reads: identifiers that are neither PromQL words, label names
    (inside {...} or by/without (...)) nor strings."""
    stripped = re.sub(r'"[^"]*"', "", expr)
    stripped = re.sub(r"\{[^}]*\}", "", stripped)
    stripped = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", stripped)
    stripped = re.sub(r"\[[^\]]*\]", "", stripped)  # range selectors: [1h], [7d]
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", stripped)) - PROMQL_WORDS
    return names


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed (Debian's `prometheus` package; scripts/setup.sh installs it)")
    return path


def test_the_rules_are_a_prometheus_rule() -> None:
    doc = rule()
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert set(doc["spec"]) == {"groups"}
    for group in doc["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["rules"]
        for r in group["rules"]:
            assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, r
            assert r["labels"]["severity"] in ("critical", "warning"), r["alert"]
            assert {"summary", "description"} <= set(r["annotations"]), r["alert"]
    assert {a["alert"] for a in alerts()} == ALERTS
    assert str((ROOT / "deploy/base/kustomization.yaml").read_text()).count("prometheus-rules.yaml") == 1


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule()["spec"]["groups"]}))
    out = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in out.stdout


def test_series_names_are_read_from_expressions() -> None:
    expr = 'max by (step) (foo_seconds{step!="a"}) > 4 * 3600 or label_replace(absent(bar{x="y"}), "w", "s", "", "")'
    assert series_names(expr) == {"foo_seconds", "bar"}
    assert series_names("max(increase(baz_total[1h])) > 3") == {"baz_total"}


# Each case: series over 40 minutes at 1m steps, then which alerts fire (with their labels) at 30m.
# The healthy case is the same cluster with nothing wrong: no alert at all.
HEALTHY = [
    ('remediation_watcher_leader{watcher="slurm",pod="s1"}', "1x40"),
    ('remediation_watcher_leader{watcher="slurm",pod="s2"}', "0x40"),
    ('remediation_watcher_last_success_timestamp_seconds{watcher="slurm",pod="s1"}', "0+60x40"),
    ('remediation_watcher_last_success_timestamp_seconds{watcher="slurm",pod="s2"}', "0x40"),
    ('remediation_watcher_leader{watcher="kube",pod="k1"}', "1x40"),
    ('remediation_watcher_last_success_timestamp_seconds{watcher="kube",pod="k1"}', "0+60x40"),
    ('remediation_breaker_open{cluster="default",pod="a1"}', "0x40"),
    ('remediation_paused{cluster="default",pod="a1"}', "0x40"),
    ('remediation_oldest_open_seconds{cluster="default",step="k8s_evict",pod="a1"}', "120x40"),
    ('remediation_workflow_lag_seconds{cluster="default",pod="a1"}', "0x40"),
    ('remediation_remediations_total{cluster="default",outcome="quarantined",pod="a1"}', "5x40"),
    ('remediation_rejected_events_total{cluster="default",pod="a1"}', "2x40"),
    ('remediation_worker_tasks_total{task="remediation.ingest",outcome="failed",pod="w1"}', "0x40"),
    ('remediation_queue_depth{queue="events",pod="a1"}', "0 800 20 0 3000 0x36"),  # bursts, drained
    ('remediation_worker_tasks_total{task="remediation.ingest",outcome="succeeded",pod="w1"}', "0+10x40"),
]


def _with(changes: dict[str, str]) -> list[tuple[str, str]]:
    return [(series, changes.get(series, values)) for series, values in HEALTHY]


CASES: dict[str, tuple[list[tuple[str, str]], list[dict[str, str]]]] = {
    "RemediationWatcherStale": (
        _with(
            {'remediation_watcher_last_success_timestamp_seconds{watcher="kube",pod="k1"}': "0+60x5 300x35"}
        ),
        [{"watcher": "kube", "severity": "critical"}],
    ),
    "RemediationBreakerOpen": (
        _with({'remediation_breaker_open{cluster="default",pod="a1"}': "0x10 1x30"}),
        [{"cluster": "default", "severity": "critical"}],
    ),
    "RemediationAutomationPaused": (
        _with({'remediation_paused{cluster="default",pod="a1"}': "0x5 1x35"}),
        [{"cluster": "default", "severity": "warning"}],
    ),
    "RemediationStuck": (
        _with({'remediation_oldest_open_seconds{cluster="default",step="k8s_evict",pod="a1"}': "14000+60x40"}),
        [{"cluster": "default", "step": "k8s_evict", "severity": "warning"}],
    ),
    "RemediationQuarantineRateHigh": (
        _with({'remediation_remediations_total{cluster="default",outcome="quarantined",pod="a1"}': "5x10 6 7 8 9 10 11 12x20"}),
        [{"cluster": "default", "severity": "warning"}],
    ),
    "RemediationRejectedEvents": (
        _with({'remediation_rejected_events_total{cluster="default",pod="a1"}': "2+1x40"}),
        [{"cluster": "default", "severity": "warning"}],
    ),
    "RemediationEventLag": (
        _with({'remediation_queue_depth{queue="events",pod="a1"}': "0x10 1500+100x30"}),
        [{"severity": "warning"}],
    ),
    "RemediationTasksFailing": (
        _with(
            {'remediation_worker_tasks_total{task="remediation.ingest",outcome="failed",pod="w1"}': "0+1x40"}
        ),
        [{"task": "remediation.ingest", "severity": "warning"}],
    ),
}


def _promtool_test(
    tmp_path: Path, series: list[tuple[str, str]], expected: dict[str, list[dict[str, str]]]
) -> None:
    groups = rule()["spec"]["groups"]
    for group in groups:
        for r in group["rules"]:
            r.pop("annotations", None)  # checked by `promtool check rules`; here only when and what fires
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "alert_rule_test": [
                    {
                        "eval_time": "30m",
                        "alertname": name,
                        "exp_alerts": [{"exp_labels": labels} for labels in exp],
                    }
                    for name, exp in expected.items()
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    out = subprocess.run(
        [promtool(), "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_healthy_cluster_raises_no_alert(tmp_path: Path) -> None:
    _promtool_test(tmp_path, HEALTHY, {name: [] for name in ALERTS})


@pytest.mark.parametrize("alert", sorted(CASES))
def test_each_alert_fires_on_its_condition_alone(alert: str, tmp_path: Path) -> None:
    series, labels = CASES[alert]
    _promtool_test(tmp_path, series, {name: (labels if name == alert else []) for name in ALERTS})


def test_every_alert_has_a_case() -> None:
    assert set(CASES) == ALERTS


def test_no_watcher_leader_is_stale_too(tmp_path: Path) -> None:
    """Both replicas standing by (the lock in Redis lost for good) and a watcher absent altogether."""
    series = [
        (s, "0x40" if "watcher_leader" in s and 'watcher="slurm"' in s else v)
        for s, v in HEALTHY
        if 'watcher="kube"' not in s
    ]
    expected: dict[str, list[dict[str, str]]] = {name: [] for name in ALERTS}
    expected["RemediationWatcherStale"] = [
        {"watcher": "slurm", "severity": "critical"},
        {"watcher": "kube", "severity": "critical"},
    ]
    _promtool_test(tmp_path, series, expected)


def test_each_cluster_alerts_on_its_own(tmp_path: Path) -> None:
    """Two clusters in one database: the breaker of one latched, the other's healthy; one alert, naming it."""
    series = [*HEALTHY, ('remediation_breaker_open{cluster="east",pod="a1"}', "0x10 1x30"),
              ('remediation_paused{cluster="east",pod="a1"}', "0x40")]
    expected: dict[str, list[dict[str, str]]] = {name: [] for name in ALERTS}
    expected["RemediationBreakerOpen"] = [{"cluster": "east", "severity": "critical"}]
    _promtool_test(tmp_path, series, expected)
