"""Settings: every field documented, env/YAML/TOML sources, and bad config named by field."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from remediation.settings import CONFIG_ENV, Settings, SettingsError, load_settings, overlay


def _fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for name, field in model.model_fields.items():
        out.append((prefix + name, field))
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _fields(ann, prefix + name + ".")
    return out


@pytest.mark.parametrize(("name", "field"), _fields(Settings), ids=[n for n, _ in _fields(Settings)])
def test_every_setting_is_documented(name: str, field: Any) -> None:
    ann = field.annotation
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        assert ann.__doc__ or field.description, name
    else:
        assert field.description and len(field.description) > 10, f"{name} has no description"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("REMEDIATION_"):
            monkeypatch.delenv(key)


def test_environment_with_prefix_and_nesting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REMEDIATION_POLICY__MAX_CONCURRENT", "9")
    monkeypatch.setenv("REMEDIATION_DRY_RUN", "true")
    s = load_settings()
    assert s.policy.max_concurrent == 9 and s.dry_run is True


@pytest.mark.parametrize(
    ("suffix", "text"),
    [(".yaml", "policy:\n  max_concurrent: 7\nslurm:\n  backend: rest\n"),
     (".toml", "[policy]\nmax_concurrent = 7\n[slurm]\nbackend = 'rest'\n")],
    ids=["yaml", "toml"],
)
def test_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, suffix: str, text: str) -> None:
    path = tmp_path / f"config{suffix}"
    path.write_text(text)
    monkeypatch.setenv(CONFIG_ENV, str(path))
    s = load_settings()
    assert (s.policy.max_concurrent, s.slurm.backend) == (7, "rest")


def test_environment_beats_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  max_concurrent: 7\n")
    monkeypatch.setenv(CONFIG_ENV, str(path))
    monkeypatch.setenv("REMEDIATION_POLICY__MAX_CONCURRENT", "2")
    assert load_settings().policy.max_concurrent == 2


@pytest.mark.parametrize(
    ("env", "expected"),
    [({"REMEDIATION_SIM__NODES": "n-[0-3]", "REMEDIATION_SIM__CALL_DELAY_S": '{"vm.start": 2}'},
      ("n-[0-3]", {"vm.start": 2.0})),
     ({"REMEDIATION_MEMORY__NODES": "n-[0-3]", "REMEDIATION_MEMORY__CALL_DELAY_S": '{"vm.start": 2}'},
      ("n-[0-3]", {"vm.start": 2.0})),
     ({"REMEDIATION_SIM__NODES": "old-[0-3]", "REMEDIATION_MEMORY__NODES": "new-[0-1]",
       "REMEDIATION_SIM__CALL_DELAY_S": '{"vm.start": 2}'}, ("new-[0-1]", {"vm.start": 2.0}))],
    ids=["old-name", "new-name", "new-name-wins-old-fills-the-rest"],
)
def test_memory_section_from_the_environment(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                expected: tuple[str, dict[str, float]]) -> None:
    """The section once called ``sim`` is read under both names (REMEDIATION_SIM__* still works)."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = load_settings()
    assert (s.memory.nodes, s.memory.call_delay_s) == expected


@pytest.mark.parametrize(
    ("suffix", "text"),
    [(".yaml", "sim:\n  nodes: n-[0-3]\n  op_polls: 3\n"),
     (".yaml", "memory:\n  nodes: n-[0-3]\n  op_polls: 3\n"),
     (".toml", "[sim]\nnodes = 'n-[0-3]'\nop_polls = 3\n"),
     (".yaml", "sim:\n  nodes: old-[0-1]\n  op_polls: 3\nmemory:\n  nodes: n-[0-3]\n")],
    ids=["old-name-yaml", "new-name-yaml", "old-name-toml", "new-name-wins-old-fills-the-rest"],
)
def test_memory_section_from_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, suffix: str,
                                         text: str) -> None:
    path = tmp_path / f"config{suffix}"
    path.write_text(text)
    monkeypatch.setenv(CONFIG_ENV, str(path))
    s = load_settings()
    assert (s.memory.nodes, s.memory.op_polls) == ("n-[0-3]", 3)


def test_memory_section_precedence_across_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Either name in the environment beats either name in the file; a bad old-name value is named."""
    path = tmp_path / "c.yaml"
    path.write_text("memory:\n  nodes: file-[0-1]\n")
    monkeypatch.setenv(CONFIG_ENV, str(path))
    monkeypatch.setenv("REMEDIATION_SIM__NODES", "env-[0-1]")
    assert load_settings().memory.nodes == "env-[0-1]"
    monkeypatch.setenv("REMEDIATION_SIM__CALL_DELAY_S", "soon")
    with pytest.raises(SettingsError, match="REMEDIATION_SIM__CALL_DELAY_S must be a JSON object"):
        load_settings()


@pytest.mark.parametrize(
    ("env", "text", "expected"),
    [({"REMEDIATION_VM__BACKEND": "aws", "REMEDIATION_VM__AWS_REGION": "eu-west-1"}, None, ("aws", "eu-west-1")),
     ({}, "vm:\n  backend: gce\n  aws_region: eu-west-1\n", ("gce", "eu-west-1")),
     ({"REMEDIATION_VM__BACKEND": "aws", "REMEDIATION_MACHINE__BACKEND": "azure"}, None, ("azure", None)),
     ({}, "vm:\n  backend: gce\n  aws_region: eu-west-1\nmachine:\n  backend: aws\n", ("aws", "eu-west-1"))],
    ids=["old-name-env", "old-name-file", "new-name-wins-env", "new-name-wins-old-fills-the-rest"],
)
def test_machine_section_is_read_under_its_old_name_vm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                        env: dict[str, str], text: str | None,
                                                        expected: tuple[str, str | None]) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if text is not None:
        (tmp_path / "c.yaml").write_text(text)
        monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "c.yaml"))
    s = load_settings()
    assert (s.machine.backend, s.machine.aws_region) == expected
    assert load_settings(vm={"backend": "gce"}).machine.backend == "gce"  # and as an argument


def test_a_baseline_policy_may_use_the_old_name(tmp_path: Path) -> None:
    path = tmp_path / "baseline.yaml"
    path.write_text("sim:\n  op_polls: 4\n")
    s = overlay(load_settings(memory={"nodes": "n-[0-3]"}), path)
    assert (s.memory.nodes, s.memory.op_polls) == ("n-[0-3]", 4)


BAD = [
    ("zero-concurrency", {"REMEDIATION_POLICY__MAX_CONCURRENT": "0"}, "policy.max_concurrent"),
    ("not-a-number", {"REMEDIATION_POLICY__BREAKER_MAX_FRACTION": "lots"}, "policy.breaker_max_fraction"),
    ("bad-regex", {"REMEDIATION_POLICY__IGNORE_REASONS": '["(unclosed"]'}, "policy.ignore_reasons"),
    ("bad-condition", {"REMEDIATION_POLICY__KUBE_CONDITIONS": '["Ready"]'}, "policy.kube_conditions"),
    ("unknown-backend", {"REMEDIATION_SLURM__BACKEND": "ssh"}, "slurm.backend"),
    ("unknown-ladder", {"REMEDIATION_WORKFLOW__LADDER": '["pray"]'}, "workflow.ladder"),
    ("wait-above-visibility", {"REMEDIATION_WORKFLOW__MAX_WAIT_S": "5000"}, "max_wait_s"),
]


@pytest.mark.parametrize(("env", "field"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_config_names_the_field(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], field: str) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert field in str(info.value)


def test_unknown_key_in_file_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  max_concurent: 3\n")
    monkeypatch.setenv(CONFIG_ENV, str(path))
    with pytest.raises(SettingsError, match="policy.max_concurent"):
        load_settings()


@pytest.mark.parametrize(("name", "text", "message"), [
    ("missing.yaml", None, "no such config file"),
    ("c.ini", "x=1", "must end in .yaml"),
    ("broken.yaml", "policy: [unclosed", "cannot read configuration"),
], ids=["missing", "wrong-suffix", "syntax"])
def test_unreadable_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, text: str | None,
                                message: str) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    monkeypatch.setenv(CONFIG_ENV, str(path))
    with pytest.raises(SettingsError, match=message):
        load_settings()


@pytest.mark.parametrize(
    ("url", "ca_file", "expected"),
    [
        ("redis://worker:pw@redis:6379/0", "/ca.pem", {}),
        ("rediss://worker:pw@redis:6379/0", None, {"ssl_cert_reqs": ssl.CERT_REQUIRED}),
        ("rediss://worker:pw@redis:6379/0", "/ca.pem", {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": "/ca.pem"}),
    ],
    ids=["plain", "tls-system-cas", "tls-own-ca"],
)
def test_redis_tls_always_verifies(url: str, ca_file: str | None, expected: dict[str, Any]) -> None:
    """rediss:// verifies the server's certificate, against broker.ca_file when set; redis:// is plain."""
    assert load_settings(broker={"redis_url": url, "ca_file": ca_file}).broker.tls(url) == expected


def test_a_short_session_key_is_refused_without_echoing_it() -> None:
    with pytest.raises(SettingsError, match="api.session_key") as err:
        load_settings(api={"session_key": "short-secret-key"})
    assert "short-secret-key" not in str(err.value)


@pytest.mark.parametrize(
    "url",
    ["http://slurmrestd.slurm:6820", "http://10.0.0.7:6820", "HTTP://0.0.0.0:6820"],
    ids=["name", "address", "any-address"],
)
def test_the_slurm_jwt_never_goes_over_plain_http_to_another_host(url: str) -> None:
    secret = "eyJ-a-slurm-jwt-that-must-not-be-echoed"
    with pytest.raises(SettingsError, match="rest_token would be sent in clear over http://") as err:
        load_settings(slurm={"backend": "rest", "rest_url": url, "rest_token": secret})
    assert secret not in str(err.value)


@pytest.mark.parametrize(
    "url",
    ["https://slurmrestd.slurm:6820", "http://127.0.0.1:6820", "http://localhost:6820", "http://[::1]:6820",
     "unix:/run/slurmrestd.sock"],
    ids=["https", "loopback", "localhost", "ipv6-loopback", "unix"],
)
def test_the_slurm_jwt_may_go_over_tls_a_socket_or_loopback(url: str) -> None:
    settings = load_settings(slurm={"backend": "rest", "rest_url": url, "rest_token": "jwt"})
    assert settings.slurm.rest_url == url


_TWO_CLUSTERS = """
dry_run: true
clusters:
  - {name: us-east, slurm: {backend: memory, rest_user: east}, kube: {backend: memory}, machine: {backend: memory}}
  - {name: west, slurm: {backend: memory}, kube: {backend: memory}, machine: {backend: memory}}
"""


def test_a_clusters_entry_takes_its_secret_from_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(_TWO_CLUSTERS)
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "c.yaml"))
    monkeypatch.setenv("REMEDIATION_CLUSTERS__US_EAST__SLURM__REST_TOKEN", "east-jwt")
    monkeypatch.setenv("REMEDIATION_CLUSTERS__WEST__KUBE__REQUEST_TIMEOUT_S", "7")
    fleet = load_settings().fleet()
    east, west = fleet["us-east"], fleet["west"]
    assert east.slurm.rest_token is not None and east.slurm.rest_token.get_secret_value() == "east-jwt"
    assert east.slurm.rest_user == "east"  # the file's other fields of the entry stay
    assert west.slurm.rest_token is None and west.kube.request_timeout_s == 7.0
    assert east.kube.request_timeout_s == 30.0


@pytest.mark.parametrize(
    ("env", "config"),
    [("REMEDIATION_CLUSTERS__NORTH__SLURM__REST_TOKEN", True), ("REMEDIATION_CLUSTERS__WEST__SLURM", True),
     ("REMEDIATION_CLUSTERS__WEST__SLURM__REST_TOKEN", False)],
    ids=["no-such-cluster", "no-field", "no-config-file"],
)
def test_an_entry_variable_naming_nothing_fails_without_its_value(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path, env: str, config: bool) -> None:
    (tmp_path / "c.yaml").write_text(_TWO_CLUSTERS)
    if config:
        monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "c.yaml"))
    monkeypatch.setenv(env, "sekrit-value")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert env in str(err.value) and "sekrit" not in str(err.value)
