"""The few error types that decide what the workflow does next.

Adapters translate every SDK or command error at their boundary into one of these, keeping the
provider's own message. The workflow engine never inspects SDK exceptions:

- :class:`TransientError`: retry later with backoff, honouring ``retry_after`` (429, 5xx, timeouts,
  connection refused).
- :class:`PermanentError`: retrying cannot help (403, 404 meaning "gone", a bad providerID); escalate.
- :class:`NotFound`: a permanent error for an object that does not exist (unknown node).
"""

from __future__ import annotations


class RemediationError(Exception):
    """Base of the errors adapters may raise."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    @property
    def kind(self) -> str:
        return type(self).__name__


class TransientError(RemediationError):
    """Worth retrying; ``retry_after`` (seconds) is the server's own hint when it gave one."""

    def __init__(self, message: str, *, retry_after: float | None = None, status: int | None = None) -> None:
        super().__init__(message, status=status)
        self.retry_after = retry_after


class PermanentError(RemediationError):
    """Retrying will not help; the workflow escalates."""


class NotFound(PermanentError):
    """The object (node, VM, pod) does not exist."""


class NotSupported(PermanentError):
    """The backend cannot do this (e.g. writes on a read-only slurmrestd version)."""


class UnknownNode(NotFound):
    """A node name that the inventory (or Slurm) does not know."""
