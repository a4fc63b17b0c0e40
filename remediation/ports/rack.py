"""The rack's power: power-cycling a whole NVLink domain through its rack's BMC, and reading its power.

:class:`RackPower` has a real backend (a Redfish ``Chassis`` reset, or each system the chassis lists)
and a dry-run twin. Its calls keep the ports' contracts: a reset is recorded before it is sent and sent
once per key, nothing blocks, errors are those of :mod:`remediation.ports.errors`.

Why: docs/clouds.md#racks-the-chassis-reset
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable


class ResetVia(StrEnum):
    """Which resets a rack's power cycle sent."""

    CHASSIS = "chassis"  # the chassis's own advertised #Chassis.Reset
    SYSTEMS = "systems"  # no chassis action: each system the chassis links, by its #ComputerSystem.Reset


class RackPhase(StrEnum):
    REQUESTED = "requested"  # recorded, not (yet) sent: a worker died between the two
    SENT = "sent"  # every POST answered with success
    UNANSWERED = "unanswered"  # a POST may have reached the BMC unanswered: taken as sent, never resent


@dataclass(frozen=True)
class ResetTarget:
    """One resource reset: where it was posted, what was sent, what was seen."""

    resource: str  # /redfish/v1/Chassis/ID or /redfish/v1/Systems/ID
    action: str  # the Redfish action: #Chassis.Reset or #ComputerSystem.Reset
    target: str  # the path posted to, as the resource advertises it
    reset: str  # the ResetType sent
    before: str  # its PowerState before
    then: str | None = None  # sent once it is seen Off (the ForceOff-then-On fallback)
    sent: bool = False  # its POST succeeded (or went unanswered, and is taken as sent)
    then_sent: bool = False
    seen: tuple[tuple[str, float], ...] = ()  # each PowerState seen, with seconds after the request

    def with_(self, **changes: Any) -> ResetTarget:
        return replace(self, **changes)


@dataclass(frozen=True)
class RackReset:
    """A rack power cycle, as recorded before it is sent and as followed after. No secret in it."""

    domain: str
    bmc: str  # https://host[:port]
    chassis: str  # /redfish/v1/Chassis/ID
    credentials: str  # a name in the credentials file
    via: ResetVia
    targets: tuple[ResetTarget, ...]
    requested_at: float  # epoch seconds
    phase: RackPhase = RackPhase.REQUESTED
    evidence: str | None = None  # set when done: what showed the power cycle happened
    error: str | None = None  # set when done without the proof: what went wrong
    recorded_only: bool = False  # the dry-run twin recorded it and sent nothing
    detail: str = field(default="", compare=False)  # for people: why the phase is what it is

    @property
    def done(self) -> bool:
        return self.recorded_only or self.evidence is not None or self.error is not None

    def with_(self, **changes: Any) -> RackReset:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Its JSON shape, as stored on the step row (lists, not tuples: it reads back equal)."""
        data = asdict(self)
        data["via"], data["phase"] = str(self.via), str(self.phase)
        data["targets"] = [{**asdict(t), "seen": [list(s) for s in t.seen]} for t in self.targets]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RackReset:
        targets = tuple(
            ResetTarget(**{**t, "seen": tuple((str(s), float(a)) for s, a in t.get("seen") or ())})
            for t in data["targets"]
        )
        return cls(**{**data, "via": ResetVia(data["via"]), "phase": RackPhase(data["phase"]),
                      "targets": targets})


@dataclass(frozen=True)
class RackPowerState:
    """The rack's power as its BMC reports it now: the chassis's, and each system's it links."""

    domain: str
    chassis: str
    power: str  # the chassis's PowerState ("Unknown" where it reports none)
    systems: dict[str, str] = field(default_factory=dict)  # system path -> PowerState


@runtime_checkable
class RackPower(Protocol):
    """Power-cycles the rack of an NVLink domain (a Slurm block name or a clique id)."""

    def knows(self, domain: str) -> bool:
        """Whether the inventory names a chassis for ``domain`` (read locally; no BMC is asked)."""
        ...

    def reset(self, domain: str, key: str) -> RackReset:
        """Record, then start, one power cycle of the domain's rack. Calling again with the same key
        sends nothing and returns what was recorded. NotFound for a domain with no chassis known."""
        ...

    def poll(self, reset: RackReset) -> RackReset:
        """Read the power once and return the record moved on: the states seen, the On of a
        ForceOff-then-On sent once Off is seen, and ``evidence`` or ``error`` once it is ``done``."""
        ...

    def state(self, domain: str) -> RackPowerState:
        """The domain's rack power now (a read)."""
        ...
