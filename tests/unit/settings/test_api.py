"""Settings for on-call and retention: named API tokens, durations for retention, log level and format."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from remediation.api.auth import identify
from remediation.settings import SettingsError, load_settings, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90d", 90 * 86400),
        ("12h", 43200),
        ("30m", 1800),
        ("45s", 45),
        ("2w", 14 * 86400),
        ("600", 600),
        (" 1.5h ", 5400),
        ("7D", 7 * 86400),
    ],
    ids=["days", "hours", "minutes", "seconds", "weeks", "bare", "fraction", "upper"],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "text",
    ["", "d", "90x", "-1d", "0", "nanh", "infd"],
    ids=["empty", "unit-only", "bad-unit", "negative", "zero", "nan", "inf"],
)
def test_bad_durations_say_what_a_duration_is(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_retention_age_from_config_and_its_errors() -> None:
    assert load_settings(retention={"events_older_than": "12h"}).retention.events_older_than == timedelta(
        hours=12
    )
    with pytest.raises(SettingsError, match="retention.events_older_than"):
        load_settings(retention={"events_older_than": "soon"})


def test_log_level_and_format_are_checked() -> None:
    assert load_settings(log_level="debug", log_format="json").log_level == "DEBUG"
    with pytest.raises(SettingsError, match="log_level"):
        load_settings(log_level="loud")
    with pytest.raises(SettingsError, match="log_format"):
        load_settings(log_format="xml")


def test_named_tokens_from_files_and_their_errors(tmp_path: Path) -> None:
    (tmp_path / "alice").write_text("alice-token-0123456789\n")
    cfg = load_settings(
        api={
            "tokens": [{"name": "alice", "role": "admin", "token_file": str(tmp_path / "alice")}],
            "read_tokens": ["legacy-read-token-0123"],
        }
    ).api
    alice = identify("alice-token-0123456789", cfg)
    assert alice is not None and (alice.name, alice.role, alice.named) == ("alice", "admin", True)
    assert alice.actor("mallory") == "alice"  # the request cannot rename a named token
    legacy = identify("legacy-read-token-0123", cfg)
    assert legacy is not None and legacy.role == "read" and legacy.name == f"read-{legacy.fingerprint}"
    assert identify("alice-token-012345678", cfg) is None
    bad = [
        ({"name": "a", "role": "admin", "token_file": str(tmp_path / "missing")}, "cannot read token_file"),
        ({"name": "a", "role": "admin"}, "exactly one of token and token_file"),
        ({"name": "a", "role": "admin", "token": "short"}, "at least 16"),
        ({"name": "a", "role": "root", "token": "x" * 20}, "role"),
    ]
    for entry, message in bad:
        with pytest.raises(SettingsError, match=message):
            load_settings(api={"tokens": [entry]})
    with pytest.raises(SettingsError, match="unique"):
        load_settings(
            api={
                "tokens": [
                    {"name": "a", "role": "read", "token": "x" * 20},
                    {"name": "a", "role": "admin", "token": "y" * 20},
                ]
            }
        )


@pytest.mark.parametrize("field", ["admin_tokens", "read_tokens"])
def test_unnamed_tokens_are_held_to_the_named_tokens_minimum(field: str) -> None:
    with pytest.raises(SettingsError, match=rf"api\.{field}: .*at least 16 characters") as err:
        load_settings(api={field: ["long-enough-token-0123", "fifteen-chars-x"]})
    assert "fifteen-chars-x" not in str(err.value)
    assert len(load_settings(api={field: ["sixteen-chars-xx"]}).api.model_dump()[field]) == 1
