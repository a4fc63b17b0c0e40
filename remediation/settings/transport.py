"""Where a credential may travel in clear: the one test of a URL's host that every setting (and the
CLI's ``--server``) uses before it lets a token ride over plain ``http://``.

Only this machine's loopback qualifies (``localhost``, 127.0.0.0/8, ``::1``): anything else crosses
a network where anyone on the path reads the token (docs/running.md, "slurmrestd tokens")."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses; ``0.0.0.0`` and every name but localhost are not."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def clear_to_remote(url: str) -> str | None:
    """The host a plain-``http://`` ``url`` would carry a credential to in clear, or None when it is
    safe: another scheme (https, a unix socket) or a loopback host."""
    parts = urlsplit(url.strip())
    if parts.scheme.lower() != "http":
        return None
    host = (parts.hostname or "").lower()
    return None if host and is_loopback(host) else (host or "the server")
