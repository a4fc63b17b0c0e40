"""A feature that spans layers lives in one package: a search for its name in the source tree lands
there. Why: docs/architecture.md#the-house-layers-imports-pointing-down"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TREES = ("remediation", "watchers", "workers", "simulator", "demo")


def source_files() -> list[Path]:
    return [p.relative_to(ROOT) for tree in TREES for p in (ROOT / tree).rglob("*.py") if p.is_file()]


@pytest.mark.parametrize(("word", "room"), [("profile", "remediation/profiles"),
                                            ("validation", "remediation/validation"),
                                            ("incident", "remediation/incidents")])
def test_a_search_for_the_feature_lands_in_its_package(word: str, room: str) -> None:
    """Every module named for the feature sits in its package, except the entry points' own surface
    (a CLI command group, an API router), which stays with its door."""
    doors = ("remediation/cli/", "remediation/api/")
    stray = [str(p) for p in source_files()
             if word in p.as_posix().lower() and not p.as_posix().startswith((room + "/", *doors))]
    assert stray == []


def test_the_profiles_package_holds_every_module_named_for_profiles() -> None:
    """A search for "profile" lands in one package: nothing named for profiles outside remediation/profiles, doors included."""
    stray = [str(p) for p in source_files()
             if "profile" in p.as_posix().lower() and not p.as_posix().startswith("remediation/profiles/")]
    assert stray == []
    assert (ROOT / "remediation" / "profiles" / "settings.py").exists()
