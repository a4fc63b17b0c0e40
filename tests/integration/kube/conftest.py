"""Fixtures for the Kubernetes tests: the local kube-apiserver and official clients pointed at it.

The apiserver holds the namespaces deploy/ ships, with their Pod Security labels, so a pod that
production's admission would refuse is refused here too."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from remediation.settings import Settings, load_settings
from remediation.simulator.kube.api import KubeAPIServer

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
