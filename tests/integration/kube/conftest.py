"""Fixtures for the Kubernetes tests: the local kube-apiserver and official clients pointed at it.

The apiserver holds the namespaces deploy/ ships, with their Pod Security labels, so a pod that
production's admission would refuse is refused here too."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from remediation.settings import Settings, load_settings
from remediation.simulator.kube.api import KubeAPIServer
from tests.infra import missing

ROOT = Path(__file__).resolve().parents[3]
#: The Namespaces deploy/ ships: the service's own and the check Jobs' (the kubernetes validation).
SHIPPED_NAMESPACES = ("deploy/base/namespace.yaml", "deploy/components/validation-kubernetes/namespace.yaml")


def shipped_namespaces() -> dict[str, dict[str, str]]:
    found = {}
    for path in SHIPPED_NAMESPACES:
        for doc in yaml.safe_load_all((ROOT / path).read_text()):
            if doc and doc["kind"] == "Namespace":
                found[doc["metadata"]["name"]] = doc["metadata"].get("labels", {})
    return found


@pytest.fixture
def kube_api() -> Iterator[KubeAPIServer]:
    server = KubeAPIServer(token="test-token", bookmark_interval_s=0.2)
    for name, labels in shipped_namespaces().items():
        server.add_namespace(name, labels)
    server.start()
    yield server
    server.stop()


def core_for(url: str, token: str | None, ca_file: object = None) -> client.CoreV1Api:
    """An official client for ``url``, trusting ``ca_file`` (the local apiserver's per-run CA)."""
    cfg = client.Configuration()
    cfg.host = url
    cfg.ssl_ca_cert = str(ca_file) if ca_file is not None else None
    if token is not None:
        cfg.api_key = {"authorization": f"Bearer {token}"}
    cfg.retries = False  # a test about errors wants each request to reach the server exactly once
    return client.CoreV1Api(client.ApiClient(cfg))


@pytest.fixture
def core(kube_api: KubeAPIServer) -> client.CoreV1Api:
    return core_for(kube_api.url, kube_api.token, kube_api.ca_file)


@pytest.fixture
def make_settings(kube_api: KubeAPIServer) -> Callable[..., Settings]:
    """Settings pointing at the local API; nested sections are overridden with dicts."""

    def build(**overrides: Any) -> Settings:
        kube = {
            "host": kube_api.url,
            "token": kube_api.token,
            "ca_file": str(kube_api.ca_file),
            **overrides.pop("kube", {}),
        }
        return load_settings(kube=kube, **overrides)

    return build


KUBECTL = shutil.which("kubectl")
#: kubectl as the oracle (tests/integration/kube/test_kubectl.py says why): a real client nobody here wrote.
Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def kubeconfig(kube_api: KubeAPIServer, tmp_path: Path) -> Iterator[Path]:
    if KUBECTL is None:
        missing("kubectl")
    yield kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    # None of these verbs needs the OpenAPI document, which the fake therefore does not serve; a
    # kubectl that started asking for it would show up here, not as a puzzling 404 elsewhere.
    assert not [r.path for r in kube_api.requests if r.path.startswith("/openapi")]


def kubectl_env(kubeconfig: Path) -> dict[str, str]:
    # A private HOME: kubectl caches discovery under ~/.kube/cache, which must not leak between runs.
    return {"PATH": os.environ.get("PATH", ""), "HOME": str(kubeconfig.parent), "KUBECONFIG": str(kubeconfig)}


@pytest.fixture
def kubectl(kubeconfig: Path) -> Run:
    def run(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        assert KUBECTL is not None
        done = subprocess.run(  # noqa: S603 - fixed argv, no shell
            [KUBECTL, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=kubectl_env(kubeconfig),
            check=False,
        )
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stdout}{done.stderr}"
        return done

    return run
