"""The ``redfish`` VM provider: power actions on bare-metal nodes through their BMCs (DMTF Redfish).

``start`` reads the system, records the reset's intent on the step row, then sends one POST, chosen from
the ResetType values offered. ``poll`` records each power state seen; done once the system left On and
came On again, or after ``redfish.unobserved_after_s``.

Why: docs/clouds.md#bare-metal-redfish-bmcs
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from remediation.adapters.redfish.client import BmcSession, MaybeSent
from remediation.adapters.redfish.inventory import Bmc, Inventory
from remediation.ports.cluster import HardwareIdentity, Operation, OperationStatus, VMAction, VMRef
from remediation.ports.errors import NotSupported, PermanentError, RemediationError, TransientError
from remediation.ports.intents import Intents
from remediation.settings import RedfishSettings

log = logging.getLogger(__name__)

ON = "On"
_SEEN_MAX = 20


def plan_reset(action: VMAction, allowed: set[str], state: str) -> tuple[str, str | None]:
    """The reset to send for ``action`` and, for the ForceOff fallback, the one to send once the
    system is Off."""
    on = next((t for t in (ON, "ForceOn") if t in allowed), None)
    if state == "Off":
        if on is None:
            raise NotSupported(f"the system is Off and offers no On among {sorted(allowed)}")
        return on, None
    if action == VMAction.RESTART:
        order: tuple[tuple[str, str | None], ...] = (("GracefulRestart", None), ("ForceRestart", None))
    elif action == VMAction.STOP_START:
        order = (("PowerCycle", None), ("ForceOff", on), ("ForceRestart", None))
    else:
        raise NotSupported(f"a BMC has no {action}: configure workflow.ladder with restart and stop_start")
    for reset, then in order:
        if reset in allowed and (reset != "ForceOff" or then is not None):
            return reset, then
    raise NotSupported(
        f"the system offers none of {[r for r, _ in order]} for {action} (it offers {sorted(allowed)})"
    )


class RedfishProvider:
    """:class:`remediation.ports.cluster.MachineProvider` (and ``MachinesByNode``) for bare metal."""

    def __init__(self, settings: RedfishSettings, inventory: Inventory, intents: Intents) -> None:
        self.s, self.inventory, self.intents = settings, inventory, intents

    def machine_of(self, node: str, k8s_node: str | None = None) -> VMRef:
        name = k8s_node or node  # the inventory lists a node by its Kubernetes Node's name, if it has one
        bmc = self.inventory.bmc(name)
        return VMRef("redfish", name, provider_id=f"{bmc.url}{bmc.system}")

    def lists(self, node: str) -> bool:
        return self.inventory.lists(node)

    def identify(self, vm: VMRef) -> HardwareIdentity:
        """The ComputerSystem's ``UUID``, ``SerialNumber`` and ``Model``, where the BMC reports them."""
        _mine(vm)
        with self.session(self.inventory.bmc(vm.name)) as session:
            system = session.system()
        return HardwareIdentity("redfish", bmc_uuid=_text(system.get("UUID")),
                                bmc_serial=_text(system.get("SerialNumber")), sku=_text(system.get("Model")))

    def session(self, bmc: Bmc) -> BmcSession:
        return BmcSession(bmc, self.inventory.login(bmc), self.s)

    def plan(self, vm: VMRef, action: VMAction, session: BmcSession | None = None) -> Operation:
        """The operation ``start`` would begin, from one read of the system; sends nothing."""
        _mine(vm)
        if session is None:
            bmc = self.inventory.bmc(vm.name)
            with self.session(bmc) as own:
                return self.plan(vm, action, own)
        state = str(session.system().get("PowerState") or "Unknown")
        if state.startswith("Powering"):
            raise TransientError(f"{session.where} is {state}: another power action is under way")
        reset, then = plan_reset(action, session.allowed_resets(), state)
        bmc = session.bmc
        data: dict[str, Any] = {
            "bmc": bmc.url,
            "system": bmc.system,
            "credentials": bmc.credentials,
            "reset": reset,
            "then": then,
            "before": state,
            "phase": "requested",
            "requested_at": time.time(),
            "seen": [],
        }
        return Operation("redfish", f"{reset}@{bmc.url}{bmc.system}", action, vm, data)

    def start(self, vm: VMRef, action: VMAction, idempotency_key: str) -> Operation:
        _mine(vm)
        if (known := self.intents.recorded(idempotency_key)) is not None:
            log.info(
                "redfish: %s already requested for %s (%s); not sent again",
                known.get("ref"),
                vm.name,
                idempotency_key,
            )
            return Operation.from_dict(known)
        with self.session(self.inventory.bmc(vm.name)) as session:
            op = self.plan(vm, action, session)
            if (first := self.intents.claim(idempotency_key, op.to_dict())) is not None:
                return Operation.from_dict(first)  # another worker recorded it between our two reads
            reset = op.data["reset"]
            try:
                session.reset(reset)
            except MaybeSent as exc:
                log.warning(
                    "redfish: %s to %s unanswered (%s); taken as sent, never sent again",
                    reset,
                    session.where,
                    exc,
                )
                op = _with(op, unanswered=str(exc))
            except RemediationError:
                self.intents.release(idempotency_key, op.to_dict())  # refused or never reached: nothing done
                raise
            else:
                op = _with(op, phase="sent")
                log.info("redfish: %s sent to %s for %s", reset, session.where, vm.name)
        self.intents.settle(idempotency_key, op.to_dict())
        return op

    def poll(self, op: Operation) -> OperationStatus:
        d = op.data
        if d.get("evidence"):
            return OperationStatus(done=True)  # the stored operation already shows it: the step may move on
        with self.session(Bmc(d["bmc"], d["system"], d["credentials"])) as session:
            state = str(session.system().get("PowerState") or "Unknown")
            after = round(time.time() - float(d["requested_at"]), 1)
            seen = [list(s) for s in d.get("seen") or []]
            if not seen or seen[-1][0] != state:
                seen = (seen + [[state, after]])[-_SEEN_MAX:]
            new = _with(op, seen=seen)
            if d.get("then") and d["phase"] != "then-sent" and state == "Off":
                # The fallback's second half. On is safe to repeat: it powers on a system that is off.
                try:
                    session.reset(d["then"])
                except MaybeSent:
                    pass
                log.info("redfish: %s seen Off; %s sent to %s", d["reset"], d["then"], session.where)
                return OperationStatus(done=False, replace=_with(new, phase="then-sent"))
        left_on = d["before"] != ON or any(s != ON for s, _ in seen)
        if state == ON and left_on:
            return OperationStatus(
                done=False,
                replace=_with(new, evidence="left On, then On again" if d["before"] == ON else "On again"),
            )
        midway = bool(d.get("then")) and d["phase"] != "then-sent"
        if midway and after > self.s.unobserved_after_s:
            return OperationStatus(
                done=True,
                error=f"{d['reset']} requested {after:.0f}s ago, and the system never went Off "
                f"(it is {state}; {session.where})",
            )
        if state == ON and after > self.s.unobserved_after_s:
            return OperationStatus(done=False, replace=_with(new, evidence="unobserved"))
        # Midway: the ForceOff is sent and the On is not; the step waits for it past its timeout.
        return OperationStatus(done=False, replace=new if new.data != d else None, midway=midway)


def _text(value: object) -> str | None:
    return str(value).strip() or None if value is not None else None


def _mine(vm: VMRef) -> None:
    if vm.provider != "redfish":
        raise PermanentError(f"the redfish provider cannot act on a {vm.provider} VM ({vm.provider_id})")


def _with(op: Operation, **data: Any) -> Operation:
    return replace(op, data={**op.data, **data})
