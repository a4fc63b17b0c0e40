"""What one remediation runs under: the policy it recorded when it opened, not today's configuration.

Every step reads back the profile and effective policy its remediation recorded at opening
(:mod:`remediation.services.ingest`): ladders, timeouts, admission limits, validation, hammer. A
``shadow`` profile's remediation runs as dry-run. A row opened before profiles existed runs under
today's configuration.

Why: docs/policy.md#profiles-policy-per-node-group
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from remediation.adapters.factory import AdaptersByPolicy
from remediation.db.models import Remediation
from remediation.domain.outcomes import StepSettings
from remediation.domain.step_bodies import Adapters
from remediation.settings import EffectivePolicy, Settings


@dataclass(frozen=True)
class Governed:
    settings: Settings  # the service's settings with the remediation's recorded sections in place
    steps: StepSettings  # all a step body may read, from the same
    adapters: Adapters  # its hammer and validation, or their twins in shadow
    policy: EffectivePolicy | None  # None: a row from before profiles (today's configuration)


class RecordedPolicies:
    """Reads each remediation's recorded policy back, once per distinct record."""

    def __init__(self, settings: Settings, adapters: AdaptersByPolicy) -> None:
        self.settings = settings
        self.adapters = adapters
        self._seen: dict[tuple[str, bool], Governed] = {}

    def of(self, rem: Remediation) -> Governed:
        shadow = bool(rem.dry_run)
        key = (json.dumps(rem.policy, sort_keys=True) if rem.policy else "", shadow)
        found = self._seen.get(key)
        if found is None:
            policy = EffectivePolicy.load(rem.policy, self.settings.machine) if rem.policy else None
            settings = self.settings.under(policy) if policy is not None else self.settings
            found = Governed(settings, StepSettings.of(settings), self.adapters.of(policy, shadow), policy)
            if len(self._seen) > 1024:  # policies are few; a bound in case configurations churn
                self._seen.clear()
            self._seen[key] = found
        return found
