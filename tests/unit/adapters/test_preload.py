"""The worker imports its adapters' SDKs before its pool forks (remediation.adapters.preload)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

from remediation.adapters.preload import MODULES, modules_for
from remediation.settings import load_settings


@pytest.mark.parametrize("name", sorted({m for ms in MODULES.values() for m in ms}))
def test_every_named_module_exists(name: str) -> None:
    importlib.import_module(name)


def test_the_configured_backends_choose_the_modules() -> None:
    settings = load_settings(
        slurm={"backend": "cli"}, kube={"backend": "kubernetes"}, machine={"backend": "gce"},
        validation={"backend": "slurm"},
    )  # fmt: skip
    assert modules_for(settings) == [
        "remediation.adapters.slurm.cli",
        "remediation.adapters.kube.adapter",
        "kubernetes.client.api.core_v1_api",
        "remediation.adapters.cloud.gce",
        "remediation.adapters.slurm.validator",
    ]
    none = load_settings(slurm={"backend": "memory"}, kube={"backend": "memory"}, machine={"backend": "auto"},
                         validation={"backend": "none"})  # fmt: skip
    assert modules_for(none) == []


def test_the_worker_app_preloads_before_the_pool_forks() -> None:
    """Loading the worker's app and sending celeryd_init (as `celery worker` does before it starts its
    pool) leaves the SDK in sys.modules; a fresh interpreter, so nothing else imported it first."""
    code = (
        "import sys\n"
        "from celery.signals import celeryd_init\n"
        "import remediation.workers.celery_app\n"
        "assert 'google.cloud.compute_v1' not in sys.modules\n"
        "celeryd_init.send(sender='w@h', instance=None, conf=None, options={})\n"
        "assert 'google.cloud.compute_v1' in sys.modules\n"
    )
    env = {"REMEDIATION_MACHINE__BACKEND": "gce", "REMEDIATION_KUBE__BACKEND": "memory",
           "REMEDIATION_SLURM__BACKEND": "memory", "REMEDIATION_VALIDATION__BACKEND": "none"}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], env=os.environ | env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
