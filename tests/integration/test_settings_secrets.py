"""No secret reaches a person through a configuration error: every secret-bearing setting, fed bad
values through a real process start.

The secret-bearing settings are found, not listed: every field whose type holds a ``SecretStr`` and
every URL (which may carry ``user:password@``). Each gets values that are not JSON, JSON of the wrong
type, too short, and well-formed but unusable, each holding a marker that appears nowhere else. The
process is ``remediation status`` (it loads the settings, then reads the database), run as on-call
runs it. Whatever it prints must not contain the marker; when it refuses the settings, it names the
field.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel, SecretStr

from remediation.settings import Settings
from tests.integration.apiproc import base_env
from tests.scenario_table import CONFIG_SECRET, BadInputs


def _holds_secret(annotation: Any) -> bool:
    if annotation is SecretStr:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return any(_holds_secret(f.annotation) for f in annotation.model_fields.values())
    return any(_holds_secret(a) for a in get_args(annotation))


def secret_fields() -> list[str]:
    out = []
    for section, field in Settings.model_fields.items():
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        for name, sub in model.model_fields.items():
            if _holds_secret(sub.annotation) or name.endswith("url"):
                out.append(f"{section}.{name}")
    return out


FIELDS = secret_fields()


def test_the_secret_bearing_settings_are_all_found() -> None:
    assert {
        "api.admin_tokens",
        "api.read_tokens",
        "api.tokens",
        "kube.token",
        "slurm.rest_token",
        "machine.azure_test_token",
        "notify.webhook_url",
        "database.url",
        "broker.redis_url",
    } <= set(FIELDS)


def bad_values(field: str, marker: str) -> list[str]:
    """Values holding ``marker`` (10 characters: under any token minimum)."""
    values = [f"not json {marker}", json.dumps(marker), json.dumps({"x": marker}), json.dumps([marker])]
    if field.endswith("url"):  # well-formed, with the marker as the password, and a host that is not there
        scheme = {"database.url": "postgresql+psycopg", "broker.redis_url": "redis"}.get(field, "https")
        values.append(f"{scheme}://user:{marker}@127.0.0.1:1/0")
    if field == "api.tokens":
        values += [
            json.dumps([{"name": "a", "role": "admin", "token": marker}]),
            json.dumps([{"name": "a", "role": "root", "token": marker * 2}]),
            json.dumps([{"name": "a", "role": "admin", "token": marker, "token_file": "/none"}]),
        ]
    return values


def cases() -> list[Any]:
    return [
        pytest.param(field, i, id=f"{field}-{i}")
        for field in FIELDS
        for i in range(len(bad_values(field, "")))
    ]


@pytest.mark.parametrize(("field", "index"), cases())
def test_a_bad_secret_is_never_echoed(
    pg_url: str, tmp_path: Path, field: str, index: int, bad_inputs: BadInputs
) -> None:
    marker = "Mk" + uuid.uuid4().hex[:8]
    value = bad_values(field, marker)[index]
    env = base_env(pg_url) | {"REMEDIATION_" + field.upper().replace(".", "__"): value}
    done = subprocess.run(
        [sys.executable, "-m", "remediation.cli", "status"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    said = done.stdout + done.stderr
    assert marker not in said, said
    if "invalid configuration" in said:  # a section-level check names the section and the field
        assert field in said or all(part in said for part in field.split(".")), said
    elif done.returncode != 0:
        assert field.split(".")[0] in said, said
    bad_inputs.tried(CONFIG_SECRET, f"{field}, bad value #{index}", f"exit {done.returncode}, value not echoed",
                     lost=None)
