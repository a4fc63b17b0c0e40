"""The Kubernetes client keeps a connection for every thread that may call it at once."""

from __future__ import annotations

from annotated_types import Le

from remediation.adapters.kube.client import POOL_MAXSIZE, kube_client
from remediation.settings import KubeSettings
from remediation.settings.workflow import WorkflowSettings


def test_the_kube_client_keeps_a_connection_for_every_isolation_thread() -> None:
    most = next(m.le for m in WorkflowSettings.model_fields["isolate_threads"].metadata if isinstance(m, Le))
    api = kube_client(KubeSettings(host="https://127.0.0.1:6443"))
    assert api.api_client.configuration.connection_pool_maxsize == POOL_MAXSIZE >= most
