"""One conversation with one BMC through sushy, and the translation of what goes wrong into typed errors.

A :class:`BmcSession` is opened per call, signs in with basic auth, sends one attempt per request and
always verifies TLS. A reset target must be a path on that BMC (:func:`on_this_bmc`); :func:`never_sent`
tells whether a failed POST may have reached it. Errors map through the one HTTP table; the password is
cut from every message.

Why: docs/clouds.md#redfish-sessions-and-retries
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import requests
import sushy
import urllib3
from sushy import auth as sushy_auth
from sushy import exceptions as sushy_exc
from sushy.connector import Connector

from remediation.adapters.redfish.inventory import Bmc, Login
from remediation.ports.errors import (
    ConfigError,
    NotFound,
    PermanentError,
    RemediationError,
    TransientError,
    error_for_status,
)
from remediation.settings import RedfishSettings

log = logging.getLogger(__name__)

RESET = "#ComputerSystem.Reset"


class MaybeSent(Exception):
    """A reset POST that failed after it may have reached the BMC (a read timeout, a connection
    dropped after sending): it must be taken as sent, and never sent again."""


class BmcSession:
    """A signed-in client of one BMC's system; a context manager that closes its connection."""

    def __init__(self, bmc: Bmc, login: Login, settings: RedfishSettings, *, resource: str | None = None) -> None:
        """A session of ``bmc``'s system, or of another ``resource`` on the same BMC (a chassis)."""
        self.bmc, self._login, self._resource = bmc, login, resource
        self._trust = (
            f"redfish.ca_file ({settings.ca_file})" if settings.ca_file else "the system trust store"
        )
        self._conn = Connector(
            bmc.url,
            verify=settings.ca_file or True,
            server_side_retries=1,
            server_side_retries_delay=0,
            default_request_timeout=settings.request_timeout_s,
            connect_timeout=settings.connect_timeout_s,
        )
        self._root: Any = None
        self._system: Any = None

    def __enter__(self) -> BmcSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.close()

    @property
    def where(self) -> str:
        return f"BMC {self.bmc.url} " + (self._resource or f"system {self.bmc.system}")

    def _signed_in(self) -> Any:
        if self._root is None:
            login = sushy_auth.BasicAuth(self._login.username, self._login.password)
            self._root = sushy.Sushy(self.bmc.url, auth=login, connector=self._conn)
        return self._root

    def system(self) -> dict[str, Any]:
        """The ComputerSystem resource as the BMC answers it (read once per session)."""
        if self._system is None:
            try:
                self._system = self._signed_in().get_system(self.bmc.system)
            except Exception as exc:
                raise self._translate(exc, "read") from None
        return dict(self._system.json)

    def read(self, link: str) -> dict[str, Any]:
        """Any resource of this BMC, at a path of the inventory's or a link in the BMC's own JSON."""
        if (path := on_this_bmc(link, self.bmc.url)) is None:
            raise PermanentError(f"{self.where}: the link {link!r} is not a path on the BMC; refused")
        try:
            self._signed_in()
            data = self._conn.get(path, server_side_retries_left=0).json()
        except ValueError:
            raise PermanentError(f"{self.where}: {path} answered no JSON") from None
        except Exception as exc:
            raise self._translate(exc, f"read {path} on") from None
        if not isinstance(data, dict):
            raise PermanentError(f"{self.where}: {path} answered JSON that is no object")
        return data

    def allowed_resets(self) -> set[str]:
        """The ResetType values the system offers (every standard one when it does not say)."""
        return allowed_resets(self.system(), RESET)

    def reset(self, reset_type: str) -> None:
        """POST one ComputerSystem.Reset, with no retry of any kind (see the module docstring). Raises
        :class:`MaybeSent` when it failed in a way that may have reached the BMC, a typed error when
        the BMC answered with an error or was never reached (nothing was done)."""
        self.post_action(self.system(), RESET, reset_type)

    def action_target(self, resource: dict[str, Any], action: str) -> str:
        """The path ``resource`` (its JSON) advertises for ``action``; PermanentError when it advertises
        none or names another host."""
        target = ((resource.get("Actions") or {}).get(action) or {}).get("target")
        named = resource.get("@odata.id") or self.where
        if not target:
            raise PermanentError(f"{self.where}: {named} offers no {action} action")
        if (path := on_this_bmc(str(target), self.bmc.url)) is None:
            # The BMC's own JSON names where to POST: a URL on another host would take the login there.
            raise PermanentError(f"{self.where}: the {action} target of {named} is not a path on the BMC; refused")
        return path

    def post_action(self, resource: dict[str, Any], action: str, reset_type: str) -> str:
        """POST one reset to the target ``resource`` advertises for ``action``, with no retry; the path
        posted to. :class:`MaybeSent` or a typed error as :meth:`reset`."""
        return self.post_reset(self.action_target(resource, action), reset_type)

    def post_reset(self, target: str, reset_type: str) -> str:
        """POST one reset to ``target``, a path :meth:`action_target` gave, with no retry."""
        try:
            self._conn.post(target, data={"ResetType": reset_type}, server_side_retries_left=0)
        except sushy_exc.ConnectionError as exc:
            if not never_sent(exc):
                raise MaybeSent(self._redact(_reason(exc.__context__ or exc))) from None
            raise self._translate(exc, f"send {reset_type} to") from None
        except Exception as exc:
            raise self._translate(exc, f"send {reset_type} to") from None
        return target

    def _translate(self, exc: Exception, doing: str) -> RemediationError:
        if isinstance(exc, RemediationError):
            return exc
        return translate(exc, f"cannot {doing} {self.where}", self._trust, redact=self._redact)

    def _redact(self, text: str) -> str:
        return text.replace(self._login.password, "***") if self._login.password else text


def translate(exc: Exception, what: str, trust: str, *, redact: Callable[[str], str]) -> RemediationError:
    """The typed error for a sushy failure; ``what`` says what was being done where, ``trust`` what the
    BMC's certificate was checked against."""
    if isinstance(exc, sushy_exc.ResourceNotFoundError):
        return NotFound(f"{what}: HTTP 404 (the BMC has no such resource)", status=404)
    if isinstance(exc, sushy_exc.HTTPError):
        detail = redact(f"{exc.code}: {exc.detail or 'no detail'}")
        return error_for_status(
            exc.status_code, f"{what}: HTTP {exc.status_code} {detail}", component="redfish"
        )
    if isinstance(exc, sushy_exc.ConnectionError):
        cause = exc.__context__
        if isinstance(cause, requests.exceptions.SSLError):
            return ConfigError(
                f"{what}: its TLS certificate does not verify against {trust} "
                f"({_reason(cause)}); verification is never skipped",
                component="redfish",
            )
        return TransientError(f"{what}: no answer ({redact(_reason(cause or exc))})")
    return PermanentError(f"{what}: {type(exc).__name__}: {redact(str(exc))}")


def allowed_resets(resource: dict[str, Any], action: str) -> set[str]:
    """The ResetType values ``resource`` offers for ``action`` (every standard one when it does not say:
    the schema makes the list optional)."""
    offered = ((resource.get("Actions") or {}).get(action) or {}).get("ResetType@Redfish.AllowableValues")
    return {str(v) for v in (offered or [v.value for v in sushy.ResetType])}


def on_this_bmc(target: str, bmc_url: str) -> str | None:
    """``target`` (a link from the BMC's JSON) as a path on the BMC at ``bmc_url``; None when it names
    another scheme, host or port, or is no absolute path."""
    parts, own = urlsplit(target), urlsplit(bmc_url)
    try:
        if (parts.scheme or parts.netloc) and (parts.scheme, parts.hostname, parts.port or 443) != (
            own.scheme, own.hostname, own.port or 443):
            return None
    except ValueError:  # a port that is no number
        return None
    if not parts.path.startswith("/") or parts.path.startswith("//"):
        return None
    return parts.path + (f"?{parts.query}" if parts.query else "")


def never_sent(exc: BaseException) -> bool:
    """Whether a failed request certainly never reached the BMC: the connection was refused, timed out
    while connecting, or failed its TLS handshake. Anything else (a read timeout, a connection dropped
    after sending) may have been received and acted on."""
    cause = exc.__context__
    if isinstance(cause, requests.exceptions.ConnectTimeout | requests.exceptions.SSLError):
        return True
    if isinstance(cause, requests.exceptions.ConnectionError) and cause.args:
        return isinstance(getattr(cause.args[0], "reason", None), urllib3.exceptions.NewConnectionError)
    return False


def _reason(exc: BaseException) -> str:
    """The innermost reason urllib3 gives (its wrappers repeat the URL and 'Max retries exceeded')."""
    if isinstance(exc, requests.exceptions.RequestException) and exc.args:
        inner = exc.args[0]
        return str(getattr(inner, "reason", None) or inner)[:300]
    return str(exc)[:300]
