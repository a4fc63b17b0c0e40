"""``policy.lemon``: lemon scoring (``REMEDIATION_POLICY__LEMON__*``)."""

from __future__ import annotations

from pydantic import Field, field_validator

from remediation.settings.base import Section
from remediation.vocabulary import FAULT_CLASSES


class LemonSettings(Section):
    """Lemon scoring (Meta's RSC study, 2024, names such nodes "lemons"): a node's failures,
    decayed over time, weighted by class, with distinct causes counted. A score at or over the threshold
    quarantines the node as N-in-W does. Every number here is an assumption (docs/policy.md, "Lemons")."""

    enabled: bool = Field(True, description="Quarantine on the lemon score as well as on N-in-W.")
    threshold: float = Field(
        2.5, gt=0, description="Quarantine when the score (this failure included) reaches this. With "
        "the defaults: four unit-weight failures a week apart (2.7), or three GPU memory or "
        "hardware faults within three weeks (3.3); three unit-weight failures a week apart (2.2) "
        "are not a lemon.",
    )
    half_life_s: float = Field(
        14 * 86400.0, gt=0, description="Seconds after which a failure counts half (14 days)."
    )
    min_failures: int = Field(
        3, ge=1, description="A node is never a lemon on fewer counted failures than this, whatever "
        "their weight: two failures are N-in-W's business (and after a move-host the second may be on "
        "new hardware); the score is for the node that keeps coming back.",
    )
    horizon_s: float = Field(
        90 * 86400.0, gt=0, description="Failures older than this are not read at all (90 days: "
        "under 1/80 of their weight is left with the default half-life).",
    )
    distinct_bonus: float = Field(
        0.25, ge=0, description="Each distinct class beyond the first multiplies the score by (1 + "
        "this): a node failing in several ways is likelier a lemon than one with a known recurring cause.",
    )
    weights: dict[str, float] = Field(
        default_factory=dict,
        description="Class -> weight, overriding the shipped lemon_weight of each class "
        "(remediation/data/causes.yaml; fabric 0: a shared switch is not the node's fault).",
    )

    @field_validator("weights")
    @classmethod
    def _weights(cls, value: dict[str, float]) -> dict[str, float]:
        for name, w in value.items():
            if name not in FAULT_CLASSES or w < 0:
                raise ValueError(f"{name}: weights need a known class and a weight >= 0")
        return value
