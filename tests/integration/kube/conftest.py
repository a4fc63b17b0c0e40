"""Fixtures for the Kubernetes tests: the local kube-apiserver and official clients pointed at it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from remediation.settings import Settings, load_settings
from simulator.kube_api import KubeAPIServer


@pytest.fixture
def kube_api() -> Iterator[KubeAPIServer]:
    server = KubeAPIServer(token="test-token", bookmark_interval_s=0.2)
    server.start()
    yield server
    server.stop()


def core_for(url: str, token: str | None) -> client.CoreV1Api:
    cfg = client.Configuration()
    cfg.host = url
    if token is not None:
        cfg.api_key = {"authorization": f"Bearer {token}"}
    cfg.retries = False  # a test about errors wants each request to reach the server exactly once
    return client.CoreV1Api(client.ApiClient(cfg))


@pytest.fixture
def core(kube_api: KubeAPIServer) -> client.CoreV1Api:
    return core_for(kube_api.url, kube_api.token)


@pytest.fixture
def make_settings(kube_api: KubeAPIServer) -> Callable[..., Settings]:
    """Settings pointing at the local API; nested sections are overridden with dicts."""

    def build(**overrides: Any) -> Settings:
        kube = {"host": kube_api.url, "token": kube_api.token, **overrides.pop("kube", {})}
        return load_settings(kube=kube, **overrides)

    return build
