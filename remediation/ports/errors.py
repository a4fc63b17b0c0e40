"""The few error types that decide what the workflow does next, and the one table that picks them.

Adapters translate every SDK or command error at their boundary into one of these, keeping the
provider's message. Each has a scope: ``transient`` (:class:`TransientError`, retry with backoff),
``node`` (:class:`PermanentError` and its kin, the node escalates) or ``system``
(:class:`SystemicError`, automation pauses). The tables here are the only map from HTTP statuses and
Slurm messages to scopes.

Why: docs/architecture.md#every-error-has-a-scope-the-nodes-the-systems-or-nobody-knows
"""

from __future__ import annotations

from enum import StrEnum


class Scope(StrEnum):
    TRANSIENT = "transient"
    NODE = "node"
    SYSTEM = "system"


class RemediationError(Exception):
    """Base of the errors adapters may raise."""

    scope: Scope = Scope.NODE

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    @property
    def kind(self) -> str:
        return type(self).__name__


class TransientError(RemediationError):
    """Worth retrying; ``retry_after`` (seconds) is the server's own hint when it gave one."""

    scope = Scope.TRANSIENT

    def __init__(self, message: str, *, retry_after: float | None = None, status: int | None = None) -> None:
        super().__init__(message, status=status)
        self.retry_after = retry_after


class PermanentError(RemediationError):
    """Retrying will not help, and the error concerns this node; the workflow escalates it."""


class NotFound(PermanentError):
    """The object (node, VM, pod) does not exist."""


class UnknownNode(NotFound):
    """A node name that the inventory (or Slurm) does not know."""


class SystemicError(RemediationError):
    """Our plumbing is broken, not the node: pause automation, page, hold the node against nothing.

    ``self_healing`` says whether a health probe may resume automation once the dependency answers
    again (an unreachable controller comes back by itself; an expired credential needs a human)."""

    scope = Scope.SYSTEM
    self_healing = False
    #: The dependency to probe before resuming: "slurm", "kubernetes" or "cloud".
    component = ""

    def __init__(self, message: str, *, status: int | None = None, component: str = "") -> None:
        super().__init__(message, status=status)
        if component:
            self.component = component


class CredentialError(SystemicError):
    """401/403: the service's identity is not (or no longer) allowed; retrying cannot grant a role."""


class QuotaError(SystemicError):
    """A project, subscription or account quota is exhausted: every node would hit it."""


class ConfigError(SystemicError):
    """The service is configured for something its backend cannot do (a missing binary, a read-only
    API version, an action a cloud does not offer), found while acting. Settings that do not load at
    all are :class:`remediation.settings.SettingsError`, raised at start-up."""


class NotSupported(ConfigError):
    """The backend cannot do this (e.g. writes on a read-only slurmrestd version, reimage on GCE)."""


class ControllerUnreachable(SystemicError):
    """slurmctld (or its authentication, munge) cannot be reached. It comes back by itself, so a
    health probe may resume automation."""

    self_healing = True
    component = "slurm"


# ------------------------------------------------------------------------------- the one HTTP table

#: Statuses worth retrying: a timeout, a conflict with an operation in progress (ends by itself),
#: "gone" for an expired Kubernetes list or watch position (a fresh read fixes it), too early,
#: throttling, and every server error.
TRANSIENT_STATUSES = frozenset({408, 409, 410, 425, 429})
_QUOTA_MARKERS = ("quota", "limitexceeded", "limit exceeded", "rate limit exceeded for project")


def error_for_status(
    status: int | None,
    message: str,
    *,
    retry_after: float | None = None,
    not_found: type[NotFound] = NotFound,
    component: str = "",
) -> RemediationError:
    """The typed error for an HTTP answer (``status`` None: no answer at all), for every adapter.

    ==========================  ==================================================================
    no answer, 408, 409, 410,   :class:`TransientError` with the server's Retry-After
    425, 429, 5xx
    401                         :class:`CredentialError` (system): the credential is missing/expired
    403 mentioning a quota      :class:`QuotaError` (system)
    403                         :class:`CredentialError` (system): the role lacks a permission
    404                         ``not_found`` (node): the VM, Node or Slurm node does not exist
    other 4xx                   :class:`PermanentError` (node): this node's request is refused
    ==========================  ==================================================================
    """
    if status is None or status in TRANSIENT_STATUSES or status >= 500:
        return TransientError(message, retry_after=retry_after, status=status)
    lowered = message.lower()
    if status == 401:
        return CredentialError(f"not authenticated: {message}", status=status, component=component)
    if status == 403 and any(marker in lowered for marker in _QUOTA_MARKERS):
        return QuotaError(f"quota exhausted: {message}", status=status, component=component)
    if status == 403:
        return CredentialError(f"permission denied: {message}", status=status, component=component)
    if status == 404:
        return not_found(message, status=status)
    return PermanentError(message, status=status)


# ------------------------------------------------------------------------------ the one Slurm table

#: Messages from scontrol/sinfo/squeue/scancel (or slurmrestd's ``errors[]``) meaning the controller
#: cannot be reached or cannot authenticate us: the system's fault, never the node's.
SLURM_UNREACHABLE = (
    "unable to contact slurm controller",
    "connection refused",
    "socket timed out",
    "zero bytes were transmitted",
    "communication connection failure",
    "slurm backup controller in standby mode",
    "unspecified error",  # what sinfo --json (22.05) reports for an unreachable controller
    "munge",  # munged down or its key changed: nothing authenticates
    "authentication failure",
    "invalid authentication credential",
)
#: Messages meaning we are not allowed to do this: a configuration fault (SlurmUser / operator role).
SLURM_DENIED = ("access/permission denied", "permission denied", "user not authorized", "invalid user id")
#: Messages meaning the Slurm client and controller cannot work together, or the cluster lacks what we
#: asked of it (``scontrol reboot`` with no RebootProgram): a configuration fault. Checked before the
#: unreachable markers, because scontrol follows its own reason with "Unspecified error".
SLURM_MISCONFIGURED = ("incompatible versions of client and server code", "protocol version",
                       "rebootprogram isn't defined")
SLURM_TRANSIENT = ("resource temporarily unavailable",)
SLURM_UNKNOWN_NODE = ("invalid node name", "not found")


def error_for_slurm(message: str, *, node_error: type[RemediationError] = PermanentError) -> RemediationError:
    """The typed error for a failed Slurm command or a slurmrestd ``errors[]`` entry."""
    lowered = message.lower()
    if any(marker in lowered for marker in SLURM_MISCONFIGURED):
        return ConfigError(f"Slurm is misconfigured for this: {message}", component="slurm")
    if any(marker in lowered for marker in SLURM_UNREACHABLE):
        return ControllerUnreachable(f"slurmctld unreachable: {message}")
    if any(marker in lowered for marker in SLURM_DENIED):
        return CredentialError(f"Slurm refused the service's user: {message}", component="slurm")
    if any(marker in lowered for marker in SLURM_TRANSIENT):
        return TransientError(message)
    if any(marker in lowered for marker in SLURM_UNKNOWN_NODE):
        return UnknownNode(message)
    return node_error(message)
