"""What each machine backend carries out for a ladder rung.

The ladder speaks of rungs (``restart``, ``move-host``, ``reimage``); a backend has the actions it
has. Each rung becomes the provider's own action, or its nearest heavier one where the provider lacks
it, so the record names what was actually asked for.
"""

from __future__ import annotations

from remediation.domain.causes import to_machine_action
from remediation.ports.cluster import VMAction

#: Clouds without a reimage or redeploy API get their nearest heavier action: a stop/start moves a GCE
#: or EC2 VM to a fresh host, which is what redeploy does on Azure.
_HEAVIER = {VMAction.REIMAGE: VMAction.STOP_START, VMAction.REDEPLOY: VMAction.STOP_START}
#: A BMC has power actions only: a restart, and a power cycle as the heaviest (see adapters/redfish).
_NATIVE = {"gce": {VMAction.RESTART, VMAction.STOP_START}, "aws": {VMAction.RESTART, VMAction.STOP_START},
           "redfish": {VMAction.RESTART, VMAction.STOP_START}}
#: A backend with one action only: Slurm's own reboot. A shipped ladder's host move or reimage is carried
#: out there as a reboot, which is what NVIDIA's catalogue asks of bare metal (RESTART_BM); a ladder the
#: site wrote with such a rung is refused at start-up (remediation.settings.backends).
_ONLY = {"slurm": VMAction.RESTART}


def provider_action(rung: str, provider: str | None) -> VMAction:
    """The action ``provider`` carries out for ladder rung ``rung`` (``move-host``: its move to fresh
    hardware)."""
    if provider in _ONLY:
        return _ONLY[provider]
    action = to_machine_action(rung, provider)
    if provider in _NATIVE and action not in _NATIVE[provider]:
        return _HEAVIER.get(action, action)
    return action
