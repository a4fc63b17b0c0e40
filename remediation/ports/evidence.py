"""Where collected evidence too large for its database row is kept: a small store of bytes by key.

:class:`EvidenceStore` has a directory, an S3 (or S3-compatible) bucket, an in-memory and a dry-run
backend in :mod:`remediation.adapters.evidence_store`. Its calls keep the ports' contracts: a put to
the same key overwrites identically, a delete of what is gone succeeds, errors are those of
:mod:`remediation.ports.errors` and name no secret.

Why: docs/policy.md#where-it-is-kept
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@runtime_checkable
class EvidenceStore(Protocol):
    def put(self, key: str, data: bytes) -> str:
        """Keep ``data`` under ``key`` (``a/b/c``: lower case, digits, dashes, dots); return its
        location, the text its row records. A second put of the same key overwrites."""
        ...

    def get(self, location: str) -> bytes:
        """What a put returned ``location`` for; raises NotFound when it is gone."""
        ...

    def delete(self, location: str) -> None:
        """Remove what ``location`` names; one already gone is not an error."""
        ...


@dataclass(frozen=True)
class EvidenceStorage:
    """How items are kept: one up to ``inline_bytes`` in its row; a larger one in ``blobs``, or with no
    blobs (backend ``database``) in its row cut at ``inline_bytes``."""

    inline_bytes: int
    blobs: EvidenceStore | None = None
