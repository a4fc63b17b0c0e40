"""deploy/ and docker-compose.yml stay true to the code: every file a kustomization names exists, every
REMEDIATION_* variable is a real setting, the shipped config validates, and every command the manifests
run is a command of the `remediation` console script."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from remediation.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZATIONS = sorted((ROOT / "deploy").rglob("kustomization.yaml"))


def _docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _env_names(obj: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(key, str) and key.startswith("REMEDIATION_"):
                found.add(key)
            if key == "name" and isinstance(value, str) and value.startswith("REMEDIATION_"):
                found.add(value)
            found |= _env_names(value)
    elif isinstance(obj, list):
        for item in obj:
            found |= _env_names(item)
    return found


def _setting_exists(env: str) -> bool:
    if env == "REMEDIATION_CONFIG":
        return True
    parts = env.removeprefix("REMEDIATION_").lower().split("__")
    model: Any = Settings
    for part in parts:
        fields = model.model_fields
        if part not in fields:
            return False
        model = fields[part].annotation
    return True


@pytest.mark.parametrize("path", KUSTOMIZATIONS, ids=[str(p.relative_to(ROOT)) for p in KUSTOMIZATIONS])
def test_kustomization_resources_exist(path: Path) -> None:
    (doc,) = _docs(path)
    for res in doc.get("resources", []):
        assert (path.parent / res).exists(), f"{path}: missing resource {res}"


def manifests() -> list[Path]:
    return sorted(p for p in (ROOT / "deploy").rglob("*.yaml")) + [ROOT / "docker-compose.yml"]


@pytest.mark.parametrize("path", manifests(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_environment_variable_is_a_setting(path: Path) -> None:
    names = set().union(*(_env_names(d) for d in _docs(path)))
    unknown = sorted(n for n in names if not _setting_exists(n))
    assert not unknown, f"{path}: not settings: {unknown}"


def test_shipped_config_validates(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (cm,) = [d for d in _docs(ROOT / "deploy/base/config.yaml") if d["kind"] == "ConfigMap"]
    cfg = tmp_path / "config.yaml"
    cfg.write_text(cm["data"]["config.yaml"])
    for key in list(os.environ):
        if key.startswith("REMEDIATION_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("REMEDIATION_CONFIG", str(cfg))
    settings = Settings()
    assert settings.dry_run is True and settings.slurm.backend == "rest"


def test_manifests_run_only_real_commands() -> None:
    from typer.main import get_command

    from workers.cli import app

    commands = set(get_command(app).commands)  # type: ignore[attr-defined]
    used: set[str] = set()
    for path in manifests():
        for doc in _docs(path):
            for node in _walk(doc):
                args = node.get("args") or node.get("command")
                if isinstance(args, list) and args and node.get("image") in ("node-remediation", "node-remediation:dev"):
                    used.add(args[0])
            if path.name == "docker-compose.yml":
                for svc in doc["services"].values():
                    if svc.get("image") == "node-remediation:dev" and svc.get("command"):
                        used.add(svc["command"][0])
    assert used and used <= commands, sorted(used - commands)


def _walk(obj: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(obj, dict):
        out.append(obj)
        for v in obj.values():
            out += _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            out += _walk(v)
    return out
