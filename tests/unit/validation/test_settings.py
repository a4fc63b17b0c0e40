"""The validation settings of the NVLink domain: the domain check per domain fault class, its deadline,
and the fabric restart's command, each an argument list checked at start-up."""

from __future__ import annotations

from typing import Any

import pytest

from remediation.settings import SettingsError, load_settings
from remediation.validation.settings import DOMAIN_CLASSES


def validation(**fields: Any) -> Any:
    return load_settings(validation=fields).validation


def test_the_defaults_run_nccl_tests_across_the_domain_and_restart_imex() -> None:
    cfg = validation()
    for cls in DOMAIN_CLASSES:
        argv = cfg.domain_check_for(cls)
        assert argv[0] == "srun" and "all_reduce_perf" in argv, cls
    assert cfg.domain_check_timeout_s == 900 and cfg.fabric_restart_timeout_s == 300
    assert cfg.fabric_restart == ["sudo", "-n", "systemctl", "restart", "nvidia-imex"]


@pytest.mark.parametrize(("cls", "expected"), [("imex", ["imex-check"]), ("nvswitch", ["u"]), (None, ["u"]),
                                               ("gpu-memory", ["u"])], ids=repr)
def test_a_class_without_its_own_domain_check_takes_unknown_s(cls: str | None, expected: list[str]) -> None:
    cfg = validation(domain_checks={"unknown": ["u"], "imex": ["imex-check"]})
    assert cfg.domain_check_for(cls) == expected
    cfg.domain_check_for(cls).append("changed")  # a copy: the setting stays as configured
    assert cfg.domain_check_for(cls) == expected


@pytest.mark.parametrize(("fields", "message"), [
    ({"domain_checks": {"imex": ["x"]}}, "domain_checks must name a check for 'unknown'"),
    ({"domain_checks": {"unknown": ["x"], "gpu-rma": ["y"]}}, "'gpu-rma' is not a domain fault class"),
    ({"domain_checks": {"unknown": []}}, "the domain check of 'unknown' must be a non-empty argument list"),
    ({"domain_checks": {"unknown": ["srun", ""]}}, "must be a non-empty argument list"),
    ({"fabric_restart": []}, "fabric_restart must be a non-empty argument list"),
    ({"domain_check_timeout_s": 0}, "domain_check_timeout_s"),
    ({"fabric_restart_timeout_s": -1}, "fabric_restart_timeout_s"),
], ids=["no-unknown", "not-a-domain-class", "empty", "empty-argument", "empty-restart", "zero-deadline",
        "negative-deadline"])
def test_a_bad_domain_setting_stops_the_start(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        validation(**fields)
