"""The ``redfish`` rack power: power-cycling an NVLink domain's rack through its BMC's ``Chassis``.

``plan`` reads the chassis and picks the resets from what it advertises: its own ``#Chassis.Reset``, else
each system it links, by its ``#ComputerSystem.Reset``. ``reset`` records that plan on the step row,
then sends each POST once. ``poll`` records the power states seen, sends the On of a ForceOff fallback,
and ends with the evidence, or after ``redfish.unobserved_after_s``.

Why: docs/clouds.md#racks-the-chassis-reset
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from remediation.adapters.redfish.client import RESET, BmcSession, MaybeSent, allowed_resets
from remediation.adapters.redfish.inventory import Bmc, Chassis, Inventory
from remediation.adapters.redfish.provider import ON, plan_reset
from remediation.ports.cluster import VMAction
from remediation.ports.errors import NotFound, PermanentError, RemediationError, TransientError
from remediation.ports.intents import Intents
from remediation.ports.rack import RackPhase, RackPowerState, RackReset, ResetTarget, ResetVia
from remediation.settings import RedfishSettings

log = logging.getLogger(__name__)

CHASSIS_RESET = "#Chassis.Reset"
_SEEN_MAX = 20


def power_of(resource: dict[str, Any], where: str) -> str:
    """The resource's PowerState; TransientError while another power action is under way."""
    state = str(resource.get("PowerState") or "Unknown")
    if state.startswith("Powering"):
        raise TransientError(f"{where} is {state}: another power action is under way")
    return state


def plan_target(resource: dict[str, Any], path: str, action: str, *, allowed: set[str], where: str) -> ResetTarget:
    """The reset a power cycle sends ``resource`` (its JSON; ``path`` its link), of the ResetType values
    ``allowed``: PowerCycle, else ForceOff then On, else ForceRestart; On where it is Off. ``target``
    is left to the session, which checks it is on the BMC."""
    before = power_of(resource, where)
    reset, then = plan_reset(VMAction.STOP_START, allowed, before)
    return ResetTarget(resource=path, action=action, target="", reset=reset, before=before, then=then)


def action_info_link(resource: dict[str, Any], action: str) -> str | None:
    """Where the action lists its ResetType values (``@Redfish.ActionInfo``), when it does not list
    them inline (OpenBMC's chassis do this)."""
    act = (resource.get("Actions") or {}).get(action) or {}
    if act.get("ResetType@Redfish.AllowableValues") or not act.get("@Redfish.ActionInfo"):
        return None
    return str(act["@Redfish.ActionInfo"])


def action_info_resets(info: dict[str, Any]) -> set[str] | None:
    """The ResetType values an ActionInfo resource allows (None: it does not say)."""
    for param in info.get("Parameters") or []:
        if isinstance(param, dict) and param.get("Name") == "ResetType" and param.get("AllowableValues"):
            return {str(v) for v in param["AllowableValues"]}
    return None


def system_links(chassis: dict[str, Any]) -> list[str]:
    """The systems the chassis links (``Links.ComputerSystems``), in its order."""
    links = (chassis.get("Links") or {}).get("ComputerSystems") or []
    return [str(link["@odata.id"]) for link in links if isinstance(link, dict) and link.get("@odata.id")]


def offers_chassis_reset(chassis: dict[str, Any]) -> bool:
    return bool(((chassis.get("Actions") or {}).get(CHASSIS_RESET) or {}).get("target"))


class RedfishRackPower:
    """:class:`remediation.ports.rack.RackPower` through the rack's BMC."""

    def __init__(self, settings: RedfishSettings, inventory: Inventory, intents: Intents, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.s, self.inventory, self.intents, self.clock = settings, inventory, intents, clock

    def knows(self, domain: str) -> bool:
        try:
            self.inventory.chassis_for(domain)
        except NotFound:
            return False
        return True

    def session(self, rack: Chassis) -> BmcSession:
        bmc = Bmc(rack.url, rack.chassis, rack.credentials)
        return BmcSession(bmc, self.inventory.login(rack), self.s, resource=f"chassis {rack.chassis}")

    def plan(self, domain: str, session: BmcSession | None = None) -> RackReset:
        """The power cycle ``reset`` would send, from one read of the chassis (and of its systems
        where it offers no reset of its own); sends nothing."""
        rack = self.inventory.chassis_for(domain)
        if session is None:
            with self.session(rack) as own:
                return self.plan(domain, own)
        chassis = session.read(rack.chassis)
        if offers_chassis_reset(chassis):
            via, targets = ResetVia.CHASSIS, [self._target(session, chassis, rack.chassis, action=CHASSIS_RESET)]
        else:
            links = system_links(chassis)
            if not links:
                raise PermanentError(f"{session.where} offers no {CHASSIS_RESET} and links no "
                                     "ComputerSystems: nothing to power-cycle")
            via = ResetVia.SYSTEMS
            targets = [self._target(session, session.read(link), link, action=RESET) for link in links]
        return RackReset(domain=domain, bmc=rack.url, chassis=rack.chassis, credentials=rack.credentials,
                         via=via, targets=tuple(targets), requested_at=self.clock())

    @staticmethod
    def _target(session: BmcSession, resource: dict[str, Any], path: str, *, action: str) -> ResetTarget:
        target = session.action_target(resource, action)  # advertised, on this BMC: or refused here
        allowed = None
        if (link := action_info_link(resource, action)) is not None:
            allowed = action_info_resets(session.read(link))
        planned = plan_target(resource, path, action, allowed=allowed or allowed_resets(resource, action),
                              where=f"{session.where}: {path}")
        return planned.with_(target=target)

    def reset(self, domain: str, key: str) -> RackReset:
        if (known := self.intents.recorded(key)) is not None:
            log.info("redfish: rack of %s already power-cycled (%s); not sent again", domain, key)
            return RackReset.from_dict(known)
        with self.session(self.inventory.chassis_for(domain)) as session:
            planned = self.plan(domain, session)
            if (first := self.intents.claim(key, planned.to_dict())) is not None:
                return RackReset.from_dict(first)  # another worker recorded it between our two reads
            record, failed = self._send(session, planned)
        if failed is not None and not any(t.sent for t in record.targets):
            self.intents.release(key, planned.to_dict())  # refused or never reached: nothing done
            raise failed
        self.intents.settle(key, record.to_dict())
        if failed is not None:
            raise failed  # what was sent stays recorded, ended with the error: never sent again
        return record

    def _send(self, session: BmcSession, planned: RackReset) -> tuple[RackReset, RemediationError | None]:
        """Each planned POST once, in order, stopping at the first refusal: the record of what was sent,
        and the refusal."""
        record = planned
        for i, target in enumerate(planned.targets):
            try:
                session.post_reset(target.target, target.reset)
            except MaybeSent as exc:
                log.warning("redfish: %s to %s unanswered (%s); taken as sent", target.reset, target.resource, exc)
                record = record.with_(phase=RackPhase.UNANSWERED, detail=str(exc))
            except RemediationError as exc:
                return record.with_(error=f"{target.reset} to {target.resource} failed after {i} of "
                                    f"{len(planned.targets)} resets were sent: {exc}"), exc
            record = record.with_(targets=tuple(t.with_(sent=True) if j == i else t
                                                for j, t in enumerate(record.targets)))
            log.info("redfish: %s sent to %s for domain %s", target.reset, target.resource, planned.domain)
        return (record if record.phase == RackPhase.UNANSWERED else record.with_(phase=RackPhase.SENT)), None

    def poll(self, reset: RackReset) -> RackReset:
        if reset.done:
            return reset
        after = round(self.clock() - reset.requested_at, 1)
        rack = Chassis(reset.bmc, reset.chassis, reset.credentials)
        with self.session(rack) as session:
            targets = tuple(self._observe(session, t, after) for t in reset.targets)
        return judge(reset.with_(targets=targets), after, self.s.unobserved_after_s)

    def _observe(self, session: BmcSession, target: ResetTarget, after: float) -> ResetTarget:
        resource = session.read(target.resource)
        state = str(resource.get("PowerState") or "Unknown")
        seen = target.seen
        if not seen or seen[-1][0] != state:
            seen = (*seen, (state, after))[-_SEEN_MAX:]
        target = target.with_(seen=seen)
        if target.then and not target.then_sent and state == "Off":
            # The fallback's second half. On is safe to repeat: it powers on what is off.
            try:
                session.post_reset(target.target, target.then)
            except MaybeSent:
                pass
            log.info("redfish: %s seen Off; %s sent to %s", target.resource, target.then, session.where)
            target = target.with_(then_sent=True)
        return target

    def state(self, domain: str) -> RackPowerState:
        rack = self.inventory.chassis_for(domain)
        with self.session(rack) as session:
            chassis = session.read(rack.chassis)
            systems = {link: str(session.read(link).get("PowerState") or "Unknown")
                       for link in system_links(chassis)}
        return RackPowerState(domain, rack.chassis, str(chassis.get("PowerState") or "Unknown"), systems)


def judge(reset: RackReset, after: float, unobserved_after_s: float) -> RackReset:
    """The record with ``evidence`` once every target left On and is On again (or was On throughout
    past ``unobserved_after_s``), or ``error`` when a ForceOff never took its target Off by then."""
    now = [t.seen[-1][0] if t.seen else "Unknown" for t in reset.targets]
    left_on = [t.before != ON or any(s != ON for s, _ in t.seen) for t in reset.targets]
    if all(s == ON for s in now) and all(left_on):
        return reset.with_(evidence="left On, then On again" if any(t.before == ON for t in reset.targets)
                           else "On again")
    if after <= unobserved_after_s:
        return reset
    stuck = [t.resource for t in reset.targets if t.then and not t.then_sent]
    if stuck:
        return reset.with_(error=f"{reset.via} reset requested {after:.0f}s ago, and {', '.join(stuck)} "
                           "never went Off")
    if all(s == ON for s in now):
        return reset.with_(evidence="unobserved")
    return reset
