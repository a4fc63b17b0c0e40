"""Talking to the Kubernetes API server: how the client is configured, and how its errors become ours.

:func:`kube_client` builds the ``CoreV1Api`` the adapter and the watcher share: ``kube.host`` with a
bearer token (and ``kube.ca_file``) when configured, else the in-cluster service account, else a
kubeconfig; urllib3 retries only connection failures, briefly: the workflow honours a 429's Retry-After. :func:`translate` maps every SDK and transport error
onto the typed errors of :mod:`remediation.ports.errors` (the one HTTP table), keeping the server's
message and Retry-After.

Why: docs/kubernetes.md#kubernetes
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from remediation.ports.errors import (
    ConfigError,
    PermanentError,
    RemediationError,
    TransientError,
    error_for_status,
)
from remediation.settings import KubeSettings

log = logging.getLogger(__name__)


def retry_after(exc: ApiException) -> float | None:
    """The server's Retry-After (seconds or an HTTP date), else the Status' retryAfterSeconds."""
    value = (exc.headers or {}).get("Retry-After")
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                return max(0.0, (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds())
            except (TypeError, ValueError):
                pass
    seconds = (_status_body(exc).get("details") or {}).get("retryAfterSeconds")
    return float(seconds) if isinstance(seconds, int | float) and seconds > 0 else None


def _status_body(exc: ApiException) -> dict[str, Any]:
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def translate(exc: BaseException, what: str) -> RemediationError:
    """Map an SDK or transport error onto the workflow's error types, keeping the server's message."""
    if isinstance(exc, ApiException):
        code = int(exc.status or 0)
        message = f"{what}: HTTP {code} {_status_body(exc).get('message') or exc.reason or ''}".rstrip()
        # The one table (remediation.ports.errors): 401/403 pause automation, 404 is NotFound, 409/410/429/5xx
        # retry; code 0 is the client's "no HTTP answer at all".
        return error_for_status(code or None, message, retry_after=retry_after(exc), component="kubernetes")
    reason = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) else exc
    if isinstance(reason, urllib3.exceptions.SSLError | ssl.SSLCertVerificationError):
        # The server's certificate does not verify against kube.ca_file (or its name does not match):
        # our configuration, not the node and not a blip; retrying cannot fix it.
        return ConfigError(f"{what}: TLS to the Kubernetes API failed (kube.ca_file, kube.host?): {reason}",
                           component="kubernetes")  # fmt: skip
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return TransientError(f"{what}: cannot reach the Kubernetes API: {exc}")
    return PermanentError(f"{what}: {exc}")


@contextmanager
def api_errors(what: str) -> Iterator[None]:
    try:
        yield
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
        raise translate(exc, what) from exc


def is_budget_refusal(exc: ApiException) -> bool:
    causes = (_status_body(exc).get("details") or {}).get("causes") or []
    return any(c.get("reason") == "DisruptionBudget" for c in causes if isinstance(c, dict))


POOL_MAXSIZE = 64  # workflow.isolate_threads is at most 64


def kube_client(settings: KubeSettings) -> client.CoreV1Api:
    """host+token(+ca_file) when configured, else in-cluster service account, else kubeconfig."""
    cfg = client.Configuration()
    if settings.host:
        cfg.host = settings.host.rstrip("/")
        if settings.token is not None:
            cfg.api_key = {"authorization": f"Bearer {settings.token.get_secret_value()}"}
        if settings.ca_file:
            # Read now: the client would only fail at its first call, as an unreachable server.
            try:
                with open(settings.ca_file, "rb"):
                    pass
            except OSError as exc:
                raise ConfigError(
                    f"kube.ca_file {settings.ca_file}: {exc.strerror or exc}", component="kubernetes"
                ) from exc
            cfg.ssl_ca_cert = settings.ca_file
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
    # urllib3's default Retry would sleep out a 429/503's Retry-After (three times) inside the call,
    # blocking a worker for minutes. Only connection failures are retried here, briefly; every HTTP
    # status comes back to translate(), and the workflow schedules the retry with Retry-After.
    cfg.retries = urllib3.Retry(
        connect=2, read=0, redirect=0, status=0, other=0, backoff_factor=0.1, respect_retry_after_header=False
    )
    # One kept-alive connection per thread that may call at once (remediation.isolate's threads, 16 by
    # default): urllib3 discards a connection beyond the pool's size, and a new one is a TLS handshake.
    cfg.connection_pool_maxsize = POOL_MAXSIZE
    return client.CoreV1Api(client.ApiClient(cfg))
