"""`remediation rehearse --racks N`: a fleet of NVL72 racks, and what its NVLink domain faults cost
under the domain ladder against remediating each tray alone.

The racks, their domain faults and every rung's time come from the outcome model's ``racks`` section;
each tray's own ladder is the rehearsed settings' ladder for the fault's class. The figures are counted
from the faults played out, never written down.

Why: docs/rehearsal.md#nvl72-racks-and-domain-faults
"""

from __future__ import annotations

from typing import Any

from remediation.cli.context import CliError
from remediation.domain.causes import ladder
from remediation.rehearsal.racks import TrayPace, compare, domain_faults
from remediation.rehearsal.run import Pace
from remediation.rehearsal.trace import Scale
from remediation.rehearsal.truth import OutcomeModel, RackModel
from remediation.settings import Settings


def rack_fleet(model: OutcomeModel, racks: int, nodes: int) -> tuple[RackModel | None, int]:
    """The model's racks section when ``--racks`` asks for racks (None: no racks; exit 2 without one), and
    the fleet's size: at least the racks' compute trays, which are its first nodes."""
    if racks < 0:
        raise CliError("--racks must not be negative", 2)
    if racks == 0:
        return None, nodes
    if model.racks is None:
        raise CliError(f"--racks: the outcome model {model.name} has no racks section (docs/rehearsal.md)", 2)
    return model.racks, max(nodes, racks * model.racks.compute_trays)


def rack_figures(rack: RackModel | None, racks: int, settings: Settings, *, scale: Scale,
                 pace: Pace) -> dict[str, Any] | None:
    """The racks' domain faults over the rehearsal's span (``scale``: its start, days and seed), played
    out both ways (``DomainFigures.as_dict()``); None without racks."""
    if rack is None:
        return None
    faults = domain_faults(rack, racks, start=scale.start, days=scale.days, seed=scale.seed)
    gpu_reset = settings.validation.runs_jobs

    def rungs(fault_class: str) -> tuple[str, ...]:
        return ladder(fault_class, settings.policy.faults, settings.workflow, gpu_reset=gpu_reset)

    return compare(faults, rack, racks=racks, rungs=rungs,
                   pace=TrayPace(reset_s=pace.reset_s, reboot_s=pace.reboot_s, repair_s=pace.repair_s)).as_dict()


def rack_line(figures: dict[str, Any]) -> str:
    """The one line ``rehearse`` prints for a rack fleet (from ``DomainFigures.as_dict()``)."""
    def hours(side: str) -> str:
        per = figures[side]["node_hours_lost_per_fault"]
        return "-" if per is None else f"{per:.1f}"

    ratio = figures["ratio"]
    return (f"NVLink domain faults: {figures['faults']}; node-hours lost per domain fault: domain ladder "
            f"{hours('domain_ladder')}, per-tray {hours('per_tray')} (ratio {'-' if ratio is None else f'{ratio:.2f}'})")
