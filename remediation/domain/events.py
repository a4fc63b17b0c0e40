"""NodeEvent: the one message watchers publish and the ingest task records.

An event is a *fact observed* about one node and carries no decision. Its dedupe key names the
*condition instance*, so a resync that re-publishes a bad state is recorded once. Parsing is strict:
anything that is not a valid event raises :class:`InvalidEvent` naming the field.

Why: docs/architecture.md#an-event-is-a-fact-keyed-by-its-condition
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from remediation.vocabulary import DEFAULT_CLUSTER, checked_cluster

# Slurm node names and Kubernetes object names: letters, digits, '-', '_' and '.'; no spaces, no shell
# metacharacters. Hostlist expressions are expanded before an event is built.
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class InvalidEvent(ValueError):
    """A payload that is not a NodeEvent. The message names the offending field."""


class Source(StrEnum):
    SLURM = "slurm"
    KUBERNETES = "kubernetes"
    MANUAL = "manual"


class EventKind(StrEnum):
    UNHEALTHY = "unhealthy"  # the node entered a bad state or condition
    HEALTHY = "healthy"  # the node is back to a good state
    INVENTORY = "inventory"  # the node exists (resync); keeps the pool size true
    DOMAINS = "domains"  # the node's failure domains from one source (``domains``); never a fault
    LABELS = "labels"  # the node's Kubernetes Node labels a profile selects on (``labels``); never a fault


class Fence(BaseModel):
    """A leader's fencing token, stamped on each event it publishes: ``lock`` names the leader lock
    (``slurm``, ``kube``), ``token`` is the number the holder got when it took the lock, higher for
    every new holder. The ingest drops an event whose token is below one it has already seen for the
    same lock (:mod:`remediation.domain.fencing`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lock: str = Field(pattern=r"^[a-z][a-z0-9-]{0,31}$")
    token: int = Field(ge=1)


class NodeEvent(BaseModel):
    """An observation about one node. ``state`` is a Slurm state/flag (DOWN, DRAIN, FAIL,
    NOT_RESPONDING, IDLE...) or a Kubernetes condition written ``Type=Status`` (``Ready=False``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Source
    # The cluster the node is in; its watcher's ``cluster.name``. The ingest refuses an event whose cluster
    # is not the one whose stream it was read from (remediation.domain.admission).
    cluster: str = DEFAULT_CLUSTER
    node: str
    kind: EventKind
    state: str = Field(max_length=128)
    reason: str = Field("", max_length=2048)
    reason_user: str | None = Field(None, max_length=128)
    observed_at: datetime
    dedupe_key: str = Field("", max_length=512)
    published_at: datetime | None = None
    # When the reported condition began, if the source knows: a Kubernetes condition's episode start
    # (the watcher publishes it only after it held). Attribution compares it with our own actions.
    since: datetime | None = None
    # kind -> name of the node's failure domains as this source sees them (kind DOMAINS only), e.g.
    # {"leaf-switch": "leaf0"} or {"nvidia.com/gpu.clique": "uuid.1"}: see remediation.domain.topology.
    domains: dict[str, str] | None = None
    # kind -> the domain's smallest block size, for the kinds of ``domains`` that have one (a Slurm
    # topology/block block: BlockSizes' smallest), e.g. {"block": 16}.
    domain_sizes: dict[str, int] | None = None
    # The publishing leader's fencing token; None for what no leader publishes (`remediation report`).
    fence: Fence | None = None
    # What a profile selects on (remediation.profiles.rules). A Slurm INVENTORY event carries the node's
    # partitions and available features; a LABELS event the labels of its Kubernetes Node that some
    # profile's selector names (a key missing from it is a label the Node does not have).
    partitions: list[str] | None = Field(None, max_length=256)
    features: list[str] | None = Field(None, max_length=256)
    labels: dict[str, str] | None = None

    @field_validator("node")
    @classmethod
    def _node_name(cls, value: str) -> str:
        if not NODE_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a valid node name (letters, digits, '.', '_' and '-'; at most 253)"
            )
        return value

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: str) -> str:
        return checked_cluster(value)

    @field_validator("state")
    @classmethod
    def _state(cls, value: str) -> str:
        value = value.strip()
        if not value or any(c in value for c in "\n\r\x00"):
            raise ValueError("state must be a non-empty single line")
        return value

    @field_validator("reason", "reason_user", "dedupe_key")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        if value is not None and "\x00" in value:
            raise ValueError("must not contain NUL")
        return value

    @field_validator("domains")
    @classmethod
    def _domains(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        if len(value) > 32:
            raise ValueError("at most 32 failure domains per node")
        for kind, name in value.items():
            for text in (kind, name):
                if not text or len(text) > 253 or any(not c.isprintable() for c in text):
                    raise ValueError(f"{kind!r}={name!r}: kinds and names are 1-253 printable characters")
        return value

    @field_validator("domain_sizes")
    @classmethod
    def _sizes(cls, value: dict[str, int] | None, info: ValidationInfo) -> dict[str, int] | None:
        if value is None:
            return None
        named = info.data.get("domains") or {}
        for kind, size in value.items():
            if kind not in named or not 0 < size <= 100_000:
                raise ValueError(f"{kind!r}: a size is 1-100000 nodes, for a kind the event's domains name")
        return value

    @field_validator("partitions", "features")
    @classmethod
    def _names(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not v or len(v) > 253 or not v.isprintable() for v in value):
            raise ValueError("names are 1-253 printable characters")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and (len(value) > 64 or any(
                not k or len(k) > 316 or len(v) > 63 or not (k + v).isprintable() for k, v in value.items())):
            raise ValueError("at most 64 labels, keys of 1-316 and values of at most 63 printable characters")
        return value

    @field_validator("observed_at", "published_at", "since")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps must carry a timezone (use UTC)")
        try:
            return value.astimezone(UTC)
        except OverflowError:  # 9999-12-31T23:59:59-01:00 is a valid ISO time no UTC datetime can hold
            raise ValueError(f"{value.isoformat()} is out of range in UTC") from None

    @model_validator(mode="after")
    def _default_key(self) -> NodeEvent:
        if not self.dedupe_key:
            object.__setattr__(self, "dedupe_key", default_dedupe_key(self))
        return self

    @model_validator(mode="after")
    def _domains_only_on_domains(self) -> NodeEvent:
        if (self.domains is not None) != (self.kind is EventKind.DOMAINS):
            raise ValueError("domains is given with kind=domains, and only then")
        if (self.labels is not None) != (self.kind is EventKind.LABELS):
            raise ValueError("labels is given with kind=labels, and only then")
        if (self.partitions is not None or self.features is not None) and self.kind is not EventKind.INVENTORY:
            raise ValueError("partitions and features are given with kind=inventory only")
        return self

    @property
    def state_upper(self) -> str:
        return self.state.upper()

    def to_json(self) -> str:
        # An unfenced event of the default cluster, without sizes, is written as before those fields
        # existed, so a worker not yet upgraded reads it.
        left_out = {name for name, unset in (("fence", self.fence is None),
                                             ("cluster", self.cluster == DEFAULT_CLUSTER),
                                             ("domain_sizes", self.domain_sizes is None)) if unset}
        return self.model_dump_json(exclude=left_out or None)

    @classmethod
    def parse(cls, payload: str | bytes | dict[str, Any]) -> NodeEvent:
        """Parse a published payload, raising InvalidEvent with the field named. Whatever else goes
        wrong converting a field (an overflow, a recursion too deep) is an InvalidEvent too: a payload
        is the publisher's word, and no value in it may fail the ingest."""
        try:
            if isinstance(payload, dict):
                return cls.model_validate(payload)
            return cls.model_validate_json(payload)
        except ValidationError as exc:
            parts = []
            for err in exc.errors():
                loc = ".".join(str(p) for p in err["loc"]) or "payload"
                parts.append(f"{loc}: {err['msg']}")
            raise InvalidEvent("invalid event: " + "; ".join(parts)) from None
        except (ArithmeticError, ValueError, TypeError, RecursionError) as exc:
            raise InvalidEvent(f"invalid event: {type(exc).__name__}: {exc}") from None


def default_dedupe_key(event: NodeEvent) -> str:
    """Identity of a condition instance when the watcher did not supply one."""
    raw = "|".join(
        [event.source, event.node, event.kind, event.state_upper, event.reason, event.observed_at.isoformat()]
    )
    return f"{event.source}:{event.node}:{hashlib.sha256(raw.encode()).hexdigest()[:24]}"
