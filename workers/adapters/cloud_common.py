"""What the three cloud VM adapters share: the HTTP-status-to-error rule and the idempotency marker.

One rule for every cloud, so that the workflow sees the same typed error for the same situation:

====================  =======================================================================
401, 403              :class:`PermanentError` ("permission denied"): retrying cannot grant a role.
404                   :class:`NotFound`: the VM is gone; escalate rather than wait for it.
408, 409, 429, 5xx    :class:`TransientError`, carrying the server's Retry-After when it sent one.
                      409 is "another operation is in progress on this VM", which ends by itself.
other 4xx             :class:`PermanentError`: a request the service will refuse every time.
====================  =======================================================================

The marker is what Azure and AWS record on the VM (a tag) before they act, because their restart calls
take no request id. Its value is ``<action>:<digest of the key>@<unix time written>``: a digest, never
the key itself (tags are visible to anyone who can read the VM, and have length limits), and the time,
so that a repeated call can ask the VM whether anything happened to it since.
"""

from __future__ import annotations

import email.utils
import hashlib
import time

from remediation.errors import NotFound, PermanentError, RemediationError, TransientError
from remediation.interfaces import VMAction, VMRef

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
    """The typed error for an HTTP status; ``message`` is the provider's own text."""
    where = f" ({vm.provider_id or vm.name})" if vm is not None else ""
    if status in (401, 403):
        return PermanentError(f"permission denied{where}: {message}", status=status)
    if status == 404:
        return NotFound(f"VM not found{where}: {message}", status=status)
    if status is None or status in (408, 409, 429) or status >= 500:
        return TransientError(message + where, retry_after=parse_retry_after(retry_after), status=status)
    return PermanentError(message + where, status=status)
