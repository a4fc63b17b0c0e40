"""The ``redfish`` machine backend: BMC power actions for bare-metal nodes, through sushy.

``inventory`` finds a node's BMC and login, ``client`` talks to one BMC and maps its errors,
``provider`` is the VM provider the workflow drives (which rung sends which reset, the intent it
records before sending, the evidence it waits for), ``rack`` the rack power of an NVLink domain, and
``noop`` their dry-run twins. :func:`make_redfish` and :func:`make_rack_power` build them from the
settings, for :mod:`remediation.adapters.factory`.

Why: docs/clouds.md#bare-metal-redfish-bmcs
"""

from __future__ import annotations

from collections.abc import Mapping

from remediation.adapters.redfish.inventory import Inventory
from remediation.adapters.redfish.provider import RedfishProvider
from remediation.adapters.redfish.rack import RedfishRackPower
from remediation.ports.errors import ConfigError
from remediation.ports.intents import Intents
from remediation.settings import Settings


def make_redfish(settings: Settings, intents: Intents | None) -> RedfishProvider:
    """The provider, with its inventory (and the Node annotations when configured) and where it records
    its intents (the entry point's :class:`remediation.db.intents.StepIntents`). Settings it cannot work
    with fail here, at start-up."""
    r = settings.redfish
    missing = [] if r.credentials_file else ["redfish.credentials_file"]
    if not (r.inventory_file or r.node_annotation):
        missing.append("redfish.inventory_file or redfish.node_annotation")
    if missing:
        raise ConfigError(f"vm.backend=redfish needs {' and '.join(missing)}", component="redfish")
    annotations = None
    if r.node_annotation:
        if settings.kube.backend != "kubernetes":
            raise ConfigError(
                "redfish.node_annotation reads Kubernetes Nodes: it needs kube.backend "
                f"kubernetes, not {settings.kube.backend}",
                component="redfish",
            )
        from remediation.adapters.kube.client import api_errors, kube_client

        api, timeout = kube_client(settings.kube), settings.kube.request_timeout_s

        def read(node: str) -> Mapping[str, str]:
            with api_errors(f"read Node {node}"):
                meta = api.read_node(node, _request_timeout=timeout).metadata
                return (meta.annotations if meta else None) or {}

        annotations = read
    if intents is None:
        raise ConfigError(
            "vm.backend=redfish records each reset on its step row before sending it: the "
            "process must build its adapters with the database's intents",
            component="redfish",
        )
    return RedfishProvider(r, Inventory(r, annotations), intents)


def make_rack_power(settings: Settings, intents: Intents | None) -> RedfishRackPower:
    """The rack power of the NVLink domains the inventory's ``chassis`` lists, recording each reset
    in ``intents`` (the step rows) before it is sent. Settings it cannot work with fail here."""
    r = settings.redfish
    missing = [name for name, value in (("redfish.inventory_file", r.inventory_file),
                                        ("redfish.credentials_file", r.credentials_file)) if not value]
    if missing:
        raise ConfigError(f"the rack power cycle needs {' and '.join(missing)}", component="redfish")
    if intents is None:
        raise ConfigError(
            "the rack power cycle records each reset on its step row before sending it: the process "
            "must build its adapters with the database's intents",
            component="redfish",
        )
    return RedfishRackPower(r, Inventory(r), intents)
