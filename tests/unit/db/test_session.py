"""A read with no database creates none: a missing SQLite file is "not migrated", said without opening it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from remediation.db.session import DatabaseUnavailable, check_database, make_engine
from remediation.settings import DatabaseSettings

BIN = Path(sys.executable).parent


def test_a_missing_sqlite_file_is_not_migrated_and_not_created(tmp_path: Path) -> None:
    engine = make_engine(DatabaseSettings(url=f"sqlite:///{tmp_path / 'remediation.db'}"))
    with pytest.raises(DatabaseUnavailable, match=r"is not migrated: run `remediation db upgrade`"):
        check_database(engine)
    assert list(tmp_path.iterdir()) == []


def test_a_read_in_an_empty_directory_leaves_it_empty(tmp_path: Path) -> None:
    """`remediation nodes show X` with no configuration: the default URL names ./remediation.db."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMEDIATION_")}
    proc = subprocess.run(
        [str(BIN / "remediation"), "nodes", "show", "gpu-node-1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stderr
    assert (
        "error: database sqlite:///./remediation.db is not migrated: run `remediation db upgrade`"
        in proc.stderr
    )
    assert list(tmp_path.iterdir()) == []
