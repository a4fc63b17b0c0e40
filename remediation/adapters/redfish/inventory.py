"""Where each node's BMC is and what signs in to it: the inventory, a Node annotation, the credentials.

Reads ``redfish.inventory_file`` (node to BMC, system, credentials name; under ``chassis``, an NVLink
domain to its rack's BMC and chassis), ``redfish.node_annotation`` and ``redfish.credentials_file``,
re-read when they change. A wrong entry is its node's (or domain's) :class:`PermanentError`; an
unreadable file or missing credentials name is a :class:`ConfigError`.

Why: docs/clouds.md#bare-metal-redfish-bmcs
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml

from remediation.ports.errors import ConfigError, NotFound, PermanentError, UnknownNode
from remediation.settings import RedfishSettings

SYSTEMS = "/redfish/v1/Systems/"
CHASSIS = "/redfish/v1/Chassis/"
#: The inventory file's key for the racks (domain -> chassis); no node may be named so.
CHASSIS_KEY = "chassis"


@dataclass(frozen=True)
class Bmc:
    """One node's BMC: where it is (no secret in it: it is recorded with the operation)."""

    url: str  # https://host[:port]
    system: str  # /redfish/v1/Systems/ID
    credentials: str  # a name in the credentials file


@dataclass(frozen=True)
class Chassis:
    """An NVLink domain's rack: its BMC and chassis (no secret in it: it is recorded with the reset)."""

    url: str  # https://host[:port]
    chassis: str  # /redfish/v1/Chassis/ID
    credentials: str  # a name in the credentials file


@dataclass(frozen=True)
class Login:
    username: str
    password: str = field(repr=False)


class _Cached:
    """A YAML/JSON mapping file, parsed again only when its size or modification time changes."""

    def __init__(self, path: str, what: str) -> None:
        self.path, self.what = path, what
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._data: dict[str, Any] = {}

    def load(self) -> dict[str, Any]:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
            with self._lock:
                if stamp != self._stamp:
                    with open(self.path, encoding="utf-8") as f:
                        data = yaml.safe_load(f)
                    if not isinstance(data, dict):
                        raise ConfigError(f"{self.what} {self.path} is not a mapping", component="redfish")
                    self._data, self._stamp = data, stamp
                return self._data
        except OSError as exc:
            raise ConfigError(
                f"cannot read {self.what} {self.path}: {exc.strerror}", component="redfish"
            ) from exc
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark is not None else ""
            raise ConfigError(
                f"{self.what} {self.path} is not valid YAML or JSON{where}", component="redfish"
            ) from None


def parse_bmc_url(raw: Any, where: str) -> str:
    """The ``bmc`` of an entry: an https URL of scheme, host and port only; PermanentError naming
    ``where`` otherwise, never echoing a URL that may hold a password."""
    url = str(raw or "").rstrip("/")
    parts = urlsplit(url)
    shown = "" if "@" in url else f", not {url!r}"  # a URL with userinfo may hold a password
    if parts.scheme != "https" or not parts.hostname:
        # Basic authentication sends the password with every request: never over plain http.
        raise PermanentError(f"{where}: bmc must be an https:// URL{shown}")
    if parts.username is not None or parts.password is not None or parts.path or parts.query:
        raise PermanentError(
            f"{where}: bmc is scheme, host and port only (credentials go in redfish.credentials_file)"
        )
    return url


def resource_path(raw: Any, collection: str) -> str | None:
    """An id or a path in ``collection`` (``/redfish/v1/Systems/``) as its path; None when malformed."""
    text = str(raw or "").strip()
    if not text or any(c in text for c in "?#\\ ") or ".." in text:
        return None
    return text if text.startswith(collection) else collection + text.strip("/")


def parse_entry(node: str, raw: Any, source: str) -> Bmc:
    """A node's BMC from its inventory entry or annotation; PermanentError naming what is wrong."""
    if not isinstance(raw, dict):
        raise PermanentError(f"{source} for {node} is not a mapping of bmc, system, credentials")
    url = parse_bmc_url(raw.get("bmc"), f"{source} for {node}")
    if (path := resource_path(raw.get("system"), SYSTEMS)) is None:
        raise PermanentError(f"{source} for {node}: system must name the node's Redfish system, e.g. '1'")
    return Bmc(url, path, str(raw.get("credentials") or "default"))


def parse_chassis(domain: str, raw: Any, source: str) -> Chassis:
    """A domain's rack from its ``chassis`` entry; PermanentError naming what is wrong."""
    where = f"{source} chassis entry for domain {domain}"
    if not isinstance(raw, dict):
        raise PermanentError(f"{where} is not a mapping of bmc, chassis, credentials")
    if unknown := sorted(set(raw) - {"bmc", "chassis", "credentials"}):
        raise PermanentError(f"{where} may name bmc, chassis and credentials only, not {unknown}")
    url = parse_bmc_url(raw.get("bmc"), where)
    if (path := resource_path(raw.get("chassis"), CHASSIS)) is None:
        raise PermanentError(f"{where}: chassis must name the rack's Redfish chassis, e.g. 'Rack1'")
    return Chassis(url, path, str(raw.get("credentials") or "default"))


class Inventory:
    """Finds a node's BMC (inventory file, then Node annotation) and a BMC's login."""

    def __init__(
        self, settings: RedfishSettings, annotations: Callable[[str], Mapping[str, str]] | None = None
    ) -> None:
        self.s = settings
        self._nodes = (
            _Cached(settings.inventory_file, "redfish inventory") if settings.inventory_file else None
        )
        self._logins = (
            _Cached(settings.credentials_file, "redfish credentials file")
            if settings.credentials_file
            else None
        )
        self._annotations = annotations

    def lists(self, node: str) -> bool:
        """Whether the inventory file lists ``node`` (the ``auto`` router sends such nodes here)."""
        return node != CHASSIS_KEY and self._nodes is not None and node in self._nodes.load()

    def bmc(self, node: str) -> Bmc:
        if node != CHASSIS_KEY and self._nodes is not None and node in (listed := self._nodes.load()):
            return parse_entry(node, listed[node], f"redfish inventory {self.s.inventory_file}")
        if self._annotations is not None and self.s.node_annotation:
            value = self._annotations(node).get(self.s.node_annotation)
            if value is not None:
                return self._annotated(node, value)
        raise UnknownNode(
            f"no BMC known for {node}: not in redfish.inventory_file"
            + (f" nor annotated {self.s.node_annotation}" if self.s.node_annotation else "")
        )

    def _annotated(self, node: str, value: str) -> Bmc:
        """A node's system from its Node annotation, on a BMC the inventory lists, signing in with the
        inventory's credentials for that BMC. The Node is written by its own kubelet: root on the node
        may write anything there, so the annotation names a system, never where the password goes."""
        where = f"annotation {self.s.node_annotation} on Node {node}"
        try:
            raw = json.loads(value)
        except ValueError:
            raise PermanentError(f"{where} is not JSON") from None
        if isinstance(raw, dict) and set(raw) - {"bmc", "system"}:
            raise PermanentError(f"{where} may name bmc and system only, not {sorted(set(raw) - {'bmc', 'system'})}")
        picked = parse_entry(node, raw, where)
        listed = self._listed()
        on_host = {b.credentials for b in listed if b.url == picked.url}
        if not on_host:
            raise PermanentError(f"{where} names a BMC the redfish inventory does not list; refused")
        if len(on_host) > 1:
            raise PermanentError(f"{where}: the inventory signs in to that BMC with several credentials")
        if any(b.url == picked.url and b.system == picked.system for b in listed):
            raise PermanentError(f"{where} names a system the inventory gives another node; refused")
        return Bmc(picked.url, picked.system, on_host.pop())

    def _listed(self) -> list[Bmc]:
        """Every well-formed entry of the inventory file (a broken one is its own node's error)."""
        out = []
        for name, entry in (self._nodes.load() if self._nodes is not None else {}).items():
            if name == CHASSIS_KEY:
                continue
            try:
                out.append(parse_entry(str(name), entry, "inventory"))
            except PermanentError:
                continue
        return out

    def chassis_for(self, domain: str) -> Chassis:
        """The rack of NVLink domain ``domain`` (a Slurm block name or a clique id), from the
        inventory's ``chassis`` mapping; NotFound when it lists none for it."""
        racks = self._nodes.load().get(CHASSIS_KEY) if self._nodes is not None else None
        source = f"redfish inventory {self.s.inventory_file}"
        if racks is not None and not isinstance(racks, dict):
            raise PermanentError(f"{source}: {CHASSIS_KEY} is not a mapping of domain to chassis")
        if not racks or domain not in racks:
            raise NotFound(f"no chassis known for domain {domain}: not under {CHASSIS_KEY} in redfish.inventory_file")
        return parse_chassis(domain, racks[domain], source)

    def login(self, bmc: Bmc | Chassis) -> Login:
        if self._logins is None:
            raise ConfigError(
                "redfish.credentials_file is not set: a Redfish reset needs a login", component="redfish"
            )
        entry = self._logins.load().get(bmc.credentials)
        if not isinstance(entry, dict) or not entry.get("username") or not entry.get("password"):
            raise ConfigError(
                f"redfish credentials file {self.s.credentials_file} has no username and "
                f"password for {bmc.credentials!r}",
                component="redfish",
            )
        return Login(str(entry["username"]), str(entry["password"]))
