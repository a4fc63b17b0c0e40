"""What the three cloud VM adapters share: the translation of an HTTP answer and the idempotency marker.

Status codes go through :func:`remediation.ports.errors.error_for_status`. The marker's value is
``<action>:<digest of the key>@<unix time written>``.

Why: docs/clouds.md#the-idempotency-marker
"""

from __future__ import annotations

import email.utils
import hashlib
import time

from remediation.ports.cluster import VMAction, VMRef
from remediation.ports.errors import NotSupported, PermanentError, RemediationError
from remediation.ports.errors import error_for_status as classify

MARKER_TAG = "remediation-action"  # tag key on the VM; the value is marker_for(action, key)


def marker_for(action: VMAction, idempotency_key: str) -> str:
    """``"<action>:<32 hex chars>"``: the identity of one attempt, short and no secret."""
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]
    return f"{action}:{digest}"


def marker_value(marker: str, now: float | None = None) -> str:
    """The tag value recording ``marker`` now."""
    return f"{marker}@{int(time.time() if now is None else now)}"


def parse_marker(value: str | None) -> tuple[str, float] | None:
    """``(marker, written_at)`` from a tag value, or None when the tag is absent or not ours."""
    if not value or "@" not in value:
        return None
    marker, _, written = value.rpartition("@")
    try:
        return marker, float(written)
    except ValueError:
        return None


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After in seconds, from either of its two forms (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_for_status(
    status: int | None, message: str, *, vm: VMRef | None = None, retry_after: str | None = None
) -> RemediationError:
    """The typed error for a cloud's HTTP answer; ``message`` is the provider's own text, and the VM
    it concerns is named in it."""
    where = f" ({vm.provider_id or vm.name})" if vm is not None else ""
    return classify(status, message + where, retry_after=parse_retry_after(retry_after), component="cloud")


def check_restartable(vm: VMRef, action: VMAction, provider: str, *, label: str, service: str) -> None:
    """Refuse, before any call, a VM of another cloud (permanent: routing is wrong) and a reimage on a
    cloud that has none (configuration: the ladder must use stop_start there)."""
    if vm.provider != provider:
        raise PermanentError(f"{label} provider cannot act on a {vm.provider} VM ({vm.provider_id})")
    if action == VMAction.REIMAGE:
        raise NotSupported(f"{service}; configure workflow.ladder with stop_start for {label} nodes")
