"""The ``repair`` settings: off by default, a webhook needs its URL, a URL or token file is read at
start-up, and no error echoes a secret."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from remediation.repair_requests.settings import RepairDelivery, RepairSettings

URL = "https://repair.example/hook?key=s3cret-value"


def test_off_by_default_and_nothing_is_needed() -> None:
    cfg = RepairSettings()
    assert cfg.enabled is False and cfg.webhook_url is None and cfg.bearer() is None


def test_an_enabled_webhook_needs_its_url() -> None:
    with pytest.raises(ValidationError, match="needs repair.webhook_url or webhook_url_file"):
        RepairSettings(enabled=True)
    assert RepairSettings(enabled=True, delivery=RepairDelivery.DIRECTORY).directory.name == "repair-requests"


def test_the_url_and_the_token_are_read_from_files(tmp_path: Path) -> None:
    (tmp_path / "url").write_text(URL + "\n")
    (tmp_path / "token").write_text("  bearer-0123456789  \n")
    cfg = RepairSettings(enabled=True, webhook_url_file=tmp_path / "url", token_file=tmp_path / "token")
    assert cfg.webhook_url is not None and cfg.webhook_url.get_secret_value() == URL
    assert cfg.bearer() == "bearer-0123456789"
    assert "s3cret" not in repr(cfg) and "s3cret" not in str(cfg.model_dump())


def test_a_bad_file_fails_at_start_up_naming_the_field_not_the_secret(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="repair.webhook_url_file: cannot read") as missing:
        RepairSettings(enabled=True, webhook_url_file=tmp_path / "absent")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValidationError, match="repair.token_file: .* is empty"):
        RepairSettings(enabled=True, webhook_url=URL, token_file=tmp_path / "empty")
    with pytest.raises(ValidationError, match="not both") as both:
        (tmp_path / "url").write_text(URL)
        RepairSettings(webhook_url=URL, webhook_url_file=tmp_path / "url")
    assert "s3cret" not in str(missing.value) + str(both.value)


def test_backoff_max_is_at_least_its_base() -> None:
    with pytest.raises(ValidationError, match="backoff_max_s must be at least"):
        RepairSettings(backoff_base_s=600, backoff_max_s=60)
